"""The slot tasks' counters (eos_job.slot_stats): what the write path counts, on a fake broker that fences.

The fake broker keeps, per transactional id, the epoch of the producer that called ``init_transactions``
last; a commit by any other producer of the id fails as Kafka's does (fenced). Python workers are told apart
by swapping the sink's producer pool (``sink._clients``), so the real pool logic decides hits and re-fences.
"""
from __future__ import annotations

import pyarrow as pa
import pytest
from confluent_kafka import KafkaError, KafkaException

from eos_job import faults, protocol, sink, slot_stats
from eos_job.slot_stats import SlotStats

BASE = dict(bootstrap="x:9092", producer_config={}, topic="out", dead_letter_topic=None, ledger_topic="ledger",
            tx_prefix="p", generation=0, stream_uid="u", spec_hash="h", transaction_timeout_ms=1000, slots=2)


class Reader:
    """A ledger reader: assigned by a read, until unassigned."""
    assigned = False

    def unassign(self):
        self.assigned = False


def read(broker, consumer, key):
    consumer.assigned = True
    return broker.ledger.get(key)


class Broker:
    def __init__(self):
        self.epochs: dict[str, int] = {}
        self.ledger: dict[str, bytes] = {}
        self.output: list[bytes] = []


class FakeProducer:
    def __init__(self, broker: Broker, txid: str):
        self.broker, self.txid, self.pending = broker, txid, []
        broker.epochs[txid] = broker.epochs.get(txid, 0) + 1   # init_transactions: the fence
        self.epoch = broker.epochs[txid]

    def begin_transaction(self):
        self.pending = []

    def produce(self, topic, value=None, key=None, headers=None, on_delivery=None, partition=None):
        self.pending.append((topic, key, value))

    def commit_transaction(self, timeout):
        if self.broker.epochs[self.txid] != self.epoch:
            raise KafkaException(KafkaError(KafkaError._FENCED, "fenced by a newer producer"))
        for topic, key, value in self.pending:
            if topic == "ledger":
                self.broker.ledger[key.decode()] = value
            else:
                self.broker.output.append(value)

    def abort_transaction(self, timeout):
        self.pending = []

    def flush(self, timeout=None):
        return 0

    def poll(self, timeout=None):
        return 0


@pytest.fixture
def world(monkeypatch):
    """(broker, run): run(worker, batch, slot=1, attempt=0) writes one slot task in that worker; its SlotStats."""
    broker = Broker()

    class FakeClients:
        def __init__(self, cfg, slot):
            self.txid = protocol.transactional_id(cfg.tx_prefix, cfg.generation, slot)
            self.producer = FakeProducer(broker, self.txid)
            self.consumer = Reader()
            self.fresh, self.fence_ms, self.commit_ms = True, 1.5, 0.0
            self.last_record, self.last_scope, self.clean = None, None, False   # as _SlotClients after its fence

        def close(self):
            self.producer = None

    monkeypatch.setattr(sink, "_SlotClients", FakeClients)
    monkeypatch.setattr(sink, "read_latest", lambda consumer, topic, partition, key, **_: read(broker, consumer, key))
    monkeypatch.setattr(sink.time, "sleep", lambda s: None)   # the back-off between fence rounds
    pools: dict[str, dict] = {}

    def run(worker: str, batch: int, slot: int = 1, attempt: int = 0, rows=None, **cfg) -> SlotStats:
        monkeypatch.setattr(sink, "_clients", pools.setdefault(worker, {}))
        rows = rows if rows is not None else [pa.RecordBatch.from_pydict(
            {"key": [b"k1", b"k2"], "value": [b"a", b"b"], protocol.HASH_COL: [1, 2]})]
        stats = SlotStats()
        sink.write_slot(sink.SlotWriterConfig(**BASE, checkpoint_id="c", batch=batch, **cfg), slot, attempt, rows,
                        stats)
        assert cfg.get("unsafe") or slot_stats.problems(stats, 1) == []
        # Every reader left unassigned after its read: none fetches between batches.
        assert not any(c.consumer.assigned for pool in pools.values() for c in pool.values())
        return stats

    return broker, run


