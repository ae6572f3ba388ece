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


def pytest_collection_modifyitems(config, items):
    # A test that uses the stack fixture is a stack test, whatever its marks say.
    for item in items:
        if "stack_env" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.stack)


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


@pytest.fixture(scope="session")
def report_result():
    """Tests that measure something (kills survived, gaps) report it here; printed after the run."""
    return _RESULT_LINES.append


def pytest_terminal_summary(terminalreporter):
    if _RESULT_LINES:
        terminalreporter.section("results")
        for line in _RESULT_LINES:
            terminalreporter.write_line(line)
