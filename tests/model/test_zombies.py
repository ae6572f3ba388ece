"""The lifecycle model with a zombie driver (the model: ``tests/model/lifecycle.py``).

A zombie is the driver given up for dead that keeps running on its own copy of the checkpoint, judging its
batches against the batch history it read at its start. Of the same generation and checkpoint identity as
the new driver, the stamp the new driver puts on their shared slot keys supersedes it. Of another
generation (the new driver started after a parallelism change: other transactional ids, other slot keys)
or of another checkpoint identity (the new driver started stateless) nothing on its own keys does: only
the epoch markers every start writes into every slot partition, and the fence of partition 0's writes
(issue 27, hole 2; on the real stack 24,086 of 54,990 ids written twice). The markers in the slots are
needed on their own: the new generation runs a batch the zombie recorded but whose slots had not committed
(``untouched``), and the zombie's slots come before its next partition-0 write.
"""
from __future__ import annotations

import pytest

from .lifecycle import COMPACTING, ELSEWHERE, SAFE, ZOMBIES, apply, explore, finish
from .test_ledger_faults import compaction_changes_nothing
from .world import World, violation

pytestmark = pytest.mark.unit

STARTS = ("batch", "kill-after-0-slots", "kill-after-1-slot", "kill-before-commit-log", "stateless")
# Fewer operations, more input: the zombies' moves with kills, without snapshots and restores.
ELSEWHERE_LONGER = tuple(op for op in ELSEWHERE if not op.startswith(("snapshot", "restore")))


def run(ops: tuple[str, ...], safeties=SAFE, source: int = 2) -> tuple[str | None, str | None, World]:
    """``ops`` by hand, then the clean finish: (violation, refusal, world after the ops)."""
    w = World(frozenset(safeties), source=source)
    for op in ops:
        apply(w, op)
    done = w.copy()
    refused = finish(done)
    return violation(done, refused), refused, w


def committed_by_the_old_generation_before_the_new_claim(seq: tuple[str, ...]) -> bool:
    """The zombie (split before a rescale) committed a slot of a batch after the rescale and before the new
    generation's driver started (and marked): the shape of every refusal the exploration meets."""
    i = max(j for j, op in enumerate(seq) if op == "rescale")
    after = seq[i + 1:]
    first_start = next((j for j, op in enumerate(after) if op in STARTS), len(after))
    return "split" in seq[:i] and "zombie-slot" in after[:first_start]


def test_a_zombie_driver_interleaved_with_everything_stays_exact():
    checked, found, refusals = explore(SAFE, ops=ZOMBIES)
    print(f"explored {checked} distinct lifecycles with a zombie driver")
    assert checked > 7_000, checked
    assert found == [] and refusals == [], f"{len(found)} violations, e.g. {found[:3]}; refusals {refusals[:3]}"


def test_a_zombie_writes_until_a_newer_driver_stamps_its_epoch_then_stops_without_writing():
    """By hand: the zombie commits a batch of its own while nobody else runs; the new driver re-runs it with
    the zombie's input (skipping every slot); the zombie's next batch meets the newer epoch and stops.
    Without epochs (no stamps, no markers) nothing is lost here either (fence, ledger and input check keep
    the output exact): the epoch is what stops a zombie from fencing back for ever, so the control shows the
    zombie still running."""
    def scenario(safeties):
        w = World(frozenset(safeties), source=2)
        for op in ("batch", "append", "append", "split", "zombie-batch", "batch", "append", "zombie-batch"):
            apply(w, op)
        alive = w.zombie is not None
        finish(w)
        return violation(w), alive, w
    v, alive, w = scenario(SAFE)
    assert v is None and not alive, (v, w)
    assert sorted(w.sink) == list(range(5))
    v, alive, _ = scenario(SAFE - {"epoch"})
    assert v is None and alive


def test_zombies_of_another_generation_or_checkpoint_interleaved_with_everything_stay_exact():
    """With parallelism changes and a stateless start after the split, and the zombie's batches cut into
    planning (input record), single slots and the rest: no id lost or written twice. Some lifecycles end in a
    refusal instead, all of one shape: the zombie committed a slot of a batch after the rescale and before the
    new generation's driver claimed its epoch; its next slot meets the marker and stops, the batch stays
    partial under the old generation, and every start of the new one refuses it (``BatchRefused``; the
    operator's drain is not modelled). An intent none of whose slots committed is run by the new generation
    (``judge_batch(untouched=True)``). A stop, not a duplicate: printed and checked for that shape.
    Compaction may run at any moment, and in every state it would keep the record a reader takes (the fenced
    partition-0 writer; without it: ``test_ledger_faults.py``)."""
    checked, found, refusals = explore(SAFE, ops=COMPACTING, max_ids=4, invariant=compaction_changes_nothing)
    print(f"explored {checked} distinct lifecycles with zombies of another generation or checkpoint; "
          f"{len(refusals)} end in a refusal, e.g. {' → '.join(min((s for s, _ in refusals), key=len))}")
    assert checked > 10_000, checked
    assert found == [], f"{len(found)} violations, e.g. {found[:3]}"
    other = [(seq, why) for seq, why in refusals if "partially committed under generation" not in why
             or not committed_by_the_old_generation_before_the_new_claim(seq)]
    assert other == [], other[:3]


