"""Dead letters only for what is wrong with a record (eos_job.poison, the slot write path in eos_job.sink).

The fake below behaves as librdkafka and a broker do: produced records wait in the queue; a flush (or the
commit) sends them in requests filled up to the producer's batch bound (a record larger than the bound goes
alone), and the broker refuses a whole request whose record batch is over the topic's max.message.bytes,
every record of it getting MSG_SIZE_TOO_LARGE; any refusal leaves the transaction abortable.
"""
from __future__ import annotations

from types import SimpleNamespace

import pyarrow as pa
import pytest
from confluent_kafka import KafkaError, KafkaException

from eos_job import poison, protocol, sink, slot_produce

LIMIT = 1000                      # the sink topic's max.message.bytes


class Broker:
    def __init__(self, limits: dict[str, int]):
        self.limits = limits
        self.log: dict[str, list] = {}          # committed records per topic
        self.requests: list[int] = []           # records per request sent
        self.seen: list[tuple] = []             # (topic, key) of every record sent


class FakeProducer:
    """A transactional librdkafka producer in front of ``Broker``: batch_bound is min(batch.size,
    message.max.bytes); ``refuse`` names records the broker refuses by themselves (INVALID_RECORD)."""

    def __init__(self, broker: Broker, batch_bound: int, *, max_bytes: int = 100_000, refuse=(),
                 produce_errors=(), delivery_errors=()):
        self.broker, self.bound, self.max_bytes, self.refuse = broker, batch_bound, max_bytes, set(refuse)
        self.produce_errors = list(produce_errors)      # codes raised by the next produce() calls
        self.delivery_errors = list(delivery_errors)    # codes the next requests fail with
        self.queue: list = []
        self.sent: list = []
        self.abortable: KafkaError | None = None

    def begin_transaction(self):
        self.queue, self.sent, self.abortable = [], [], None

    def produce(self, topic, value=None, key=None, headers=None, partition=None, on_delivery=None):
        code = self.produce_errors.pop(0) if self.produce_errors else None
        if code is not None:
            raise KafkaException(KafkaError(code))
        if len(value or b"") + len(key or b"") > self.max_bytes:
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
        self.queue.append((topic, key, value, on_delivery))

    def flush(self, timeout=None):
        by_topic: dict[str, list] = {}
        for rec in self.queue:
            by_topic.setdefault(rec[0], []).append(rec)
        self.queue = []
        for topic, recs in by_topic.items():
            request, size = [], 0
            for rec in recs + [None]:
                wire = len(rec[2] or b"") + len(rec[1] or b"") if rec is not None else 0
                if rec is None or (request and size + wire > self.bound):
                    self._send(topic, request, size)
                    request, size = [], 0
                if rec is not None:
                    request.append(rec)
                    size += wire
        return 0

    def _send(self, topic, request, size):
        if not request:
            return
        self.broker.requests.append(len(request))
        self.broker.seen += [(topic, rec[1]) for rec in request]
        code = self.delivery_errors.pop(0) if self.delivery_errors else None
        if code is None and poison.BATCH_HEADER + size > self.broker.limits.get(topic, 10**9):
            code = KafkaError.MSG_SIZE_TOO_LARGE
        bad = [r for r in request if (topic, r[1], r[2]) in self.refuse]
        for rec in request:
            err = code
            if err is None and bad:
                err = KafkaError.INVALID_RECORD if rec in bad else KafkaError._INVALID_DIFFERENT_RECORD
            if err is None:
                self.sent.append(rec)
                continue
            self.abortable = KafkaError(err, KafkaError(err).str(), txn_requires_abort=True)
            if rec[3] is not None:
                rec[3](KafkaError(err), _Msg(rec))

    def commit_transaction(self, timeout=None):
        self.flush()
        if self.abortable is not None:
            raise KafkaException(self.abortable)
        for topic, key, value, _ in self.sent:
            self.broker.log.setdefault(topic, []).append((key, value))

    def abort_transaction(self, timeout=None):
        self.queue, self.sent, self.abortable = [], [], None

    def poll(self, timeout=None):
        return 0


class _Msg:
    def __init__(self, rec):
        self.rec = rec

    def topic(self):
        return self.rec[0]

    def key(self):
        return self.rec[1]

    def value(self):
        return self.rec[2]