def counts(s: SlotStats) -> tuple[int, ...]:
    return s.pool_hits, s.new_producers, s.stale_producers, s.fences, s.ledger_reads, s.trusted, s.trusted_fallbacks


def test_a_clean_held_producer_is_trusted_and_one_another_worker_fenced_falls_back(world):
    broker, run = world
    assert counts(run("A", 0)) == (0, 1, 0, 1, 1, 0, 0)   # first task of the slot: a producer, fenced, one read
    assert counts(run("A", 1)) == (1, 0, 0, 0, 0, 1, 0)   # the same worker again: trusted, no fence, no read
    assert counts(run("B", 2)) == (0, 1, 0, 1, 1, 0, 0)   # another worker: a new producer, whose fence ...
    back = run("A", 3)                                    # ... makes A's trusted commit fail: fence, read, write
    assert counts(back) == (1, 1, 0, 1, 1, 1, 1)
    assert back.fence_ms == 1.5 and back.ledger_ms >= 0 and back.tasks == 1
    assert len(broker.output) == 8                        # every batch written once


def test_a_producer_fenced_without_a_commit_is_found_at_its_commit_and_counted_with_the_retry(world):
    broker, run = world
    run("A", 0)
    sink._clients = {}
    sink._slot_clients(sink.SlotWriterConfig(**BASE, checkpoint_id="c", batch=1), 1, fresh=True)   # B fences only
    s = run("A", 1)
    # The held producer was trusted, failed at its commit, and the retry fenced and read again.
    assert counts(s) == (1, 1, 0, 1, 1, 1, 1) and s.tasks == 1
    assert len(broker.output) == 4


def test_a_replay_in_the_same_worker_skips_on_its_trusted_record(world):
    broker, run = world
    run("A", 0)
    s = run("A", 0, attempt=1)
    assert counts(s) == (1, 0, 0, 0, 0, 1, 0) and s.commit_ms == 0
    assert len(broker.output) == 2


@pytest.fixture
def outcome_lost(monkeypatch):
    """The first commit of slot 1 of batch 1 applies, and the task sees an error (faults.commit_returned)."""
    monkeypatch.setenv(faults.COMMIT_OUTCOME_LOST_ENV, "1:1")
    faults.reset()
    yield
    monkeypatch.delenv(faults.COMMIT_OUTCOME_LOST_ENV)
    faults.reset()


def test_a_commit_whose_outcome_is_lost_discards_the_held_producer_and_the_read_skips_the_retry(world, outcome_lost):
    broker, run = world
    run("A", 0)
    s = run("A", 1)
    # Trusted, the commit applied and raised: a fresh fence and read find batch 1 committed and skip.
    assert counts(s) == (1, 1, 0, 1, 1, 1, 1)
    assert len(broker.output) == 4                        # batch 1 once
    # The producer that only read (skipped) is not clean: the next task fences and reads again.
    assert counts(run("A", 2)) == (0, 1, 1, 1, 1, 0, 0)
    assert len(broker.output) == 6


def test_negative_control_held_clean_off_a_lost_outcome_writes_the_batch_twice(world, outcome_lost):
    broker, run = world
    run("A", 0, unsafe=frozenset({"held-clean"}))
    s = run("A", 1, unsafe=frozenset({"held-clean"}))
    # The producer stayed trusted with batch 0 as its last record: the retry of batch 1 committed it again.
    assert (s.trusted, s.trusted_fallbacks, s.fences, s.ledger_reads) == (2, 1, 0, 0)
    assert broker.output == [b"a", b"b"] * 3


def test_a_held_producer_of_another_driver_epoch_is_not_trusted(world):
    broker, run = world
    run("A", 0, epoch=1)
    assert counts(run("A", 1, epoch=2)) == (0, 1, 1, 1, 1, 0, 0)
    assert len(broker.output) == 4


class TaskKilled(BaseException):
    """A task ended mid-transaction by something no ``except Exception`` catches (Spark interrupting it)."""


