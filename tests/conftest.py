"""Test session wiring.

Tests marked ``stack`` need the real local stack. The ``stack_env`` fixture
starts it (idempotently: a running stack is reused) and *fails* the test when it
cannot start; it never skips.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
for extra in (REPO / "stack", REPO):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))


# Tiers, in the order a run takes them: the cheap ones first, so a broken build fails in seconds, and the
# chaos test (the longest) last. Each tier has its own per-test timeout (seconds): a hung unit test is
# caught in a minute, not after the 15 minutes an end-to-end test may need. A test's own
# ``@pytest.mark.timeout`` wins.
TIERS = (("unit", 60), ("unit-stack", 180), ("stack", 300), ("chart", 600), ("e2e", 900), ("chaos", 2700))

# Tests that stop or kill a part every test shares (the Kafka broker, the S3 server): marked ``serial``, run by
# ``make test`` on their own after the others, which run two at a time (pytest-xdist). The chaos tier is serial.
SERIAL_FILES = {
    "stack/test_s3.py": "stops and restarts the S3 server",
    "e2e/test_s3_checkpoint.py": "kills the S3 server",
    "e2e/test_cluster_mode_e2e.py": "stops the S3 server for 15 s",
    "stack/test_node.py": "starts real nodes and kube-scheduler, which take the Pods the process kubelet waits for",
}


def tier_of(item) -> str:
    parts = Path(str(item.fspath)).relative_to(REPO / "tests").parts
    folder = parts[0] if len(parts) > 1 else ""
    uses_stack = "stack_env" in getattr(item, "fixturenames", ())
    if folder in ("jobs", "operator", "model"):
        return "unit-stack" if uses_stack else "unit"
    if folder == "e2e" and parts[-1].startswith("test_chaos"):
        return "chaos"
    return folder if folder in ("stack", "chart", "e2e") else "e2e"


def pytest_collection_modifyitems(config, items):
    order = {name: rank for rank, (name, _) in enumerate(TIERS)}
    timeouts = dict(TIERS)
    for item in items:
        # A test that uses the stack fixture is a stack test, whatever its marks say.
        if "stack_env" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.stack)
        if tier_of(item) == "unit":
            item.add_marker(pytest.mark.unit)
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(timeouts[tier_of(item)]))
        rel = Path(str(item.fspath)).relative_to(REPO / "tests").as_posix()
        if tier_of(item) == "chaos" or rel in SERIAL_FILES:
            item.add_marker(pytest.mark.serial)
    # Stable: within a tier the collection order (file, then definition) is kept.
    items.sort(key=lambda it: order[tier_of(it)])


@pytest.fixture(scope="session")
def stack_env() -> dict[str, str]:
    from eos_stack.__main__ import main as stack_main
    from eos_stack.common import Stack

    rc = stack_main(["up"])
    if rc != 0:
        pytest.fail(f"the local stack could not start (exit {rc}); see the messages above and .stack/logs/",
                    pytrace=False)
    env = Stack().read_env()
    for key in ("KAFKA_BOOTSTRAP", "KUBECONFIG", "SPARK_JARS"):
        if not env.get(key):
            pytest.fail(f"the local stack started but .stack/env has no {key}", pytrace=False)
    os.environ.update(env)
    return env


_RESULT_LINES: list[str] = []


@pytest.fixture
def report_result(request):
    """Tests that measure something (kills survived, gaps) report it here; printed after the run. Carried in
    the test's report (``user_properties``), so lines of pytest-xdist workers reach the summary too."""
    return lambda line: request.node.user_properties.append(("result", line))


def pytest_runtest_logreport(report):
    if report.when == "call":
        _RESULT_LINES.extend(v for k, v in report.user_properties if k == "result")


def pytest_terminal_summary(terminalreporter):
    if _RESULT_LINES:
        terminalreporter.section("results")
        for line in _RESULT_LINES:
            terminalreporter.write_line(line)
