"""The invariants every exactly-once test checks, read back with read_committed consumers."""
from __future__ import annotations

from eos_job.verify import audit_counts, ledger_monotone, open_transactions


def assert_exactly_once(bootstrap: str, counts_topic: str, ledger_topic: str, expected: dict[str, int],
                        other_topics: tuple[str, ...] = ()) -> None:
    audit = audit_counts(bootstrap, counts_topic)
    assert audit.final == expected, f"final counts {audit.final} != expected {expected}"
    assert audit.duplicates == [], f"count updates emitted twice: {audit.duplicates[:5]}"
    assert audit.regressions == [], f"counts went backwards: {audit.regressions[:5]}"
    assert ledger_monotone(bootstrap, ledger_topic) == []
    assert open_transactions(bootstrap, [counts_topic, ledger_topic, *other_topics]) == set()
