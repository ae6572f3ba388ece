"""Resolution's fencing (eos_job.fencing) over a fake producer: every id fenced, a bounded pool really fencing
concurrently, every failure named with its transactional id, one deadline for all fences, and every producer
closed whatever happens; then the short, growing pauses while abort markers trail the fences. No broker:
tests/stack/test_fencing.py fences against the real one."""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Callable

import pytest
from confluent_kafka import KafkaError, KafkaException

import eos_job.resolution as resolution
from eos_job import fencing
from eos_job.fencing import FenceFailed, FenceFailure, fence_all
from eos_job.kafka_security import denial
from eos_job.ledger import SinkUnavailable
from eos_job.spec import ExactlyOnceStreamSpec, RunConfig, StreamIdentity
from eos_job.status import CheckpointFacts

WAIT = 10.0   # how long a fake waits for something that should happen at once (never reached when it works)


@dataclass
class FakeProducer:
    """Records what the fencing does with one producer: its config, its init timeout(s), its close."""
    conf: dict
    init: Callable[[str, float], None]
    timeouts: list[float] = field(default_factory=list)
    closed: threading.Event = field(default_factory=threading.Event)
    closes: int = 0

    @property
    def txid(self) -> str:
        return self.conf["transactional.id"]

    def init_transactions(self, timeout: float) -> None:
        assert not self.closed.is_set(), "init_transactions on a closed producer"
        self.timeouts.append(timeout)
        self.init(self.txid, timeout)

    def flush(self, timeout: float | None = None) -> int:
        return 0

    def close(self) -> bool:
        self.closes += 1
        self.closed.set()
        return True


class Producers:
    """The ``producer_factory``: makes a FakeProducer whose init_transactions runs ``init(txid, timeout)``."""

    def __init__(self, init: Callable[[str, float], None] = lambda txid, timeout: None):
        self.init = init
        self.made: list[FakeProducer] = []
        self._lock = threading.Lock()

    def __call__(self, conf: dict) -> FakeProducer:
        p = FakeProducer(dict(conf), self.init)
        with self._lock:
            self.made.append(p)
        return p

    def txids(self) -> list[str]:
        return sorted(p.txid for p in self.made)

    def all_closed_once(self) -> bool:
        return all(p.closes == 1 for p in self.made)


class InFlight:
    """An init_transactions that returns only once ``n`` fences are in flight at the same time (or fails after
    ``wait`` seconds, and every later call at once): a pool that fences one after another cannot pass it."""

    def __init__(self, n: int, wait: float = WAIT):
        self.n, self.now, self.most, self.wait = n, 0, 0, wait
        self.cond = threading.Condition()
        self.broken = False

    def __call__(self, txid: str, timeout: float) -> None:
        with self.cond:
            self.now += 1
            self.most = max(self.most, self.now)
            self.cond.notify_all()
            try:
                if not self.cond.wait_for(lambda: self.most >= self.n or self.broken, timeout=self.wait) or self.broken:
                    self.broken = True
                    raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"only {self.most} fences in flight"))
            finally:
                self.now -= 1


def kafka_error(code: int, text: str) -> KafkaException:
    return KafkaException(KafkaError(code, text))


