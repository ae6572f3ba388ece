"""A batch is its input, not its number: the slot and driver checks, the catch-up plan, the offset files."""
import pytest

from eos_job import checkpoint, protocol
from eos_job.protocol import BatchHistoryRecord, SlotAction, SlotLedgerRecord, decide_slot, judge_batch

pytestmark = pytest.mark.unit

A = {"events": {"0": [10, 20], "1": [5, 9]}}
B = {"events": {"0": [10, 31], "1": [5, 9]}}     # same batch number, planned later: another range


def slot_rec(batch, input="", output_hash=""):
    return SlotLedgerRecord(batch=batch, count=3, digest=9, input=input, output_hash=output_hash)


def hist(batch, input=A, generation=0, complete=True, output_hash="o1", offset_log="v1\n{}\n{}\n"):
    return BatchHistoryRecord(batch, generation, 2, input, offset_log, output_hash, complete)


def test_a_slot_skips_only_the_input_it_committed():
    a, b = protocol.input_digest(A), protocol.input_digest(B)
    assert a != b
    assert decide_slot(5, slot_rec(5, a), input=a).action is SlotAction.SKIP
    refused = decide_slot(5, slot_rec(5, a), input=b)
    assert refused.action is SlotAction.REPLAN and a in refused.reason and b in refused.reason
    # Records written before batch identity existed carry no input: the number is all there is.
    assert decide_slot(5, slot_rec(5), input=b).action is SlotAction.SKIP
    # A later batch recorded: the driver has checked this batch against the ledger's history.
    assert decide_slot(5, slot_rec(9, a), input=b).action is SlotAction.SKIP
    assert decide_slot(6, slot_rec(5, a), input=b).action is SlotAction.WRITE


def test_a_slot_refuses_to_finish_another_specs_batch():
    d = decide_slot(5, slot_rec(5, "x", "old"), input="x", output_hash="new")
    assert d.action is SlotAction.REFUSE and "drain" in d.reason
    assert "another sink topic" in d.reason and "sourcePartitions" in d.reason   # the ways out, named
    assert decide_slot(5, slot_rec(5, "x", "old"), input="x", output_hash="old").action is SlotAction.SKIP


def test_with_slots_fixed_by_the_input_another_spec_finishes_a_partial_batch():
    """Amendment A1: a source-partition slot another spec committed holds the records this slot would write."""
    d = decide_slot(5, slot_rec(5, "x", "old"), input="x", output_hash="new", input_slots=True)
    assert d.action is SlotAction.SKIP and "another spec" in d.reason
    assert decide_slot(5, slot_rec(4, "w", "old"), input="x", output_hash="new",
                       input_slots=True).action is SlotAction.WRITE             # not committed: this spec writes
    # The input is checked first: another input is never skipped, whatever the slots.
    assert decide_slot(5, slot_rec(5, "y", "old"), input="x", output_hash="new",
                       input_slots=True).action is SlotAction.REPLAN
    v = judge_batch(5, A, hist(5, complete=False, output_hash="o0"), 0, "o1", input_slots=True)
    assert v.action == "run" and "sourcePartitions" in v.reason
    # Another generation (another slot count or derivation) is still refused: its slots are other records.
    v = judge_batch(5, A, hist(5, generation=1, complete=False, output_hash="o0"), 2, "o1", input_slots=True)
    assert v.action == "refuse" and "generation 1" in v.reason
    assert judge_batch(5, B, hist(5, complete=False, output_hash="o0"), 0, "o1", input_slots=True).action == "replan"


def test_same_input_compares_ends_and_known_starts():
    assert protocol.same_input(A, A)
    assert not protocol.same_input(A, B)
    unknown_start = {"events": {"0": [None, 20], "1": [None, 9]}}
    assert protocol.same_input(A, unknown_start)
    assert not protocol.same_input(A, {"events": {"0": [11, 20], "1": [5, 9]}})
    assert not protocol.same_input(A, {"events": {"0": [10, 20]}})
    assert not protocol.same_input(A, {"other": A["events"]})


@pytest.mark.parametrize("recorded,generation,output_hash,action,words", [
    (None, 0, "o1", "run", "no record"),
    (hist(5), 0, "o1", "run", "same input"),
    (hist(5, input=B), 0, "o1", "replan", "events[0] 10..20"),
    (hist(5, generation=1), 2, "o1", "skip", "complete"),
    (hist(5, generation=1, complete=False), 2, "o1", "refuse", "partially committed under generation 1"),
    (hist(5, complete=False, output_hash="o0"), 0, "o1", "refuse", "another spec"),
    (hist(5, complete=True, output_hash="o0"), 0, "o1", "skip", "complete in the sink (written by another spec"),
])
def test_the_driver_judges_a_batch_by_its_input(recorded, generation, output_hash, action, words):
    v = judge_batch(5, A, recorded, generation, output_hash)
    assert v.action == action and words in v.reason, v
    if action == "replan":
        assert "events[0] 10..31" in v.reason   # both ranges named