def test_a_task_that_ends_mid_transaction_leaves_its_producer_not_clean(world):
    broker, run = world
    run("A", 0)

    def killed():
        yield pa.RecordBatch.from_pydict({"key": [b"k1"], "value": [b"a"], protocol.HASH_COL: [1]})
        raise TaskKilled()
    with pytest.raises(TaskKilled):
        run("A", 1, rows=killed())
    assert not sink._clients[protocol.transactional_id("p", 0, 1)].clean
    assert counts(run("A", 1)) == (0, 1, 1, 1, 1, 0, 0)  # fenced and read again, not trusted
    assert len(broker.output) == 4


def test_a_whole_skip_counts_its_task_and_nothing_else():
    stats = SlotStats()
    cfg = sink.SlotWriterConfig(**BASE, checkpoint_id="c", batch=3, skip_all=True)
    rows = [pa.RecordBatch.from_pydict({"key": [b"k"], "value": [b"v"], protocol.HASH_COL: [1]})]
    assert sink.write_slot(cfg, 0, 0, rows, stats).skipped
    assert stats == SlotStats(tasks=1, whole_skips=1)
    assert slot_stats.problems(stats, 1) == []


def test_the_commit_row_carries_the_counters_to_the_driver_and_back():
    commit = protocol.SlotCommit(1, 5, 10, 2**64 - 1, False, 2, False, 3)
    stats = SlotStats(tasks=1, pool_hits=1, ledger_reads=1, ledger_ms=2.5, commit_ms=7.25)
    batch = pa.RecordBatch.from_pylist([{**commit.to_row(), **stats.to_row()}], schema=sink._commit_arrow_schema())
    back_commit, back_stats = slot_stats.split_row(batch.to_pylist()[0])
    assert protocol.SlotCommit.from_row(back_commit) == commit and back_stats == stats
    # The Spark schema and the Arrow schema name the same columns in the same order.
    assert [c.split()[0] for c in sink.COMMIT_SCHEMA.split(", ")] == batch.schema.names


def test_the_batch_total_and_its_consistency_checks():
    a = SlotStats(tasks=1, new_producers=1, fences=1, ledger_reads=1, fence_ms=10)
    b = SlotStats(tasks=1, pool_hits=1, ledger_reads=1, commit_ms=4)
    total = slot_stats.batch_total([a, b])
    assert total == SlotStats(tasks=2, pool_hits=1, new_producers=1, fences=1, ledger_reads=2, fence_ms=10,
                              commit_ms=4)
    assert slot_stats.problems(total, 2) == []
    assert "2 tasks counted, 3 ran" in slot_stats.problems(total, 3)[0]          # a task not counted
    assert slot_stats.problems(slot_stats.batch_total([a, a, b]), 2)             # a task counted twice
    unfenced = SlotStats(tasks=1, new_producers=1, fences=0, ledger_reads=1)
    assert "1 new producers but 0 fences" in slot_stats.problems(unfenced, 1)[0]
    nothing = SlotStats(tasks=1, ledger_reads=0)
    assert "but 0 pool hits and 0 new producers" in slot_stats.problems(nothing, 1)[0]
    assert "1 ledger reads" in slot_stats.problems(SlotStats(tasks=1, ledger_reads=1, whole_skips=1), 1)[0]


def test_the_driver_sums_the_counters_per_batch_and_per_run():
    from eos_job.writer import BatchWriter

    class Row(dict):
        def asDict(self):
            return dict(self)

    writer = BatchWriter.__new__(BatchWriter)
    writer.slot_stats = SlotStats()
    rows = [Row({**protocol.SlotCommit(s, 7, 2, 5, False).to_row(),
                 **SlotStats(tasks=1, pool_hits=s, new_producers=1 - s, fences=1 - s, ledger_reads=1).to_row()})
            for s in range(2)]
    commits, total = writer._commits(rows)
    assert [c.slot for c in commits] == [0, 1] and commits[0] == protocol.SlotCommit(0, 7, 2, 5, False)
    assert (total.tasks, total.pool_hits, total.new_producers, total.ledger_reads) == (2, 1, 1, 2)
    writer._commits(rows)
    assert writer.slot_stats.tasks == 4 and writer.slot_stats.fences == 2
    # The driver's per-batch log line: tests/jobs/test_faults.py (the driver's batch with its slot rows).
