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

# The Spark drivers the tests start on this machine (their local driver runs, no Kubernetes, which inherit this
# environment) compile with C1 only: spark-submit adds SPARK_SUBMIT_OPTS to the driver's JVM. A test's driver
# lives for seconds to minutes and runs small batches, where C2's compiling is most of the CPU: measured on this
# machine (benchmarks/driver_jit.py), a driver's start took 16.8 CPU-s instead of 25.2 and a 100-record batch 0.58
# instead of 1.15 (medians), and `make test` is bound by its two cores. The JIT compiler changes no result:
# the real-node drivers get it as JAVA_TOOL_OPTIONS through their stream's template (real_nodes.stream_template:
# the unique-id stream on the nodes took 110 s instead of 139), the OOM test runs the image's JVM as a user's Pod
# does, and the benchmarks (not run by pytest) keep the default. `SPARK_SUBMIT_OPTS=` (empty) in the environment
# runs the tests with the default.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1")


# Tiers, each with its own per-test timeout (seconds): a hung unit test is caught in a minute, not after the
# 15 minutes an end-to-end test may need. A test's own ``@pytest.mark.timeout`` wins.
TIERS = (("unit", 60), ("unit-stack", 180), ("stack", 300), ("chart", 600), ("e2e", 900), ("chaos", 2700))
# The lifecycle model's explorations (tests/model, in the unit tier) take 20-55 s each on two busy cores, and
# `make test` makes the stack and the image beside the unit tier: they get four minutes.
MODEL_TIMEOUT = 240
# The order a run takes them: the unit tier (run on its own first by ``make test``), then the chaos tier, the
# longest tests, then the cheap ones first, so a broken build fails in a minute. The real-stack tiers run two at
# a time (pytest-xdist, ``--dist worksteal``: a worker that runs dry takes half of the other's queue); the two
# chaos tests (7-10 min each) first means neither starts at the end and makes a long tail.
ORDER = ("unit", "chaos", "unit-stack", "stack", "chart", "e2e")
# Within the e2e tier the longest files go first (whole files: their module fixtures stay together), so the ends of
# both workers' queues hold short tests and neither worker idles while the other finishes a long one. Ordered by
# their seconds in the clean-clone run of 2026-11-28 (docs/measurements.md). Every other e2e file (not the chaos
# tier's test_chaos*.py) is named in E2E_SHORT and runs after these in collection order: a new or renamed file
# that is in neither fails tests/operator/test_test_order.py, so none drops out of the order unnoticed.
# The node-loss test holds the real nodes alone (``stops_a_node``): it goes first, while the other worker has
# plenty that does not use them; at the end, two real-node tests waiting for it made a tail (the clean-clone run
# of 2026-11-29, fourteenth session: the rollback ran last). The rollback (about 220 s) goes early for the same
# reason.
E2E_LONG_FIRST = ("test_real_node_loss.py", "test_batch_identity_e2e.py", "test_rollback_partial_e2e.py",
                  "test_upgrade_safety_e2e.py", "test_s3_checkpoint.py",
                  "test_cluster_mode_e2e.py", "test_kafka_security_e2e.py", "test_real_node_stream.py",
                  "test_job_runtime.py",
                  "test_snapshot_job.py",
                  "test_operator_e2e.py", "test_operator_upgrade_e2e.py", "test_upgrade_e2e.py",
                  "test_jvm_writer_e2e.py", "test_real_node_oom.py", "test_start_failures_e2e.py",
                  "test_nondeterminism_e2e.py", "test_operator_gitops.py", "test_stream_epoch_e2e.py",
                  "test_replay_horizon_e2e.py")
E2E_SHORT = frozenset({"test_driver_epoch_e2e.py", "test_driver_metrics_e2e.py", "test_generations_e2e.py",
                       "test_json_logs_e2e.py", "test_ledger_guards.py", "test_snapshot_resource_e2e.py",
                       "test_source_slots_e2e.py"})

# Tests that stop or kill a part every test shares, or start one that would disturb the others, are marked
# ``serial``: ``make test`` runs them on their own after the others. A test that stops or kills a broker or an
# S3 server has its own instead (the ``private_kafka`` and ``private_s3`` fixtures below), so the chaos tests,
# the S3-checkpoint and cluster-mode e2e and the S3 stop/start test run two at a time with the rest.
# Every test's Pods run on the real nodes, shared by both workers. None is serial today (the values would say
# why); the node-loss test, which stops a real node's kubelet, is marked stops_a_node instead (the node lock
# below).
SERIAL_FILES: dict[str, str] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """The real nodes' lock (tests/harness/node_lock.py): shared by the tests that use them, taken alone by one
    marked ``stops_a_node``, from the first such test of a file to its last."""
    lock = _node_lock()
    lock.enter(item)
    try:
        yield
    finally:
        lock.leave(item, nextitem)


