"""The lifecycle model with upgrades, broken upgrades that commit part of a batch, and the operator's rollback
(the model: ``tests/model/lifecycle.py``; issue 27, "rollbacks over partial batches"; protocol amendment A1).

Two specs, A and B, with their own output hashes (what ``judge_batch`` and ``decide_slot`` compare). Under key
slots (``job.slotsFrom: key``) B cuts the same ids into slots otherwise (A: id % 2, B: (id + 1) % 2); under
source slots (``sourcePartitions``) a slot is its source partition under every spec. "upgrade" runs the other
spec at a clean boundary from a snapshot of the checkpoint (same generation, same slot count); "broken-batch"
is that spec committing one slot of a batch and failing in the next, on every start; "rollback" is the
operator's: the previous spec from the upgrade's snapshot in a new checkpoint location, replaying the broken
run's checkpoint (``replayOffsetsFrom``), judged against the ledger's history. The finish of a lifecycle left
broken rolls back first (``upgradeReadinessTimeoutSeconds``).

What the model shows (exhaustively, up to 6 ids and 2 ids per batch; counts printed by each test, and as run
when this was written): with source slots 4,455 lifecycles, all exact, none refused, the rollback finishing
batches the broken spec left partial; with key slots 4,387 lifecycles, all exact or refused (207, each by
another spec's partial batch, nothing written twice and nothing lost before the refused batch); with
``spec-check`` off, key slots finished by another spec lose and duplicate ids (1,622 of 5,802)."""
from __future__ import annotations

import re

import pytest

from .lifecycle import SAFE, apply, explore, finish
from .world import SPEC_HASHES, World, history_of, violation

pytestmark = pytest.mark.unit

UPGRADING = ("append", "batch", "kill-after-0-slots", "kill-after-1-slot", "kill-before-commit-log", "upgrade",
             "broken-batch", "rollback")
SOURCE = SAFE | {"slot-order"}
ANOTHER_SPEC = re.compile(r"^batch (\d+) is partially committed by another spec \(output hash (\w+), now (\w+)\)")


def partial_of_another_spec(w: World) -> int | None:
    """A batch of the ledger's history that another spec than the running one left partial (a slot of it
    committed under that spec's hash, the batch not complete), or None."""
    running = SPEC_HASHES[w.spec]
    for n, r in history_of(w, w.ckpt.ident).items():
        if not r.complete and r.output_hash != running and any(
                s.batch == n and s.output_hash == r.output_hash for (i, g, _), s in w.slots.items()
                if i == w.ckpt.ident and g == w.generation):
            return n
    return None


def run(ops: tuple[str, ...], safeties=SAFE, slots_from: str = "key") -> tuple[str | None, str | None, World]:
    """``ops`` by hand from the explorations' initial state, then the finish: (violation, refusal, world)."""
    w = World(frozenset(safeties), source=2, slots_from=slots_from)
    for op in ops:
        apply(w, op)
    refused = finish(w)
    return violation(w, refused), refused, w


def test_source_slots_rollbacks_finish_the_broken_upgrades_partial_batches_exactly():
    reached = []

    def note(w: World) -> None:
        if partial_of_another_spec(w) is not None:
            reached.append(w.spec)
    checked, found, refusals = explore(SOURCE, ops=UPGRADING, slots_from="sourcePartitions",
                                       invariant=note)
    print(f"explored {checked} distinct lifecycles with upgrades, broken batches and rollbacks (source slots); "
          f"{reached.count('A')} states run A and {reached.count('B')} run B over a batch the other spec left partial")
    assert checked > 4_000, checked
    assert reached.count("A") > 10 and reached.count("B") > 10, reached     # both ways round: not vacuous
    assert found == [] and refusals == [], f"{len(found)} violations, e.g. {found[:3]}; refusals {refusals[:3]}"


def test_key_slots_every_lifecycle_is_exact_or_refused_for_another_specs_partial_batch():
    checked, found, refusals = explore(SAFE, ops=UPGRADING)
    print(f"explored {checked} distinct lifecycles with upgrades, broken batches and rollbacks (key slots); "
          f"{len(refusals)} end refused by another spec's partial batch; shortest: "
          f"{' → '.join(min((s for s, _ in refusals), key=len))}")
    assert checked > 4_000, checked
    assert found == [], f"{len(found)} violations, e.g. {found[:3]}"
    assert len(refusals) > 100, refusals[:3]
    for seq, reason in refusals:
        m = ANOTHER_SPEC.match(reason)
        assert m and m.group(2) != m.group(3), (seq, reason)
        v, refused, w = run(seq)
        assert v is None and refused == reason, (seq, v, refused)
        begin, end = w.ckpt.offset(int(m.group(1)))
        # Before the refused batch every id once; of it only the other spec's committed slots; nothing after.
        assert sorted(i for i in w.sink if i < begin) == list(range(begin)), (seq, w.sink)
        assert all(begin <= i < end for i in w.sink if i >= begin), (seq, w.sink)
        # The same lifecycle with source slots goes on, exactly once (amendment A1).
        assert run(seq, SOURCE, "sourcePartitions")[:2] == (None, None), seq


def test_a_broken_upgrade_then_the_rollback_by_hand():
    """The first batch: B commits slot 0 and fails; the rollback replays batch 0 under A. Source slots: A
    skips slot 0 (B's record stays, hash p) and writes slot 1. Key slots: refused, the sink holds B's slot 0
    only (id 1: (1 + 1) % 2 = 0). Key slots with spec-check off: A skips slot 0, which held id 0 under A, and
    writes its slot 1, id 1, again."""
    ops = ("upgrade", "broken-batch")
    v, refused, w = run(ops, SOURCE, "sourcePartitions")
    assert (v, refused) == (None, None)
    assert {s: (r.batch, r.output_hash) for (_, _, s), r in w.slots.items()} == {0: (0, "p"), 1: (0, "o")}
    assert w.history[("c0", 0)].complete and w.history[("c0", 0)].output_hash == "o"
    v, refused, w = run(ops)
    assert v is None and ANOTHER_SPEC.match(refused) and w.sink == [1], (v, refused, w.sink)
    v, refused, w = run(ops, SAFE - {"spec-check"})
    assert refused is None and v == "lost [0]" and sorted(w.sink) == [1, 1], (v, w.sink)


def test_negative_control_key_slots_finished_by_another_spec_lose_and_duplicate_ids():
    checked, found, refusals = explore(SAFE - {"spec-check"}, ops=UPGRADING)
    kinds = {v.split(" ")[0] for _, v in found}
    assert kinds == {"lost", "written"}, f"{checked} lifecycles, found {found[:3]}"
    assert refusals == [] and all("upgrade" in seq for seq, _ in found), (refusals[:3], found[:3])
    print(f"{len(found)} of {checked} lifecycles lose or duplicate ids with spec-check off")
    for kind in sorted(kinds):
        print(f"shortest {kind} with key slots finished by another spec:",
              " → ".join(min((s for s, v in found if v.startswith(kind)), key=len)))