class _Clients:
    def __init__(self, producer):
        self.consumer, self.producer, self.fresh = SimpleNamespace(unassign=lambda: None), producer, True
        self.fence_ms = self.commit_ms = 0.0
        self.last_record, self.last_scope, self.clean = None, None, False   # as _SlotClients after its fence


BASE = dict(bootstrap="x:9092", producer_config={}, topic="out", dead_letter_topic="dlq", ledger_topic="ledger",
            tx_prefix="p", generation=0, stream_uid="u", spec_hash="h", transaction_timeout_ms=1000, slots=2)


def _cfg(**kw) -> sink.SlotWriterConfig:
    return sink.SlotWriterConfig(**{**BASE, **kw}, checkpoint_id="c", batch=3)


def _rows(values: list[bytes]) -> list[pa.RecordBatch]:
    return [pa.RecordBatch.from_pydict({"key": [b"%d" % i for i in range(len(values))], "value": values,
                                        protocol.HASH_COL: list(range(1, len(values) + 1))})]


@pytest.fixture
def slot(monkeypatch):
    """write_slot over FakeProducers made by the given factory, one per fence; returns the broker."""
    def run(cfg, values, *producers):
        made = iter(producers)
        held: list = []

        def clients_for(cfg, slot, fresh):
            if fresh or not held:
                held[:] = [_Clients(next(made))]
            return held[0]

        monkeypatch.setattr(sink, "_slot_clients", clients_for)
        monkeypatch.setattr(sink, "_discard", lambda cfg, slot: held.clear())
        monkeypatch.setattr(sink, "read_latest", lambda *a, **_: None)
        monkeypatch.setattr(sink.time, "sleep", lambda s: None)
        return sink.write_slot(cfg, 0, 0, _rows(values))
    return run


def _out(broker: Broker) -> list[bytes]:
    return sorted(k for k, _ in broker.log.get("out", []))


def test_a_request_refused_whole_for_its_size_is_written_again_and_nothing_is_a_dead_letter(slot):
    """The batch bound (1 MB) is over the topic's limit: the broker refuses each request of several records
    whole. Every record fits by itself, so each goes alone the next time; none goes to the dead letters."""
    broker = Broker({"out": LIMIT})
    values = [b"v" * 300] * 12
    commit = slot(_cfg(), values, FakeProducer(broker, batch_bound=1_000_000))
    assert commit.dead_letters == 0 and commit.count == 12
    assert _out(broker) == sorted(b"%d" % i for i in range(12)) and "dlq" not in broker.log


def test_only_the_record_refused_alone_is_a_dead_letter(slot):
    """A compressing producer (no size check before produce): the one record over the limit by itself is
    refused alone and becomes a dead letter; the good records of its request are written."""
    broker = Broker({"out": LIMIT})
    values = [b"v" * 300] * 5 + [b"x" * 5000] + [b"v" * 300] * 5
    cfg = _cfg(producer_config={"compression.type": "lz4"}, topic_limits={"out": LIMIT, "dlq": 10**6})
    commit = slot(cfg, values, FakeProducer(broker, batch_bound=1_000_000))
    assert commit.dead_letters == 1 and commit.count == 11
    assert _out(broker) == sorted(b"%d" % i for i in range(11) if i != 5)
    assert [k for k, _ in broker.log["dlq"]] == [b"5"]


def test_a_record_over_its_topics_limit_is_a_dead_letter_before_it_is_produced(slot):
    broker = Broker({"out": LIMIT})
    values = [b"v" * 100] * 3 + [b"x" * 5000]
    producer = FakeProducer(broker, batch_bound=900)
    commit = slot(_cfg(topic_limits={"out": LIMIT, "dlq": 2000}), values, producer)
    assert commit.dead_letters == 1 and _out(broker) == [b"0", b"1", b"2"]
    (key, value), = broker.log["dlq"]
    assert key == b"3" and 0 < len(value) < 2000     # the dead letter itself kept under its topic's limit
    assert ("out", b"3") not in broker.seen          # the big record never went to the broker


def test_a_record_over_the_producers_message_max_bytes_is_still_a_dead_letter(slot):
    broker = Broker({})
    commit = slot(_cfg(producer_config={"message.max.bytes": "400"}), [b"v", b"x" * 500, b"w"],
                  FakeProducer(broker, batch_bound=1000, max_bytes=400))
    assert commit.dead_letters == 1 and _out(broker) == [b"0", b"2"] and broker.log["dlq"][0][0] == b"1"


