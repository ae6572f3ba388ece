"""The lifecycle model with a ledger that fails as a store: it forgets its last records, or compaction keeps
the last record written per key (the model: ``tests/model/lifecycle.py``; issue 27, hole 3).

A ledger that forgets acknowledged records is one less durable than the runtime's start check asks
(``eos_job.ledger_topic.ledger_durability``: replication factor at least the sink's, ``min.insync.replicas`` 2 where
it is 3, unclean leader election off; the check itself is tested on the broker in
``tests/e2e/test_ledger_guards.py`` and ``tests/jobs/test_ledger_topic.py``). With that check the model grants
no loss (``ledger-durable``); without it, it finds the duplicates a forgotten slot record or epoch causes.
Compaction keeps the last record written per key, not the one a reader takes (``protocol.newest_history``: the
newest of the highest epoch): the two are the same only because a superseded driver's partition-0 writes fail
(the fenced ``<prefix>-driver`` writer). The model checks that in every state it reaches, and shows what
compaction does without the fence: the exploration with the fence is ``test_zombies.py``'s of zombies of
another generation or checkpoint, which compacts at any moment and checks ``compaction_changes_nothing`` in
every state."""
from __future__ import annotations

import pytest

from .lifecycle import COMPACTING, ELSEWHERE, FORGETTING, SAFE, explore
from .world import World

pytestmark = pytest.mark.unit


def compaction_changes_nothing(w: World) -> str | None:
    if w.written == w.history:
        return None
    changed = sorted(k for k, r in w.written.items() if w.history.get(k) != r)
    return f"compaction would keep another record than a reader takes for {changed}"


def test_negative_control_without_the_driver_fence_compaction_keeps_a_zombies_record_and_wedges_or_duplicates():
    """Without the fence (the start's one look at partition 0 only), a zombie's late input record lands
    after a newer driver's. A reader still takes the newer one (no violation without compaction), but
    compaction keeps the zombie's: the next start re-runs the batch with the zombie's input and is re-planned
    for ever (stuck), or skips and rewrites by the wrong record (duplicates)."""
    unsafe = SAFE - {"driver-fence"}
    checked, found, _ = explore(unsafe, ops=ELSEWHERE, max_ids=4, depth=8)
    assert found == [], f"without compaction the reader's epoch rule keeps {checked} lifecycles exact: {found[:3]}"
    _, late, _ = explore(unsafe, ops=ELSEWHERE, max_ids=4, depth=8, invariant=compaction_changes_nothing)
    assert late, "the zombie never wrote after a newer driver: the control does not reach the fence's case"
    checked, found, _ = explore(unsafe, ops=COMPACTING, max_ids=4, depth=8)
    kinds = {v.split(" ")[0] for _, v in found}
    assert kinds == {"stuck:", "written"}, f"{checked} lifecycles, found {found[:3]}"
    assert all("split" in seq and "compact" in seq for seq, _ in found), found[:3]
    for kind in sorted(kinds):
        print(f"shortest {kind.rstrip(':')} with compaction and no fence:",
              " → ".join(min((s for s, v in found if v.startswith(kind)), key=len)))


def test_with_a_durable_ledger_the_model_grants_no_loss_and_every_lifecycle_stays_exact():
    checked, found, refusals = explore(SAFE, ops=FORGETTING, max_ids=4)
    assert checked > 3_000 and found == [] and refusals == [], (checked, found[:3], refusals[:3])
    w = World(SAFE, source=2, forgetful=True)
    w.before_last = w.ledger_state()
    assert not w.forget()


def test_negative_control_a_ledger_that_forgets_its_last_records_writes_ids_twice():
    """A slot's commit record lost after its transaction committed: the re-run batch writes the slot again
    (the shortest: killed after one slot, then the loss). Also through restores that replay the previous
    checkpoint and rescales: every violation is a duplicate, and each needs the loss."""
    checked, found, _ = explore(SAFE - {"ledger-durable"}, ops=FORGETTING, max_ids=4, depth=5)
    assert found, f"no violation in {checked} lifecycles"
    assert all(v.startswith("written twice") and "ledger-forgets" in seq for seq, v in found), found[:3]
    shortest = min((s for s, _ in found), key=len)
    assert shortest == ("kill-after-1-slot", "ledger-forgets"), shortest
    print(f"{len(found)} of {checked} lifecycles write ids twice; shortest: {' → '.join(shortest)}")


def test_negative_control_a_ledger_that_forgets_a_start_lets_a_zombie_write_what_the_new_driver_wrote():
    """The epoch goes backwards: the new driver's start (its epoch, its markers) and its batch are lost with
    the ledger's last records, and the zombie, no longer superseded, writes what the new driver wrote."""
    checked, found, _ = explore(SAFE - {"ledger-durable"}, ops=(*ELSEWHERE, "ledger-forgets"), max_ids=4, depth=7)

    def zombie_writes_after_the_loss(seq: tuple[str, ...]) -> bool:
        if "split" not in seq or "ledger-forgets" not in seq[seq.index("split"):]:
            return False
        lost = seq.index("ledger-forgets")
        return any(op.startswith("zombie-") for op in seq[lost + 1:])
    twice = sorted((s for s, v in found if v.startswith("written twice") and zombie_writes_after_the_loss(s)),
                   key=len)
    assert twice, f"no zombie duplicate after a loss in {checked} lifecycles"
    print("shortest zombie duplicate after the ledger forgot a start:", " → ".join(twice[0]))
