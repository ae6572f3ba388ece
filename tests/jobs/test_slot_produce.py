"""A slot's rows produced as Spark delivers them (``eos_job.slot_produce`` through ``sink.write_slot``): each record
as its batch arrives, the ledger record last and for the whole slot, a second round from the slot's own copy, the
copy's memory bound, and the audit headers. The Kafka side is faked (tests/jobs/sink_fakes.py)."""
from __future__ import annotations

import pyarrow as pa

from eos_job import poison, protocol, sink, slot_produce
from eos_job.protocol import SlotLedgerRecord
from tests.jobs.sink_fakes import BASE, FakeSlotClients, slot_config, slot_rows


def test_a_slot_is_produced_as_its_batches_arrive_and_its_record_carries_the_whole_slot(monkeypatch):
    """The first record is produced before the second batch arrived; the ledger record, last, counts both."""
    events: list[str] = []

    class Producer:
        def begin_transaction(self):
            events.append("begin")

        def produce(self, topic, value=None, key=None, headers=None, partition=None, on_delivery=None):
            events.append(f"produce {topic} {key!r}" if topic != "ledger" else
                          f"ledger {SlotLedgerRecord.decode(value).count}")

        def commit_transaction(self, timeout):
            events.append("commit")

    def arriving():
        for i in range(2):
            events.append(f"batch {i} arrives")
            yield slot_rows(3)[0] if i == 0 else pa.RecordBatch.from_pydict(
                {"key": [b"late"], "value": [b"v"], protocol.HASH_COL: [7]})

    clients = FakeSlotClients()
    clients.producer = Producer()
    monkeypatch.setattr(sink, "_slot_clients", lambda cfg, slot, fresh: clients)
    monkeypatch.setattr(sink, "read_latest", lambda *a, **_: None)
    commit = sink.write_slot(slot_config(3), 1, 0, arriving())
    assert commit.count == 4 and commit.digest == (1 + 2 + 3 + 7)
    assert events.index("produce out b'k0'") < events.index("batch 1 arrives")
    assert events[-2:] == ["ledger 4", "commit"]


def test_a_second_round_writes_the_same_rows_again_though_spark_delivered_them_once(monkeypatch):
    """A producer error after half the slot: the fresh fence's round writes every row, from what was kept."""
    from confluent_kafka import KafkaError, KafkaException
    produced: list[list] = []

    class Producer:
        def __init__(self, fail_after):
            self.fail_after, self.rows = fail_after, []
            produced.append(self.rows)

        def begin_transaction(self):
            pass

        def produce(self, topic, value=None, key=None, **_):
            if topic == "out":
                self.rows.append(key)
                if len(self.rows) == self.fail_after:
                    raise KafkaException(KafkaError(KafkaError._FENCED, "fenced", fatal=True))

        def commit_transaction(self, timeout):
            pass

        def abort_transaction(self, timeout):
            pass

    producers = iter([Producer(fail_after=4), Producer(fail_after=0)])

    def clients_for(cfg, slot, fresh):
        c = FakeSlotClients()
        c.producer = next(producers)
        return c

    monkeypatch.setattr(sink, "_slot_clients", clients_for)
    monkeypatch.setattr(sink, "_discard", lambda cfg, slot: None)
    monkeypatch.setattr(sink.time, "sleep", lambda s: None)
    monkeypatch.setattr(sink, "read_latest", lambda *a, **_: None)
    batches = iter(slot_rows(3) + slot_rows(3))     # a one-shot iterator, as Spark's is
    commit = sink.write_slot(slot_config(3), 0, 0, batches)
    assert produced[0] == [b"k0", b"k1", b"k2", b"k0"]            # failed on the second batch's first row
    assert produced[1] == [b"k0", b"k1", b"k2"] * 2 and commit.count == 6


def test_kept_rows_beyond_the_memory_bound_go_to_a_local_file_and_come_back_in_order():
    from eos_job.slot_rows import SlotRows
    batches = [pa.RecordBatch.from_pydict({"key": [b"k%d" % i], "value": [b"x" * 1000], protocol.HASH_COL: [i]})
               for i in range(20)]
    rows = SlotRows(iter(batches), memory_limit=5_000)
    first = [b.column(0)[0].as_py() for b in rows]
    assert rows.spilled_batches > 10 and rows.complete and rows.count == 20 and rows.digest == sum(range(20))
    again = [b.column(0)[0].as_py() for b in rows]
    assert first == again == [b"k%d" % i for i in range(20)]
    rows.close()


def test_an_empty_slot_is_known_without_a_transaction_and_a_skip_still_reads_every_row():
    from eos_job.slot_rows import SlotRows
    empty = SlotRows(iter([slot_rows(0)[0], slot_rows(0)[0]]))
    assert not empty.any_rows() and empty.complete
    full = SlotRows(iter(slot_rows(2) + slot_rows(3)))
    assert full.any_rows() and not full.complete
    assert full.drain() == (5, 1 + 2 + 1 + 2 + 3)


def test_records_carry_the_audit_headers_unless_the_stream_opts_out():
    seen: list = []

    class Producer:
        def produce(self, topic, value=None, key=None, headers=None, partition=None, on_delivery=None):
            seen.append(headers)

    for audit in (True, False):
        cfg = sink.SlotWriterConfig(**BASE, checkpoint_id="c", batch=7, audit=audit)
        slot_produce.produce_batch(cfg, Producer(), slot_rows(2)[0], 1, None, poison.Verdicts())
    assert seen[0] == seen[1] == [("eos.batch", b"7"), ("eos.slot", seen[0][1][1])] and seen[0][1][1].endswith(b"/1")
    assert seen[2:] == [None, None]