@pytest.mark.parametrize("code", [KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC])
def test_a_transient_produce_error_fences_again_and_dead_letters_nothing(slot, code):
    """_UNKNOWN_PARTITION right after the topic gained partitions: the next fence's producer knows them."""
    broker = Broker({})
    first = FakeProducer(broker, batch_bound=10_000, produce_errors=[None, code])
    commit = slot(_cfg(), [b"a", b"b", b"c"], first, FakeProducer(broker, batch_bound=10_000))
    assert commit.dead_letters == 0 and _out(broker) == [b"0", b"1", b"2"] and "dlq" not in broker.log


@pytest.mark.parametrize("code", [KafkaError._MSG_TIMED_OUT, KafkaError.NOT_ENOUGH_REPLICAS,
                                  KafkaError.NOT_LEADER_FOR_PARTITION])
def test_a_transient_delivery_error_fences_again_and_dead_letters_nothing(slot, code):
    broker = Broker({})
    commit = slot(_cfg(), [b"a", b"b"], FakeProducer(broker, batch_bound=10_000, delivery_errors=[code]),
                  FakeProducer(broker, batch_bound=10_000))
    assert commit.dead_letters == 0 and _out(broker) == [b"0", b"1"] and "dlq" not in broker.log


def test_errors_that_never_go_away_fail_the_task_and_write_nothing(slot):
    """Never a dead letter, never success: after every fenced round the task fails (Spark retries it)."""
    broker = Broker({})
    producers = [FakeProducer(broker, batch_bound=10_000, delivery_errors=[KafkaError._MSG_TIMED_OUT])
                 for _ in range(sink.MAX_FENCE_ROUNDS)]
    with pytest.raises(RuntimeError, match="could not commit after 5 fenced attempts"):
        slot(_cfg(), [b"a", b"b"], *producers)
    assert broker.log == {}


def test_an_invalid_record_is_a_dead_letter_and_its_neighbours_are_written(slot):
    """The broker names the invalid record of a request (INVALID_RECORD), the others get
    _INVALID_DIFFERENT_RECORD: only the named one, refused again alone, is a dead letter."""
    broker = Broker({})
    values = [b"a", b"b", b"c", b"d"]
    commit = slot(_cfg(), values, FakeProducer(broker, batch_bound=10_000, refuse={("out", b"2", b"c")}))
    assert commit.dead_letters == 1 and _out(broker) == [b"0", b"1", b"3"]
    assert [k for k, _ in broker.log["dlq"]] == [b"2"]


def test_refusals_on_produce_that_are_the_records_own():
    assert poison.refused_on_produce(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
    for code in (KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC, KafkaError._QUEUE_FULL,
                 KafkaError._STATE, KafkaError._FENCED, KafkaError._INVALID_ARG):
        assert not poison.refused_on_produce(KafkaError(code))
    assert not poison.refused_on_produce(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, fatal=True))


def test_the_size_check_before_produce_needs_an_uncompressed_producer_and_a_known_limit():
    assert poison.checked_limits({}, {"out": 10}) == {"out": 10}
    assert poison.checked_limits({"compression.type": "zstd"}, {"out": 10}) == {}
    assert poison.too_large("out", b"k", b"v" * 10, {"out": 1000}) is None
    assert poison.too_large("other", b"k", b"v" * 10_000, {"out": 1000}) is None
    why = poison.too_large("out", b"k", b"v" * 1000, {"out": 1000})
    assert why.startswith("MSG_SIZE_TOO_LARGE") and "1062 bytes" in why and "max.message.bytes 1000" in why


def test_a_full_local_queue_waits_for_room_and_gives_up_as_a_retry_never_a_dead_letter(monkeypatch):
    polls: list[float] = []

    class Full:
        def produce(self, *a, **kw):
            raise BufferError("queue full")

        def poll(self, timeout):
            polls.append(timeout)

    monkeypatch.setattr(slot_produce, "QUEUE_FULL_WAITS", 3)
    with pytest.raises(KafkaException) as raised:
        slot_produce.send(Full(), "out", b"v", b"k", None, None, None)
    assert raised.value.args[0].code() == KafkaError._QUEUE_FULL and polls == [0.5] * 3
