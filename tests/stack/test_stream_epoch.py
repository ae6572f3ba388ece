"""Supersede by stream, not by key, on the real broker (the slot write path and the driver's start, no Spark).

Driver A runs generation 0 (two slots) on checkpoint ``a``. Driver B starts after a parallelism change:
generation 1 (one slot), on another checkpoint identity (``b``, a restore onto a fresh copy). B's slot keys
and transactional ids are not A's, so the epoch stamp on B's own keys tells A nothing. What tells A: B's
start marks every ledger slot partition under every generation's transactional id (``epoch.mark``), and
A's slots meet the marker on their read (``sink._read_slot``); A's driver meets B's epoch in partition 0
(``epoch.EpochWatch``). Checked by what reaches the sink, read_committed: A's batch after B's start writes
none of its ids; with ``stream-epoch`` switched off (the negative control) it writes all of them, which in a
real stream are ids B writes too.
"""
from __future__ import annotations

import uuid

import pyarrow as pa
import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient

from eos_job import epoch, protocol, sink
from eos_job.contract import DriverSuperseded
from eos_job.ledger_topic import Durability
from eos_job.verify import audit_ids, open_transactions
from tests.stack.conftest import sink_and_ledger

pytestmark = pytest.mark.stack

TIMEOUT = 60.0


@pytest.fixture
def names(bootstrap):
    yield from sink_and_ledger(bootstrap, "epoch")


def _rows(ids: range) -> list[pa.RecordBatch]:
    keys = [str(i).encode() for i in ids]
    return [pa.RecordBatch.from_pydict({"key": keys, "value": [b"%d" % i for i in ids],
                                        protocol.HASH_COL: [i + 1 for i in ids]})]


def _slot(bootstrap: str, names: dict, *, generation: int, checkpoint: str, epoch_: int, batch: int, slot: int,
          ids: range, unsafe: frozenset[str] = frozenset()) -> protocol.SlotCommit:
    cfg = sink.SlotWriterConfig(
        bootstrap=bootstrap, producer_config={}, topic=names["out"], dead_letter_topic=None,
        ledger_topic=names["ledger"], tx_prefix=names["prefix"], generation=generation, stream_uid=names["uid"],
        checkpoint_id=checkpoint, spec_hash="h", transaction_timeout_ms=60000, batch=batch, slots=2,
        epoch=epoch_, unsafe=unsafe)
    try:
        return sink.write_slot(cfg, slot, 0, iter(_rows(ids)))
    finally:
        sink._discard(cfg, slot)


def _start(bootstrap: str, names: dict, *, generation: int, slots: int, checkpoint: str | None,
           unsafe: frozenset[str] = frozenset()):
    """A driver's start as ``BatchWriter.claim`` does it: generation, its partition-0 writer (fencing the
    previous driver's), epoch, markers; its partition-0 watch."""
    gen, history = epoch.claim_generation(bootstrap, {}, names["ledger"], names["uid"], generation, slots, 0)
    assert gen == generation
    names.setdefault("writers", []).append(epoch.driver_producer(bootstrap, {}, names["prefix"], unsafe))
    e, since = epoch.take(bootstrap, {}, names["ledger"], names["uid"])
    epoch.mark(bootstrap=bootstrap, sec={}, ledger_topic=names["ledger"], tx_prefix=names["prefix"],
               history=history, generation=gen, stream_uid=names["uid"], checkpoint_id=checkpoint, epoch=e,
               transaction_timeout_ms=60000)
    return e, epoch.EpochWatch(bootstrap, {}, names["ledger"], names["uid"], e, since)