def test_an_intent_none_of_whose_slots_committed_runs_under_this_spec():
    """Another generation's (or spec's) record of the batch, incomplete, with no slot of it committed (its
    driver superseded before its first slot commit): not partial, so not refused."""
    for recorded, generation in ((hist(5, generation=1, complete=False), 2),
                                 (hist(5, complete=False, output_hash="o0"), 0)):
        assert judge_batch(5, A, recorded, generation, "o1").action == "refuse"
        v = judge_batch(5, A, recorded, generation, "o1", untouched=True)
        assert v.action == "run" and "none of whose slots committed" in v.reason
    assert judge_batch(5, B, hist(5, complete=False), 0, "o1", untouched=True).action == "replan"   # input first


def test_catch_up_re_runs_what_the_ledger_holds_beyond_the_checkpoint():
    history = {n: hist(n) for n in range(3, 8)}
    assert protocol.catch_up(4, history) == ([5, 6, 7], None)
    assert protocol.catch_up(7, history) == ([], None)
    assert protocol.catch_up(9, history) == ([], None)
    assert protocol.catch_up(None, {n: hist(n) for n in range(0, 2)}) == ([0, 1], None)
    batches, error = protocol.catch_up(1, history)      # batch 2's record is gone (tombstoned)
    assert batches == [] and "batch(es) [2]" in error and "replayOffsetsFrom" in error
    batches, error = protocol.catch_up(4, {**history, 6: hist(6, offset_log="")})
    assert batches == [] and "[6]" in error


def test_history_records_round_trip_and_old_slot_records_decode():
    r = hist(4, complete=False)
    assert BatchHistoryRecord.decode(r.encode()) == r
    assert b'"kind": "input"' in r.encode()
    old = b'{"batch": 3, "count": 1, "dead_letters": 0, "digest": "00000000000000ff", "spec_hash": "s"}'
    assert SlotLedgerRecord.decode(old) == SlotLedgerRecord(3, 1, 255, 0, "s")
    keys = {protocol.history_key("u", "c", n) for n in range(3)}
    assert all(k.startswith(protocol.history_prefix("u", "c")) for k in keys) and len(keys) == 3


def _log(ckpt, n, offsets: dict, ts=1):
    import json
    (ckpt / "offsets").mkdir(parents=True, exist_ok=True)
    (ckpt / "offsets" / str(n)).write_text(f'v1\n{{"batchTimestampMs":{ts}}}\n{json.dumps(offsets)}\n')


def test_batch_input_from_the_checkpoint(tmp_path):
    (tmp_path / "sources" / "0").mkdir(parents=True)
    (tmp_path / "sources" / "0" / "0").write_bytes(b'\x00v1\n{"events":{"0":0,"1":0}}')
    _log(tmp_path, 0, {"events": {"0": 4, "1": 2}})
    _log(tmp_path, 1, {"events": {"0": 9, "1": 2}})
    assert checkpoint.batch_input(tmp_path, 0) == {"events": {"0": [0, 4], "1": [0, 2]}}
    assert checkpoint.batch_input(tmp_path, 1) == {"events": {"0": [4, 9], "1": [2, 2]}}
    (tmp_path / "offsets" / "0").unlink()   # purged by Spark: the start is unknown, the end still counts
    assert checkpoint.batch_input(tmp_path, 1) == {"events": {"0": [None, 9], "1": [None, 2]}}


def test_an_offset_log_from_the_ledger_replaces_the_planned_one(tmp_path):
    _log(tmp_path, 3, {"events": {"0": 99}})
    (tmp_path / "offsets" / ".3.crc").write_bytes(b"crc of the planned file")
    recorded = 'v1\n{"batchTimestampMs":7}\n{"events":{"0":42}}\n'
    checkpoint.write_offset_log(tmp_path, 3, recorded)
    assert checkpoint.offset_log_text(tmp_path, 3) == recorded
    assert not (tmp_path / "offsets" / ".3.crc").exists()    # Hadoop would refuse a mismatching checksum
    assert [p.name for p in (tmp_path / "offsets").iterdir()] == ["3"]
    assert checkpoint.replay_batch(tmp_path) == 3


