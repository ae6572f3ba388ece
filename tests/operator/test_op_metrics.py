"""The operator's own metrics (op_metrics): reconcile time by outcome, reconciles in flight, failed Kubernetes
API calls and failed Kafka calls, counted where the real code makes them, over fakes. No server."""
from __future__ import annotations

import asyncio
import logging
import urllib.request

import kopf
import pytest
from confluent_kafka import KafkaError, KafkaException
from kubernetes.client.exceptions import ApiException

import eos_job.resolution as resolution
from eos_job.ledger import SinkUnavailable
from eos_stack.common import free_port
from eos_operator import handlers
from eos_operator.adapters import JobResolver, KubeError, KubernetesApi, StoreUnreadable, kafka_failure
from eos_operator.progress import LedgerProgress, _ThrottledRead
from eos_operator.handlers import OperatorConfig, build_registry, default_deps
from eos_operator.kube_api import Conflict, verb_and_resource
from eos_operator.loop import serialized
from eos_operator.op_metrics import KAFKA_OPERATIONS, OperatorMetrics
from eos_operator.reconciler import Deps

from .fakes import FakeClock, FakeKube, FakeResolver, base_spec
from .test_throttled_read import config

LOG = logging.getLogger("test")


def value(m: OperatorMetrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def reconciles(m: OperatorMetrics, kind: str, outcome: str) -> float:
    return value(m, "eos_operator_reconcile_duration_seconds_count", kind=kind, outcome=outcome) or 0


def in_flight(m: OperatorMetrics, kind: str = "stream") -> tuple[float | None, float | None]:
    return (value(m, "eos_operator_reconciles_in_flight", kind=kind, state="running"),
            value(m, "eos_operator_reconciles_in_flight", kind=kind, state="waiting"))


# ------------------------------------------------------------ reconciles, through the kopf handlers
def handler(registry: kopf.OperatorRegistry, id_: str):
    return next(h.fn for reg in (registry._changing, registry._spawning) for h in reg.get_all_handlers()
                if h.id == id_)


def operator_over_fakes():
    kube = FakeKube()
    obj = kube.add_stream("colors", base_spec())
    m = OperatorMetrics()
    memo = kopf.Memo(deps=Deps(kube=kube, resolver=FakeResolver(kube=kube), clock=FakeClock(),
                               operator_metrics=m), locks={},
                     phased={obj["metadata"]["uid"]})   # the timer's one-off random offset: taken already
    call = dict(namespace="default", name="colors", uid=obj["metadata"]["uid"], memo=memo, logger=LOG)
    return kube, m, build_registry(OperatorConfig(), deps_factory=lambda _: memo.deps), call


def test_a_reconcile_that_raises_is_an_error_and_is_timed():
    kube, m, registry, call = operator_over_fakes()
    kube.fail_create_pod = 1                                    # HTTP 500 on the driver's create: it raises
    with pytest.raises(kopf.TemporaryError):
        asyncio.run(handler(registry, "reconcile-on-create")(**call))
    assert reconciles(m, "stream", "error") == 1
    assert value(m, "eos_operator_reconcile_duration_seconds_sum", kind="stream", outcome="error") > 0
    assert reconciles(m, "stream", "ok") == 0
    assert in_flight(m) == (0, 0)

    asyncio.run(handler(registry, "reconcile-periodically")(**call))   # the timer retries: it launches
    assert kube.created_pods == ["colors-driver-0"]
    assert reconciles(m, "stream", "ok") == 1 and reconciles(m, "stream", "error") == 1


def test_a_deletion_still_waiting_for_its_driver_is_a_requeue():
    kube, m, registry, call = operator_over_fakes()
    asyncio.run(handler(registry, "reconcile-on-create")(**call))
    kube.set_pod_phase("colors-driver-0", "Running")
    kube.mark_stream_deleted("colors")
    with pytest.raises(kopf.TemporaryError):
        asyncio.run(handler(registry, "stop")(**call))
    assert reconciles(m, "stream", "requeue") == 1
    kube.finish_deletions()
    asyncio.run(handler(registry, "stop")(**call))
    assert (reconciles(m, "stream", "ok"), reconciles(m, "stream", "requeue")) == (2, 1)


def test_a_snapshot_reconcile_is_its_own_kind():
    kube, m, registry, call = operator_over_fakes()
    snap = kube.add_snapshot({"apiVersion": "streaming.eos.dev/v1beta1", "kind": "ExactlyOnceSnapshot",
                              "metadata": {"name": "s1"}, "spec": {"stream": "colors"}})
    asyncio.run(handler(registry, "snapshot-on-create")(**{**call, "name": "s1", "uid": snap["metadata"]["uid"]}))
    assert reconciles(m, "snapshot", "ok") == 1 and reconciles(m, "stream", "ok") == 0


def test_reconciles_of_one_object_wait_for_each_other_and_are_counted_so():
    m = OperatorMetrics()
    lock, release, seen = asyncio.Lock(), None, []

    async def first():
        await release.wait()
        return None

    async def scenario():
        nonlocal release
        release = asyncio.Event()
        a = asyncio.create_task(serialized(lock, "stream", first, m))
        b = asyncio.create_task(serialized(lock, "stream", first, m))
        for _ in range(5):
            await asyncio.sleep(0)
        seen.append(in_flight(m))
        release.set()
        await asyncio.gather(a, b)
        seen.append(in_flight(m))

    asyncio.run(scenario())
    assert seen == [(1, 1), (0, 0)]
    assert reconciles(m, "stream", "ok") == 2


def test_the_series_a_dashboard_needs_exist_before_anything_happened():
    m = OperatorMetrics()
    assert in_flight(m, "snapshot") == (0, 0)
    assert {op: value(m, "eos_operator_kafka_errors_total", operation=op) for op in KAFKA_OPERATIONS} == {
        "resolve": 0, "ledger-read": 0, "replay-horizon": 0}


# ------------------------------------------------------------ Kubernetes API calls, no server
class _Response:
    def __init__(self, status: int, body: bytes = b"{}"):
        self.status, self.data = status, body

    def read(self) -> None:
        pass


class _Server:
    """Answers every request with ``answer`` (a status, or an exception to raise)."""

    def __init__(self, answer):
        self.answer = answer

    def param_serialize(self, method, resource_path, query_params, header_params, body, auth_settings):
        return method, resource_path, header_params, body, []

    def call_api(self, method, url, header_params, body, post_params, _request_timeout):
        if isinstance(self.answer, BaseException):
            raise self.answer
        return _Response(self.answer, b'{"message": "m"}')


def api(answer) -> tuple[KubernetesApi, OperatorMetrics]:
    m = OperatorMetrics()
    return KubernetesApi(_Server(answer), threads=1, metrics=m), m


def api_errors(m: OperatorMetrics, verb: str, resource: str, code: str) -> float | None:
    return value(m, "eos_operator_kube_api_errors_total", verb=verb, resource=resource, code=code)


def test_an_api_exception_is_counted_with_its_code():
    kube, m = api(ApiException(status=503, reason="Service Unavailable"))
    with pytest.raises(KubeError) as err:
        asyncio.run(kube.list_pods("ns", {"a": "b"}))
    assert err.value.status == 503
    assert api_errors(m, "list", "pods", "503") == 1


def test_no_answer_is_a_network_error():
    kube, m = api(ConnectionRefusedError("refused"))
    with pytest.raises(ConnectionRefusedError):
        asyncio.run(kube.get_stream("ns", "colors"))
    kube2, m2 = api(ApiException(status=0, reason="no response"))
    with pytest.raises(KubeError):
        asyncio.run(kube2.get_snapshot("ns", "s1"))
    assert api_errors(m, "get", "exactlyoncestreams", "network") == 1
    assert api_errors(m2, "get", "exactlyoncesnapshots", "network") == 1


def test_an_error_status_is_counted_also_when_the_adapter_absorbs_it():
    kube, m = api(409)
    with pytest.raises(Conflict):
        asyncio.run(kube.patch_stream_status("ns", "colors", {}, "7"))
    assert api_errors(m, "patch", "exactlyoncestreams/status", "409") == 1
    kube, m = api(404)
    assert asyncio.run(kube.get_stream("ns", "colors")) is None          # gone: an answer, still counted
    asyncio.run(kube.post_event(type("Ref", (), {"name": "c", "namespace": "ns", "uid": "u"})(), "Normal",
                                "R", "m"))
    assert api_errors(m, "get", "exactlyoncestreams", "404") == 1
    assert api_errors(m, "create", "events", "404") == 1


def test_no_metrics_no_counting():
    kube = KubernetesApi(_Server(500), threads=1)
    with pytest.raises(KubeError):
        asyncio.run(kube.list_streams("ns"))


@pytest.mark.parametrize("method,path,expected", [
    ("GET", "/api/v1/namespaces/ns/pods", ("list", "pods")),
    ("GET", "/api/v1/namespaces/ns/secrets/s%2Fx", ("get", "secrets")),
    ("PATCH", "/apis/streaming.eos.dev/v1beta1/namespaces/ns/exactlyoncestreams/c/status",
     ("patch", "exactlyoncestreams/status")),
    ("PUT", "/api/v1/namespaces/ns/services/c-driver", ("update", "services")),
    ("DELETE", "/api/v1/namespaces/ns/configmaps/c-run", ("delete", "configmaps")),
    ("POST", "/api/v1/namespaces/ns/events", ("create", "events")),
    ("GET", "/api/v1/nodes/some-node", ("get", "nodes")),                # never a name as a label
])
def test_verb_and_resource_are_labels_without_names(method, path, expected):
    assert verb_and_resource(method, path) == expected


# ------------------------------------------------------------ Kafka calls of the operator
def kafka_errors(m: OperatorMetrics, operation: str) -> float | None:
    return value(m, "eos_operator_kafka_errors_total", operation=operation)


def broker_down() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))