@pytest.mark.parametrize("safety", ["on", "off"], ids=["stream-epoch", "negative-control-without-it"])
def test_a_driver_of_another_generation_and_checkpoint_supersedes_the_old_one(bootstrap, names, safety):
    unsafe = frozenset() if safety == "on" else frozenset({"stream-epoch"})
    ea, watch_a = _start(bootstrap, names, generation=0, slots=2, checkpoint="a", unsafe=unsafe)
    for slot in (0, 1):   # A's batch 0, ids 0..99
        _slot(bootstrap, names, generation=0, checkpoint="a", epoch_=ea, batch=0, slot=slot,
              ids=range(slot * 50, slot * 50 + 50), unsafe=unsafe)
    watch_a.check()                                     # nobody newer yet

    # A has a transaction open on slot 1's ledger partition when B starts (stalled mid-commit).
    stalled = Producer({"bootstrap.servers": bootstrap,
                        "transactional.id": protocol.transactional_id(names["prefix"], 0, 1)})
    stalled.init_transactions(TIMEOUT)
    stalled.begin_transaction()
    stalled.produce(names["out"], key=b"stalled", value=b"x", partition=1)
    stalled.flush(TIMEOUT)

    eb, watch_b = _start(bootstrap, names, generation=1, slots=1, checkpoint="b")
    assert eb == ea + 1
    with pytest.raises(KafkaException):                 # B's markers fenced generation 0's ids
        stalled.commit_transaction(TIMEOUT)
    assert open_transactions(bootstrap, [names["out"], names["ledger"]]) == set()

    # A comes back: its batch 1 (ids 100..199) on both slots; its driver's next partition-0 write.
    outcome = []
    for slot in (0, 1):
        try:
            _slot(bootstrap, names, generation=0, checkpoint="a", epoch_=ea, batch=1, slot=slot,
                  ids=range(100 + slot * 50, 150 + slot * 50), unsafe=unsafe)
            outcome.append("wrote")
        except DriverSuperseded as exc:
            assert f"newer driver (epoch {eb})" in str(exc)
            outcome.append("superseded")
    watch_b.check()
    writer_a = names["writers"][0]
    ids = audit_ids(bootstrap, names["out"], set(range(200)), TIMEOUT)
    if safety == "on":
        assert outcome == ["superseded", "superseded"]
        with pytest.raises(DriverSuperseded, match=f"epoch {eb}"):
            watch_a.check()
        # Past the watch (it looked just before B took its epoch): the write itself fails, B fenced its writer.
        with pytest.raises(DriverSuperseded, match="ledger writer was fenced"):
            epoch.write_driver_record(writer_a, names["ledger"], f"{names['uid']}/a/input/1", b"{}")
        assert ids.missing == list(range(100, 200)) and not ids.duplicates and ids.records == 100, ids.violations()
    else:   # the control: A's batch goes on as if nobody had started, ids B writes too
        assert outcome == ["wrote", "wrote"]
        assert ids.missing == [] and not ids.duplicates and ids.records == 200, ids.violations()
        epoch.write_driver_record(writer_a, names["ledger"], f"{names['uid']}/a/input/1", b"{}")   # lands
    watch_a.close()
    watch_b.close()


def test_of_two_streams_started_together_on_one_empty_ledger_one_stops_before_its_first_batch(bootstrap, names):
    """Both start checks pass (the ledger is empty when each looks); each stream's watch then reads partition 0
    from before its epoch, so at least one meets the other's records before it records a batch."""
    from eos_job.ledger import SinkUnavailable, ledger_consumer
    from eos_job.ledger_topic import check_ledger_topic
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        other = {**names, "uid": uuid.uuid4().hex, "prefix": names["prefix"] + "-b"}
        for n in (names, other):
            consumer = ledger_consumer(bootstrap)
            check_ledger_topic(admin, consumer, n["ledger"], n["uid"], Durability(1, 1), TIMEOUT)   # both pass
            consumer.close()
        watches = [_start(bootstrap, n, generation=0, slots=1, checkpoint=None)[1] for n in (names, other)]
        refused = []
        for w in watches:
            try:
                w.check()
            except SinkUnavailable as exc:
                assert "holds records of another stream" in str(exc)
                refused.append(w.uid)
            w.close()
        assert refused, "both streams went on to record batches in one ledger"
        consumer = ledger_consumer(bootstrap)
        with pytest.raises(SinkUnavailable, match="another stream"):   # and every later start refuses
            check_ledger_topic(admin, consumer, names["ledger"], names["uid"], Durability(1, 1), TIMEOUT)
        consumer.close()