def ids(n: int, prefix: str = "eos-default-colors-0123abcd") -> list[str]:
    # Two generations, sorted by generation then slot: the order resolution asks in.
    return [f"{prefix}-{g}-{s}" for g in (0, 1) for s in range(n // 2)]


def fence_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("eos-fence")]


def test_every_id_is_fenced_once_with_a_transactional_producer_that_is_closed():
    txids, made = ids(100), Producers()
    assert fence_all("k:9092", txids, 30.0, {"security.protocol": "SSL"}, pool_size=8, producer_factory=made) == 100
    assert made.txids() == sorted(txids)                       # each id once, none else
    assert all(p.timeouts and 0 < p.timeouts[0] <= 30.0 for p in made.made)
    assert made.all_closed_once()
    conf = made.made[0].conf
    assert (conf["bootstrap.servers"], conf["security.protocol"], conf["enable.idempotence"], conf["acks"]) == \
        ("k:9092", "SSL", True, "all")
    assert "enable.sparse.connections" not in conf             # librdkafka's default unless asked for dense
    dense = Producers()
    fence_all("k:9092", txids[:3], 30.0, {}, dense=True, producer_factory=dense)
    assert all(p.conf["enable.sparse.connections"] is False for p in dense.made)
    assert fence_all("k:9092", [], 30.0, {}, producer_factory=dense) == 0 and len(dense.made) == 3


@pytest.mark.parametrize("pool, n", [(8, 40), (None, 130), (1, 6)], ids=["pool-8", "default-pool-64", "pool-1"])
def test_the_pool_fences_that_many_ids_at_once_and_never_more(pool, n):
    """Each fence waits until ``pool`` fences are in flight: done one after another, the first would wait
    in vain and resolution would fail."""
    want = pool or fencing.DEFAULT_POOL
    gate, made = InFlight(want), Producers()
    made.init = gate
    assert fence_all("k:9092", ids(n), 30.0, {}, pool_size=pool, producer_factory=made) == n
    assert gate.most == want and not gate.broken
    assert made.txids() == sorted(ids(n)) and made.all_closed_once()
    assert fence_threads() == []                               # the pool's threads were joined


def test_a_sequential_fencing_fails_the_concurrency_check():
    # The control of the test above: InFlight does catch fences that do not overlap.
    gate, made = InFlight(2, wait=0.2), Producers()
    made.init = gate
    with pytest.raises(FenceFailed, match="only 1 fences in flight"):
        fence_all("k:9092", ids(4), 30.0, {}, pool_size=1, producer_factory=made)
    assert made.all_closed_once()


def test_every_failure_is_named_with_its_id_in_order_and_every_producer_is_closed():
    txids = ids(20)
    bad = {txids[13]: kafka_error(KafkaError._TRANSPORT, "Connection refused"),
           txids[7]: kafka_error(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                                 "Transactional Id authorization failed")}

    def init(txid: str, timeout: float) -> None:
        if txid in bad:
            raise bad[txid]

    made, before = Producers(init), threading.active_count()
    with pytest.raises(FenceFailed) as info:
        fence_all("k:9092", txids, 30.0, {}, pool_size=4, producer_factory=made)
    exc = info.value
    assert isinstance(exc, SinkUnavailable)                    # what the operator and its metrics expect
    assert exc.failures == [FenceFailure(txids[7], str(bad[txids[7]].args[0])),
                            FenceFailure(txids[13], str(bad[txids[13]].args[0]))]
    # The first failure's message is resolution's as it was; the others are named after it.
    assert str(exc).startswith(f"resolution could not fence {txids[7]}: {bad[txids[7]].args[0]}; the sink "
                               "cluster must be reachable before the stream restarts (1 more ids not fenced: "
                               f"{txids[13]})")
    assert exc.__cause__ is bad[txids[7]]
    assert denial(exc) == "KafkaAuthorizationFailed"           # the status reason still sees the ACL error
    assert made.txids() == sorted(txids)                       # the other ids were fenced all the same
    assert made.all_closed_once()
    assert threading.active_count() == before and fence_threads() == []


def test_one_failure_reads_exactly_as_before():
    err = kafka_error(KafkaError._TRANSPORT, "Connection refused")

    def init(txid: str, timeout: float) -> None:
        raise err

    with pytest.raises(FenceFailed) as info:
        fence_all("k:9092", ["t-0"], 30.0, {}, producer_factory=Producers(init))
    assert str(info.value) == (f"resolution could not fence t-0: {err.args[0]}; the sink cluster must be "
                               "reachable before the stream restarts")


def test_one_deadline_bounds_every_fence_and_the_ids_it_leaves_are_named():
    """init_transactions waits out its timeout (a broker that does not answer): the first two fences get the
    time left and time out together; the other four are never started, and are named as over the deadline."""
    txids = ids(6)

    def init(txid: str, timeout: float) -> None:
        threading.Event().wait(timeout + 0.05)   # librdkafka returns a moment after its timeout
        raise kafka_error(KafkaError._TIMED_OUT, "Transactional API operation (init_transactions) timed out")

    made = Producers(init)
    with pytest.raises(FenceFailed) as info:
        fence_all("k:9092", txids, 0.3, {}, pool_size=2, producer_factory=made)
    failures = info.value.failures
    assert [f.txid for f in failures] == txids                 # all of them, in the order asked
    assert all("_TIMED_OUT" in f.reason for f in failures[:2])
    assert all(f.reason == "not fenced within the 0.3 s deadline of resolution's fencing" for f in failures[2:])
    assert len(made.made) == 2 and made.all_closed_once()      # no producer made past the deadline
    assert all(0 < p.timeouts[0] <= 0.3 for p in made.made)    # each fence had the time left, not a timeout of its own
    assert fence_threads() == []


def test_a_fence_that_outlives_the_deadline_is_reported_and_closes_its_producer_when_it_returns():
    txids, release = ids(4), threading.Event()

    def init(txid: str, timeout: float) -> None:
        if txid == txids[0]:
            release.wait(WAIT)                   # ignores its timeout

    made = Producers(init)
    with pytest.raises(FenceFailed) as info:
        fence_all("k:9092", txids, 0.2, {}, pool_size=4, producer_factory=made, grace_s=0.1)
    assert [f.txid for f in info.value.failures] == [txids[0]]
    assert "still had not returned 0.1 s after it" in info.value.failures[0].reason
    stuck = next(p for p in made.made if p.txid == txids[0])
    assert not stuck.closed.is_set()
    release.set()
    assert stuck.closed.wait(WAIT) and made.all_closed_once()


def test_an_error_that_is_not_kafkas_is_raised_as_it_is_after_the_producers_are_closed():
    def init(txid: str, timeout: float) -> None:
        if txid.endswith("-1-2"):
            raise ValueError("a bug")

    made = Producers(init)
    with pytest.raises(ValueError, match="a bug"):
        fence_all("k:9092", ids(8), 30.0, {}, pool_size=1, producer_factory=made)
    assert made.all_closed_once() and fence_threads() == []


def test_release_closes_or_else_flushes_and_never_raises():
    class Old:   # a confluent_kafka before Producer.close()
        flushed = None

        def flush(self, timeout=None):
            self.flushed = timeout
            return 0

    class Failing:
        def close(self):
            raise RuntimeError("Producer has been closed")

    old = Old()
    fencing.release(old)
    assert old.flushed == 0
    fencing.release(Failing())


# ----------------------------------------------------------------- through resolve()
class _Admin:
    """What resolve() asks the sink's AdminClient, for a cluster of ``brokers`` with no topics yet."""

    def __init__(self, brokers: int):
        self.brokers = brokers


def _resolve(monkeypatch, made: Producers, *, brokers: int = 1, slots: int = 5, generation: int = 1, **kw):
    def describe(admin, timeout_s):
        admin._eos_brokers = admin.brokers
        return {}

    monkeypatch.setattr(resolution, "admin_client", lambda *a, **k: contextlib.nullcontext(_Admin(brokers)))
    monkeypatch.setattr(resolution, "describe_topics", describe)
    monkeypatch.setattr(resolution, "open_transaction_partitions", lambda *a, **k: set())
    real = fencing.fence_all
    monkeypatch.setattr(resolution, "fence_all", lambda *a, **k: real(*a, **k, producer_factory=made))
    spec = ExactlyOnceStreamSpec.model_validate({
        "job": {"module": "m", "parallelism": slots}, "source": {"bootstrapServers": "k:9092", "topics": ["in"]},
        "sink": {"bootstrapServers": "k:9092", "topic": "out"}, "checkpoint": {"store": "local", "path": "/c"}})
    stream = StreamIdentity(name="colors", namespace="default", uid="0123abcd-uid", generation=generation)
    config = RunConfig(stream=stream, spec=spec, checkpoint_dir="/c/live")
    return resolution.resolve(config, timeout_s=30.0, facts=CheckpointFacts(checkpoint_dir="/c/live"), **kw)


def test_resolve_fences_both_generations_of_every_slot_and_reports_as_before(monkeypatch):
    made = Producers()
    report = _resolve(monkeypatch, made)
    prefix = "eos-default-colors-0123abcd"
    assert made.txids() == sorted([*(f"{prefix}-{g}-{s}" for g in (0, 1) for s in range(5)), f"{prefix}-driver"])
    assert report.fenced_transactional_ids == 11 and report.generation == 1 and report.slots == 5
    assert report.summary.startswith("fenced 11 transactional ids; no checkpoint yet")
    assert made.all_closed_once()
    # One broker: dense connections; a larger cluster keeps librdkafka's sparse ones unless asked.
    assert all(p.conf["enable.sparse.connections"] is False for p in made.made)
    larger = Producers()
    _resolve(monkeypatch, larger, brokers=fencing.DENSE_MAX_BROKERS + 1)
    assert all("enable.sparse.connections" not in p.conf for p in larger.made)
    forced = Producers()
    _resolve(monkeypatch, forced, brokers=fencing.DENSE_MAX_BROKERS + 1, dense_fences=True, fence_pool=2)
    assert all(p.conf["enable.sparse.connections"] is False for p in forced.made)


def test_resolve_fails_on_a_fence_that_fails_naming_the_id(monkeypatch):
    def init(txid: str, timeout: float) -> None:
        if txid.endswith("-0-3"):
            raise kafka_error(KafkaError._TRANSPORT, "Connection refused")

    made = Producers(init)
    with pytest.raises(SinkUnavailable, match=r"^resolution could not fence eos-default-colors-0123abcd-0-3: "
                                              r"KafkaError\{code=_TRANSPORT"):
        _resolve(monkeypatch, made)
    assert len(made.made) == 11 and made.all_closed_once()


# ----------------------------------------------------------------- abort markers after the fences
def _held_for(monkeypatch, looks: int) -> list:
    """open_transaction_partitions answers a held partition ``looks`` times, then nothing; returns its calls."""
    calls = []

    def open_partitions(admin, topics, names, timeout_s):
        calls.append((admin, names, timeout_s))
        return {("out", 0)} if len(calls) <= looks else set()

    monkeypatch.setattr(resolution, "open_transaction_partitions", open_partitions)
    return calls


def test_markers_that_trail_the_fences_by_a_moment_cost_about_that_moment(monkeypatch):
    calls, sleeps = _held_for(monkeypatch, 2), []
    admin = _Admin(1)
    assert resolution._still_held(admin, {}, ["out"], 7.0, sleep=sleeps.append) == set()
    assert calls == [(admin, ["out"], 7.0)] * 3
    assert sleeps == [pytest.approx(0.05), pytest.approx(0.1)] and sum(sleeps) < 0.5
    # Nothing held at all: one look, no pause.
    assert resolution._still_held(admin, {}, ["out"], 7.0, sleep=sleeps.append) == set()
    assert len(calls) == 4 and len(sleeps) == 2


def test_a_partition_that_stays_held_is_given_up_on_after_five_seconds_of_pauses(monkeypatch):
    calls, sleeps = _held_for(monkeypatch, 10**6), []
    assert resolution._still_held(_Admin(1), {}, ["out"], 7.0, sleep=sleeps.append) == {("out", 0)}
    assert sum(sleeps) == pytest.approx(5.0)
    assert sleeps[:5] == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.5]) and max(sleeps) == pytest.approx(0.5)
    assert len(calls) == len(sleeps) + 1   # a last look after the last pause