_NODE_LOCK = []


def _node_lock():
    if not _NODE_LOCK:
        from tests.harness.node_lock import NodeLock
        state = Path(os.environ.get("EOS_STATE") or REPO / ".stack")
        _NODE_LOCK.append(NodeLock(state / "locks" / "real-nodes.lock"))
    return _NODE_LOCK[0]


def tier_of(item) -> str:
    parts = Path(str(item.fspath)).relative_to(REPO / "tests").parts
    folder = parts[0] if len(parts) > 1 else ""
    uses_stack = "stack_env" in getattr(item, "fixturenames", ())
    if folder in ("jobs", "operator", "model", "docs"):
        return "unit-stack" if uses_stack else "unit"
    if folder == "e2e" and parts[-1].startswith("test_chaos"):
        return "chaos"
    return folder if folder in ("stack", "chart", "e2e") else "e2e"


def pytest_collection_modifyitems(config, items):
    timeouts = dict(TIERS)
    for item in items:
        # A test that uses the stack fixture is a stack test, whatever its marks say.
        if "stack_env" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.stack)
        if tier_of(item) == "unit":
            item.add_marker(pytest.mark.unit)
        if item.get_closest_marker("timeout") is None:
            in_model = Path(str(item.fspath)).relative_to(REPO / "tests").parts[0] == "model"
            item.add_marker(pytest.mark.timeout(MODEL_TIMEOUT if in_model else timeouts[tier_of(item)]))
        rel = Path(str(item.fspath)).relative_to(REPO / "tests").as_posix()
        if rel in SERIAL_FILES:
            item.add_marker(pytest.mark.serial)
    items.sort(key=run_order)   # stable: within a rank the collection order (file, then definition) is kept


def run_order(item) -> tuple[int, int]:
    """Where ``item`` runs: its tier's place in ORDER, then, in the e2e tier, its file's in E2E_LONG_FIRST (the
    other files after those)."""
    tier = tier_of(item)
    name = Path(str(item.fspath)).name
    long_rank = E2E_LONG_FIRST.index(name) if tier == "e2e" and name in E2E_LONG_FIRST else len(E2E_LONG_FIRST)
    return ORDER.index(tier), long_rank if tier == "e2e" else 0


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


@pytest.fixture(scope="module")
def nodes(stack_env):
    """The real nodes (eos_stack.node), started unless they run, with the project's image in each; left running
    (every test's Pods run there), so test workers never stop them under each other. Fails, never skips, when
    they cannot start or the image is missing (`make image`)."""
    from eos_stack import node
    from eos_stack.common import Stack, StackError
    from eos_stack.image_common import image_name, image_under_test
    from eos_stack.node_config import layouts
    from tests.harness.real_nodes import node_image

    st = Stack()
    try:
        env = node.up(st)
    except StackError as exc:
        pytest.fail(f"the node part could not start: {exc}", pytrace=False)
    st.update_env(env)
    if image_under_test() != image_name():
        # EOS_TEST_IMAGE: another build than the one `up node` pulled, pulled into each node the same way.
        from eos_stack import node_images, registry
        ref = registry.ensure_image(st, image_under_test())
        if ref is None:
            pytest.fail(f"EOS_TEST_IMAGE={image_under_test()} is not built (`make image EOS_IMAGE_TAG=...`)",
                        pytrace=False)
        for n in layouts(st.state, node.count()):
            node_images.load_images(st, n, node_images.ensure_pause(st), ref)
    for n in layouts(st.state, node.count()):
        if node_image() not in node.ctr(n, "images", "ls", "-q").split():
            pytest.fail(f"{node_image()} is not in {n.name}'s containerd: build it with `make image`; if it was "
                        f"pulled above, something deleted it (the kubelet's image GC or disk-pressure eviction: "
                        f"{st.state / 'logs' / (n.name + '-kubelet.log')})", pytrace=False)
    return layouts(st.state, node.count())


@pytest.fixture
def private_kafka(stack_env, request):
    """A Kafka broker of this test alone (tests/harness/private.py), for a test that kills, stops or restarts
    it: ``.stack`` for ``kafka.hard_kill``/``down``/``up``, ``.bootstrap``, ``.env``. Gone after the test."""
    from tests.harness.private import private_kafka as make

    with make(request.node.name) as broker:
        yield broker


@pytest.fixture
def private_s3(stack_env, request):
    """A MinIO server of this test alone (tests/harness/private.py), for a test that stops or kills it:
    ``.stack`` for ``s3.stop_server``/``start_server``, ``.env`` (S3_ENDPOINT, keys, S3_BUCKET, S3_REGION)."""
    from tests.harness.private import private_s3 as make

    with make(request.node.name) as server:
        yield server


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
