"""A held clean producer writes without a fence and a ledger read (protocol amendment A2), on the real broker.

The slot write path as the executors run it (``sink.write_slot``), no Spark: two Python "workers" are two pools
of held producers (``sink._clients``), and slot 0's tasks move between them. Batch n carries ids
40n..40n+39; the output is read back read_committed and every id is audited (``verify.audit_ids``).

* Steady state: worker A's second batch is trusted (no fence, no read, counted). Worker B then writes batch 2
  (fencing the id); a late attempt of batch 2 on A trusts its stale producer, whose transaction the broker
  refuses: it falls back to fence-then-read, finds batch 2 committed and skips. Every id once.
* A commit whose outcome is lost (``EOS_FAULT_COMMIT_OUTCOME_LOST``: applied, then the task sees an error):
  with the rule the producer is discarded and the read skips the retry (every id once); with ``held-clean``
  off (the negative control) the producer keeps trusting its last record and the retry writes batch 1 again:
  the audit reports its ids twice.
"""
from __future__ import annotations

import pyarrow as pa
import pytest

from eos_job import faults, protocol, sink
from eos_job.slot_stats import SlotStats
from eos_job.verify import audit_ids
from tests.stack.conftest import sink_and_ledger

pytestmark = pytest.mark.stack

TIMEOUT = 60.0
PER_BATCH = 40


@pytest.fixture
def names(bootstrap):
    yield from sink_and_ledger(bootstrap, "a2")


@pytest.fixture
def workers(monkeypatch):
    """Two Python workers' producer pools; ``use(w)`` makes worker w's the sink's. Every producer closed after."""
    pools: dict[str, dict] = {"A": {}, "B": {}}

    def use(w: str) -> None:
        monkeypatch.setattr(sink, "_clients", pools[w])
    yield use
    for pool in pools.values():
        for clients in pool.values():
            clients.close()


def ids(batch: int) -> range:
    return range(PER_BATCH * batch, PER_BATCH * (batch + 1))


def write(bootstrap: str, names: dict, batch: int, unsafe: frozenset[str] = frozenset()) -> tuple[
        protocol.SlotCommit, SlotStats]:
    rows = pa.RecordBatch.from_pydict({"key": [str(i).encode() for i in ids(batch)],
                                       "value": [b"%d" % i for i in ids(batch)],
                                       protocol.HASH_COL: [i + 1 for i in ids(batch)]})
    cfg = sink.SlotWriterConfig(
        bootstrap=bootstrap, producer_config={}, topic=names["out"], dead_letter_topic=None,
        ledger_topic=names["ledger"], tx_prefix=names["prefix"], generation=0, stream_uid=names["uid"],
        checkpoint_id="c", spec_hash="spec", transaction_timeout_ms=60000, batch=batch, slots=1,
        input=f"batch-{batch}-input", output_hash="out", unsafe=unsafe)
    stats = SlotStats()
    return sink.write_slot(cfg, 0, 0, iter([rows]), stats), stats


def fences_reads_trusted(s: SlotStats) -> tuple[int, int, int, int]:
    return s.fences, s.ledger_reads, s.trusted, s.trusted_fallbacks


def test_a_held_clean_producer_is_trusted_and_a_fence_by_another_worker_sends_it_back_to_the_truth(
        bootstrap, names, workers):
    workers("A")
    c0, s0 = write(bootstrap, names, 0)
    assert not c0.skipped and fences_reads_trusted(s0) == (1, 1, 0, 0)
    c1, s1 = write(bootstrap, names, 1)
    assert not c1.skipped and fences_reads_trusted(s1) == (0, 0, 1, 0)      # no fence, no read
    workers("B")
    c2, s2 = write(bootstrap, names, 2)                                     # B fences the id, writes batch 2
    assert not c2.skipped and fences_reads_trusted(s2) == (1, 1, 0, 0)
    workers("A")
    late, s_late = write(bootstrap, names, 2)                               # a late attempt of batch 2 on A
    assert late.skipped and late.count == PER_BATCH, late                   # refused, fell back, read, skipped
    assert fences_reads_trusted(s_late) == (1, 1, 1, 1)
    c3, s3 = write(bootstrap, names, 3)                                     # A's new producer only read: fences
    assert not c3.skipped and fences_reads_trusted(s3) == (1, 1, 0, 0)
    out = audit_ids(bootstrap, names["out"], set(range(4 * PER_BATCH)), TIMEOUT)
    assert not out.violations() and out.records == 4 * PER_BATCH, out.violations()


@pytest.fixture
def outcome_lost(monkeypatch):
    monkeypatch.setenv(faults.COMMIT_OUTCOME_LOST_ENV, "1:0")   # batch 1, slot 0
    faults.reset()
    yield
    monkeypatch.delenv(faults.COMMIT_OUTCOME_LOST_ENV)
    faults.reset()


@pytest.mark.parametrize("unsafe", [frozenset(), frozenset({"held-clean"})],
                         ids=["rule", "negative-control-held-clean-off"])
def test_a_commit_whose_outcome_is_lost(bootstrap, names, workers, outcome_lost, unsafe):
    workers("A")
    write(bootstrap, names, 0, unsafe)
    c1, s1 = write(bootstrap, names, 1, unsafe)                     # trusted; its commit applies, then raises
    write(bootstrap, names, 2, unsafe)
    out = audit_ids(bootstrap, names["out"], set(range(3 * PER_BATCH)), TIMEOUT)
    if not unsafe:
        assert c1.skipped and fences_reads_trusted(s1) == (1, 1, 1, 1)   # discarded, fenced, read: committed
        assert not out.violations() and out.records == 3 * PER_BATCH, out.violations()
    else:
        assert not c1.skipped and fences_reads_trusted(s1) == (0, 0, 2, 1)   # trusted again: written again
        assert not out.missing and sorted(out.duplicates) == list(ids(1)), out.violations()
        assert out.records == 4 * PER_BATCH
