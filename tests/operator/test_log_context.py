"""The operator's side of JSON logs: what a reconcile logs names its stream, the Pods it makes log in its
format, and the driver knows its attempt."""
from __future__ import annotations

import asyncio
import logging

import pytest

from eos_job import log_format
from eos_job.snapshot_resource import SnapshotAccess
from eos_job.spec import ExactlyOnceStreamSpec
from eos_operator import children
from eos_operator.cli import _parser
from eos_operator.reconciler import Deps, reconcile
from eos_operator.snapshots import SnapshotRef, snapshot_pod
from eos_operator.validation import validate_spec

from .fakes import FakeClock, FakeKube, FakeResolver, base_spec

REF = children.StreamRef("colors", "team-a", "0f6c2a1e-1111-2222-3333-444455556666")


@pytest.fixture
def chosen():
    saved = dict(log_format._chosen)
    yield log_format._chosen
    log_format._chosen.update(saved)


@pytest.fixture(autouse=True)
def no_base_context():
    """A process-wide context another test left (eos_job.cli.main run in this process sets one) is cleared."""
    saved = dict(log_format._base)
    log_format._base.clear()
    yield
    log_format._base.clear()
    log_format._base.update(saved)


def env_of(pod: dict) -> dict:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def test_the_pods_log_in_the_operators_format_and_the_driver_knows_its_attempt(chosen):
    spec = validate_spec(base_spec())
    assert isinstance(spec, ExactlyOnceStreamSpec)
    chosen["format"] = "text"
    env = env_of(children.driver_pod(REF, spec, attempt=4, tx_generation=0))
    assert env["EOS_ATTEMPT"] == "4" and "EOS_LOG_FORMAT" not in env
    chosen["format"] = "json"
    access = SnapshotAccess(image="eos:1", store="local", mount_path="/tmp/eos-test")
    for pod in (children.driver_pod(REF, spec, attempt=4, tx_generation=0),
                children.aux_pod(REF, spec, component="preflight", attempt=4, tx_generation=0, args=["preflight"]),
                snapshot_pod(SnapshotRef("s1", "team-a", "u1"), "colors", access, name="s1-snap-1", action="take",
                             command=["python", "-m", "eos_job", "snapshot", "inspect", "--path", "/x"])):
        assert env_of(pod)["EOS_LOG_FORMAT"] == "json", pod["metadata"]["name"]


def test_the_operator_takes_its_format_from_the_flag():
    assert _parser().parse_args(["run", "--log-format", "json"]).log_format == "json"
    with pytest.raises(SystemExit):
        _parser().parse_args(["run", "--log-format", "logfmt"])


def test_what_a_reconcile_logs_names_its_stream_and_namespace():
    kube, clock = FakeKube(), FakeClock()
    kube.add_stream("colors", base_spec(sink={"bootstrapServers": "localhost:9092", "topic": "in"}))  # invalid
    seen: list[dict] = []

    class Capture(logging.Handler):
        def emit(self, rec):
            seen.append({**log_format.context_of(rec), "logger": rec.name})

    handler, root = Capture(level=logging.DEBUG), logging.getLogger("eos_operator")
    saved = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        asyncio.run(reconcile("default", "colors", Deps(kube=kube, resolver=FakeResolver(kube=kube), clock=clock)))
        root.info("outside any reconcile")
    finally:
        root.removeHandler(handler)
        root.setLevel(saved)
    inside, outside = seen[:-1], seen[-1]
    assert inside, "the reconcile logged nothing"
    assert all((r.get("stream"), r.get("namespace")) == ("colors", "default") for r in inside), inside
    assert "stream" not in outside


def test_a_worker_thread_of_the_operator_logs_with_its_callers_stream():
    """Resolution, progress and store reads run in pools.Pools threads; the caller's context goes along."""
    from eos_operator.pools import Pools

    async def call() -> dict:
        with log_format.log_context(stream="colors", namespace="team-a"):
            probe = logging.LogRecord("eos_job.resolution", logging.INFO, __file__, 1, "resolved", (), None)
            return await pools.run("resolve", "kafka:9092", lambda: log_format.context_of(probe), timeout=10)

    pools = Pools()
    try:
        assert asyncio.run(call()) == {"stream": "colors", "namespace": "team-a"}
    finally:
        pools.close()