def test_a_failed_resolution_is_counted_when_kafka_failed(monkeypatch):
    m = OperatorMetrics()
    resolver = JobResolver(timeout_s=5, metrics=m)
    for exc, counted in ((broker_down(), 1), (SinkUnavailable("could not fence"), 2),
                         (StoreUnreadable("checkpoint store not readable"), 2)):
        def fail(*_, exc=exc, **__):
            raise exc
        monkeypatch.setattr(resolution, "resolve", fail)
        with pytest.raises(type(exc)):
            asyncio.run(resolver.resolve(config("a")))
        assert kafka_errors(m, "resolve") == counted


def test_failed_ledger_and_horizon_reads_are_counted(monkeypatch):
    # The batched tip read answers this stream's ledger with the broker's error; the horizon, which starts from
    # the tip, fails with it. Each is counted once under its own operation.
    from eos_job import tips

    monkeypatch.setattr(tips, "read_tips", lambda conf, topics, known, **_: {t: broker_down() for t in topics})
    m = OperatorMetrics()
    progress = LedgerProgress(min_interval=0, horizon_interval=0, timeout_s=1, metrics=m)

    async def both():
        answers = (await progress.ledger_tip(config("a")), await progress.replay_horizon(config("a")))
        while progress._tip._reading or progress._horizon._reading:   # the reads past the first wait end
            await asyncio.sleep(0.05)
        return answers
    assert asyncio.run(both()) == (None, None)
    assert (kafka_errors(m, "ledger-read"), kafka_errors(m, "replay-horizon"), kafka_errors(m, "resolve")) == (1, 1, 0)