def test_zombies_of_another_generation_or_checkpoint_with_more_input_stay_exact():
    """Up to 6 ids, without snapshots and restores: longer runs of the zombie against the new driver."""
    checked, found, refusals = explore(SAFE, ops=ELSEWHERE_LONGER, max_ids=6)
    print(f"explored {checked} distinct lifecycles with zombies of another generation or checkpoint, up to 6 ids "
          f"(no snapshots); {len(refusals)} end in a refusal")
    assert checked > 25_000, checked
    assert found == [], f"{len(found)} violations, e.g. {found[:3]}"
    assert all(committed_by_the_old_generation_before_the_new_claim(seq) for seq, _ in refusals), refusals[:3]


def test_negative_control_without_the_stream_epoch_a_zombie_of_another_generation_or_checkpoint_duplicates():
    """The hole: with the markers unread and partition 0 unfenced, the zombie's own keys carry no newer
    stamp, its stale history has no record of what the new driver wrote, and it writes ids the new driver
    wrote too. Only zombies of another generation or checkpoint: the same generation on the same checkpoint
    is still stopped by the stamp."""
    checked, found, _ = explore(SAFE - {"stream-epoch"}, ops=ELSEWHERE, max_ids=4, depth=8)
    twice = sorted((seq for seq, v in found if v.startswith("written twice")), key=len)
    assert twice, f"no duplicate found in {checked} lifecycles"
    assert len(twice) == len(found), found[:3]

    def elsewhere(seq, op):      # ``op`` after a split
        return "split" in seq and op in seq[seq.index("split"):]
    assert all(elsewhere(seq, "rescale") or elsewhere(seq, "stateless") for seq in twice), twice[:3]
    generation = [seq for seq in twice if elsewhere(seq, "rescale") and "stateless" not in seq]
    checkpoint = [seq for seq in twice if elsewhere(seq, "stateless") and "rescale" not in seq]
    assert generation and checkpoint
    print(f"{len(twice)} of {checked} lifecycles write ids twice; the shortest with a zombie of another "
          f"generation: {' → '.join(generation[0])}; of another checkpoint: {' → '.join(checkpoint[0])}")


def test_the_zombie_of_the_old_generation_stops_before_writing_what_the_new_one_wrote():
    """Issue 27, hole 2, by hand: batch 0 committed; the driver is given up for dead and keeps running
    (generation 0, two slots); the new driver starts after a parallelism change (generation 1, three
    slots) and writes batch 1; the zombie runs batch 1 from its own checkpoint."""
    ops = ("append", "batch", "split", "rescale", "batch", "zombie-batch")
    v, refused, w = run(ops)
    assert (v, refused, w.zombie) == (None, None, None), (v, refused, w)
    v, refused, w = run(ops, SAFE - {"stream-epoch"})
    assert v == "written twice [2]" and w.zombie is not None, (v, w)
    assert sorted(w.sink) == [0, 1, 2, 2]


def test_the_zombie_of_the_old_checkpoint_stops_after_a_stateless_start():
    ops = ("batch", "split", "stateless", "append", "append", "zombie-batch", "batch")
    v, refused, w = run(ops)
    assert (v, refused, w.zombie) == (None, None, None), (v, refused, w)
    v, _, w = run(ops, SAFE - {"stream-epoch"})
    assert v == "written twice [2, 3]" and w.zombie is not None, (v, w)


def test_a_zombie_mid_batch_meets_the_marker_in_its_slots():
    """The zombie recorded batch 1's input (generation 0) before the new driver's claim and runs its slots
    after it. No slot of generation 0 holds batch 1, so the new driver runs it; the zombie's own slot keys
    carry no newer stamp and its partition-0 watch comes only after its slots: the marker in their
    partitions is what stops them."""
    ops = ("append", "batch", "split", "rescale", "zombie-plan", "batch", "zombie-batch")
    v, refused, w = run(ops)
    assert (v, refused, w.zombie) == (None, None, None) and sorted(w.sink) == [0, 1, 2], (v, refused, w)
    v, refused, w = run(ops, SAFE - {"stream-epoch"})
    assert v == "written twice [2]" and sorted(w.sink) == [0, 1, 2, 2], (v, w)


def test_a_batch_the_zombie_partly_committed_before_the_new_claim_is_refused_by_the_new_generation():
    """The zombie commits slot 0 of batch 1 (id 2) between the rescale and the new driver's claim; its slot
    1 then meets the marker. Batch 1 stays partial under generation 0 and generation 1 refuses it: nothing
    twice, but the stream stops. Without the markers the zombie finishes the batch and the new driver skips
    it as complete under generation 0."""
    ops = ("append", "batch", "split", "rescale", "zombie-plan", "zombie-slot", "batch", "zombie-batch")
    v, refused, w = run(ops)
    assert v is None and w.zombie is None and sorted(w.sink) == [0, 1, 2], (v, w)
    assert "partially committed under generation 0" in refused
    v, refused, w = run(ops, SAFE - {"stream-epoch"})
    assert (v, refused) == (None, None) and sorted(w.sink) == [0, 1, 2]
