"""Protocol amendment A2 in the lifecycle model of held producers (``tests/model/held_producers.py``): a clean
held producer decides on its own last ledger record with no fence and no read; any failure discards it."""
from __future__ import annotations

import pytest

from .held_producers import SAFE, Explorer

pytestmark = pytest.mark.unit


def test_with_the_rule_every_lifecycle_writes_each_id_once_and_trusted_tasks_happen():
    """Two workers, one slot, three batches; hits and misses, fences by the other worker between a held
    producer's commits, zombie attempts, one fault (an outcome lost, a kill before or during a commit)."""
    checked, found, trusted = Explorer(SAFE, slots=1, workers=2, batches=3, depth=14, max_faults=1).explore()
    print(f"explored {checked} distinct states; up to {trusted} trusted decisions on one path")
    assert found == [], found[:3]
    assert trusted >= 2, "no lifecycle trusted a held producer: the rule is not exercised"
    assert checked > 1_000, checked


def test_with_the_rule_two_slots_and_two_faults_stay_exact():
    checked, found, _ = Explorer(SAFE, slots=2, workers=2, batches=2, depth=12, max_faults=2).explore()
    print(f"explored {checked} distinct states with two slots and two faults")
    assert found == [] and checked > 1_000, (checked, found[:3])


def test_negative_control_held_clean_off_the_model_finds_a_duplicate():
    """Trusting a held producer after an unknown commit: batch N applied, its outcome lost, the retry of N
    through the same producer (still the id's owner: nobody fenced) commits N again."""
    checked, found, _ = Explorer(SAFE - {"held-clean"}, slots=1, workers=2, batches=3, depth=10).explore()
    assert found, f"no violation in {checked} states"
    assert all(v.startswith("written twice") for _, v in found), found[:3]
    shortest = min((p for p, _ in found), key=len)
    print("shortest duplicate with held-clean off:", " → ".join(shortest))
    assert len(shortest) == 4 and shortest[1].startswith(("commit-outcome-lost", "kill-during-commit")), shortest


def test_negative_control_a_fenced_producers_failed_commit_taken_as_success_loses_a_batch():
    """A producer trusted after another worker fenced it, whose refused commit is taken as success (the
    contract's "never as success" off): the batch is reported written and was never committed."""
    unsafe = SAFE - {"never-as-success"}
    checked, found, _ = Explorer(unsafe, slots=1, workers=2, batches=2, depth=10, max_faults=0).explore()
    assert found and all(v.startswith("lost") for _, v in found), (checked, found[:3])
    shortest = min((p for p, _ in found), key=len)
    print("shortest loss with a refused commit taken as success:", " → ".join(shortest))
    # The other worker's fence comes between the held producer's commit and its trusted next one.
    assert any(op.endswith("@w1") for op in shortest) and any(op.endswith("@w0") for op in shortest), shortest