def test_a_throttled_read_that_times_out_or_raises_is_counted():
    import time
    m = OperatorMetrics()
    progress = LedgerProgress(metrics=m)

    def stuck():
        time.sleep(0.3)

    def broken():
        raise broker_down()

    def bug():
        raise TypeError("not Kafka")

    for read in (stuck, broken, bug):   # each a stream's first read, which the reconcile awaits
        slow = _ThrottledRead("thing", interval=0, timeout=0.05, failed=progress._tip_failed)
        assert asyncio.run(slow(config("a"), lambda: asyncio.to_thread(read))) is None
    assert kafka_errors(m, "ledger-read") == 2


def test_kafka_failure_looks_at_the_cause():
    try:
        try:
            raise broker_down()
        except KafkaException as exc:
            raise RuntimeError("resolution failed") from exc
    except RuntimeError as wrapped:
        assert kafka_failure(wrapped)
    assert kafka_failure(TimeoutError()) and not kafka_failure(ValueError("bad spec"))


# ------------------------------------------------------------ wiring: one registry, one endpoint
def test_default_deps_share_one_registry_and_serve_both(monkeypatch):
    monkeypatch.setattr(handlers.KubernetesApi, "from_kubeconfig",
                        classmethod(lambda cls, kubeconfig=None, context=None, *, metrics=None, **kw:
                                    cls(None, threads=1, metrics=metrics, **kw)))
    monkeypatch.setattr(handlers.WatchedKube, "start", lambda self: self)   # no server: no watches
    port = free_port()
    deps = default_deps(OperatorConfig(metrics_port=port, metrics_address="127.0.0.1"))
    assert isinstance(deps.kube, handlers.WatchedKube)
    op = deps.operator_metrics
    assert op is not None and op.registry is deps.metrics.registry
    assert deps.kube.metrics is op and deps.resolver._failed.metrics is op
    assert deps.progress._tip_failed.metrics is op and deps.progress._horizon_failed.metrics is op
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for family in ("eos_operator_reconcile_duration_seconds", "eos_operator_reconciles_in_flight",
                   "eos_operator_kube_api_errors_total", "eos_operator_kube_requests_total", "eos_operator_kafka_errors_total"):
        assert f"# HELP {family}" in body
    assert 'eos_operator_kafka_errors_total{operation="resolve"} 0.0' in body

    off = default_deps(OperatorConfig(informers=False))
    assert off.operator_metrics is None and off.kube.metrics is None
    assert not isinstance(off.kube, handlers.WatchedKube)