def test_a_slot_of_a_superseded_driver_stops_instead_of_fencing_again():
    newer = SlotLedgerRecord(batch=4, count=1, digest=1, epoch=6)
    d = decide_slot(5, newer, epoch=5)
    assert d.action is SlotAction.SUPERSEDED and "epoch 6" in d.reason
    assert decide_slot(5, newer, epoch=6).action is SlotAction.WRITE
    assert decide_slot(4, newer, epoch=7).action is SlotAction.SKIP
    stamped_empty = SlotLedgerRecord(batch=-1, count=0, digest=0, epoch=6)   # a stamp on a slot never written
    assert decide_slot(0, stamped_empty, epoch=6).action is SlotAction.WRITE


def test_a_slot_that_met_a_newer_epoch_marker_stops_whatever_its_own_key_says():
    """A driver of another generation or checkpoint marked the slot's partition: the slot's own record (or
    none) says nothing of it."""
    own = SlotLedgerRecord(batch=4, count=1, digest=1, epoch=5)
    for recorded in (own, None):
        d = decide_slot(5, recorded, epoch=5, stream_epoch=7)
        assert d.action is SlotAction.SUPERSEDED and "epoch 7" in d.reason
    assert decide_slot(5, own, epoch=5, stream_epoch=5).action is SlotAction.WRITE    # its own marker
    assert decide_slot(5, own, epoch=7, stream_epoch=5).action is SlotAction.WRITE    # an older driver's


def test_the_newer_drivers_history_record_wins_over_a_late_write_of_an_older_one():
    late_zombie = BatchHistoryRecord(9, 0, 2, B, "z", epoch=4)     # written last, by the superseded driver
    newer = BatchHistoryRecord(9, 0, 2, A, "n", complete=True, epoch=5)
    same_epoch_newest = BatchHistoryRecord(9, 0, 2, A, "m", epoch=5)
    assert protocol.newest_history([late_zombie.encode(), newer.encode()]) == newer
    assert protocol.newest_history([same_epoch_newest.encode(), newer.encode()]) == same_epoch_newest


def test_a_re_created_stream_continues_the_ledgers_generations():
    from eos_job.protocol import GenerationHistory, effective_generation
    empty = GenerationHistory()
    assert effective_generation(0, 2, empty) == 0
    h = empty.with_generation(0, 2, 0).with_generation(1, 3, 40).with_generation(2, 2, 90)
    assert h.with_generation(1, 9, 99) == h                  # a generation is recorded once
    assert GenerationHistory.decode(h.encode()) == h and h.slots_of() == {0: 2, 1: 3, 2: 2}
    assert effective_generation(0, 2, h) == 2                # re-created, same slots: continue the latest
    assert effective_generation(0, 3, h) == 3                # other slots: above every generation that wrote
    assert effective_generation(2, 2, h) == 2
    assert effective_generation(5, 4, h) == 5                # the operator's is newer: it wins
    assert GenerationHistory.decode(None) == empty


def test_a_committed_batch_the_ledger_records_as_another_input_is_named_with_both_ranges():
    assert protocol.committed_mismatch(5, A, hist(5, input=A)) is None
    assert protocol.committed_mismatch(5, A, None) is None
    # The checkpoint may not know where batch 0 started; equal ends with unknown starts are the same input.
    assert protocol.committed_mismatch(5, {"events": {"0": [None, 20], "1": [None, 9]}}, hist(5, input=A)) is None
    problem = protocol.committed_mismatch(5, B, hist(5, input=A))
    assert "committed batch 5 covers events[0] 10..31" in problem and "events[0] 10..20" in problem
    assert "offsets/5" in problem and "Restore a snapshot" in problem


def test_a_partial_batch_is_finished_under_the_generation_whose_slot_layout_the_spec_has():
    """``BatchWriter._resume_generation``: the first incomplete batch, touched, of another generation with this
    spec's slot count and derivation switches the driver to that generation; any other layout does not."""
    from eos_job import writer as writer_module

    def writer(slots: int, touched: bool):
        w = writer_module.BatchWriter.__new__(writer_module.BatchWriter)
        w.__dict__.update(slots=slots, slots_from="key", base={"generation": 2},
                          _generations=protocol.GenerationHistory([[0, 2, 0], [1, 3, 5], [2, slots, 5]]),
                          history={4: hist(4), 5: hist(5, generation=0, complete=False)})
        w._untouched = lambda rec, ckpt_id, batch: not touched
        return w

    same = writer(2, touched=True)
    same._resume_generation("c", 4)
    assert same.base["generation"] == 0                        # finished under generation 0, which started it
    for other in (writer(3, touched=True), writer(2, touched=False)):
        other._resume_generation("c", 4)
        assert other.base["generation"] == 2                   # another layout refuses; untouched just runs
