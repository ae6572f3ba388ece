"""The invariants every exactly-once test checks, read back with read_committed consumers."""
from __future__ import annotations

from eos_job.verify import audit_counts, audit_sink, ledger_monotone, open_transactions


def assert_exactly_once(bootstrap: str, counts_topic: str, ledger_topic: str, expected: dict[str, int],
                        other_topics: tuple[str, ...] = ()) -> None:
    """``other_topics``: the stream's dead-letter topic(s)."""
    audit = audit_counts(bootstrap, counts_topic)
    assert audit.final == expected, f"final counts {audit.final} != expected {expected}"
    assert audit.duplicates == [], f"count updates emitted twice: {audit.duplicates[:5]}"
    assert audit.regressions == [], f"counts went backwards: {audit.regressions[:5]}"
    assert ledger_monotone(bootstrap, ledger_topic) == []
    assert open_transactions(bootstrap, [counts_topic, ledger_topic, *other_topics]) == set()
    assert_slots_exact(bootstrap, [counts_topic], ledger_topic, other_topics)


def assert_slots_exact(bootstrap: str, topics: list[str], ledger_topic: str, dead_letter_topics=(),
                       extra: dict[str, str] | None = None):
    """The sink audit (``kubectl eos verify``): each (slot, batch) of the ledger is in the sink once, by count
    and digest. Every record is labelled, and at least one slot was compared by digest."""
    dlq = dead_letter_topics[0] if dead_letter_topics else None
    slots = audit_sink(bootstrap, topics, ledger_topic, dead_letter_topic=dlq, extra=extra)
    assert slots.exact, "\n".join([slots.summary(), *(f.describe() for f in slots.findings[:10])])
    assert slots.unlabelled == 0 and slots.slots_checked > 0 and slots.digests_checked > 0, slots.summary()
    return slots
