"""A batch one spec left partially committed, finished by another (protocol amendment A1), on the real broker.

The slot write path as the executors run it (``sink.write_slot``: fence, ledger read, ``decide_slot``, one
transaction), no Spark. Ids 0..119 arrive in two source partitions (partition = id % 2). Spec A commits slot 0 of
batch 0 and dies; spec B (another output hash: a rollback, an upgrade) then runs batch 0.

* Source slots (``job.slotsFrom: sourcePartitions``): slot k is source partition k under every spec, so B skips
  slot 0 and writes slot 1: every id once, read_committed.
* Key slots: each spec cuts the batch by its own output keys (A by ``(id // 3) % 2``, B by ``(id // 5) % 2``: a
  transform that changed the keys), so A's slot 0 holds other ids than B's slot 0. B's slot 0 is refused and
  writes nothing (the driver's ``judge_batch`` refuses the batch before any slot runs: tests/jobs).
* The negative control: key slots with ``spec-check`` off, B finishes the batch as if its slots were A's:
  the audit must report ids lost (in A's slot 1 and B's slot 0) and ids written twice (in both slots 0).
"""
from __future__ import annotations

import pyarrow as pa
import pytest

from eos_job import protocol, sink
from eos_job.contract import BatchRefused
from eos_job.verify import audit_ids
from tests.stack.conftest import sink_and_ledger

pytestmark = pytest.mark.stack

TIMEOUT = 60.0
IDS = range(120)
CUTS = {"a": lambda i: (i // 3) % 2, "b": lambda i: (i // 5) % 2}   # key slots: each spec's own cut


@pytest.fixture
def names(bootstrap):
    yield from sink_and_ledger(bootstrap, "a1")


def _slot(bootstrap: str, names: dict, *, spec: str, slots_from: str, slot: int,
          unsafe: frozenset[str] = frozenset()) -> protocol.SlotCommit:
    cut = (lambda i: i % 2) if slots_from == "sourcePartitions" else CUTS[spec]
    ids = [i for i in IDS if cut(i) == slot]
    rows = pa.RecordBatch.from_pydict({"key": [str(i).encode() for i in ids], "value": [b"%d" % i for i in ids],
                                       protocol.HASH_COL: [i + 1 for i in ids]})
    cfg = sink.SlotWriterConfig(
        bootstrap=bootstrap, producer_config={}, topic=names["out"], dead_letter_topic=None,
        ledger_topic=names["ledger"], tx_prefix=names["prefix"], generation=0, stream_uid=names["uid"],
        checkpoint_id="c", spec_hash=f"spec-{spec}", transaction_timeout_ms=60000, batch=0, slots=2,
        input="batch-0-input", output_hash=f"out-{spec}",
        slot_map=(0, 1) if slots_from == "sourcePartitions" else (), unsafe=unsafe)
    try:
        return sink.write_slot(cfg, slot, 0, iter([rows]))
    finally:
        sink._discard(cfg, slot)


@pytest.mark.parametrize("slots_from,unsafe", [
    ("sourcePartitions", frozenset()),
    ("key", frozenset()),
    ("key", frozenset({"spec-check"})),
], ids=["source-slots-finished", "key-slots-refused", "negative-control-key-slots-without-spec-check"])
def test_a_partial_batch_of_another_spec(bootstrap, names, slots_from, unsafe):
    first = _slot(bootstrap, names, spec="a", slots_from=slots_from, slot=0)      # A commits slot 0, then dies
    assert not first.skipped and first.count > 0
    if slots_from == "key" and not unsafe:
        with pytest.raises(BatchRefused, match="partially committed by another spec.*another sink topic"):
            _slot(bootstrap, names, spec="b", slots_from=slots_from, slot=0)
        out = audit_ids(bootstrap, names["out"], set(IDS), TIMEOUT)
        assert out.records == first.count and not out.duplicates and not out.unexpected, out.violations()
        assert out.missing == [i for i in IDS if CUTS["a"](i) == 1]     # only what A never wrote: lossless, stuck
        return
    b0 = _slot(bootstrap, names, spec="b", slots_from=slots_from, slot=0, unsafe=unsafe)
    b1 = _slot(bootstrap, names, spec="b", slots_from=slots_from, slot=1, unsafe=unsafe)
    assert b0.skipped and not b0.nondeterministic and not b1.skipped       # A's slot kept, not re-judged as B's
    out = audit_ids(bootstrap, names["out"], set(IDS), TIMEOUT)
    if not unsafe:
        assert not out.missing and not out.duplicates and not out.unexpected, out.violations()
        assert out.records == len(IDS)
    else:   # the control: A's slot 0 and B's slot 1 are not the batch
        lost = sorted(i for i in IDS if CUTS["a"](i) == 1 and CUTS["b"](i) == 0)
        twice = sorted(i for i in IDS if CUTS["a"](i) == 0 and CUTS["b"](i) == 1)
        assert lost and twice
        assert out.missing == lost and sorted(out.duplicates) == twice, out.violations()
