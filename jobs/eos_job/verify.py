"""An independent read_committed audit of a sink topic and a stream's ledger.

It reads what downstream consumers would read, and checks the protocol's
invariants: every record exactly once (by the caller's expectations), ledger
batches monotone per slot, and no transaction left open.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

from . import audit, protocol
from .ledger import ledger_consumer


def read_committed(bootstrap: str, topic: str, timeout_s: float = 60.0, extra: dict[str, str] | None = None) -> list:
    """Every committed record of ``topic``, in offset order per partition (``extra``: client security)."""
    c = ledger_consumer(bootstrap, extra)   # read_committed, to each partition's end, committing nothing
    try:
        md = c.list_topics(topic, timeout=timeout_s).topics[topic]
        if md.error is not None:
            raise RuntimeError(f"topic {topic}: {md.error}")
        parts = sorted(md.partitions)
        # OFFSET_BEGINNING: the log start, wherever retention or deleteRecords moved it.
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        pending, out = set(parts), []
        deadline = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic}: partitions {sorted(pending)} did not reach their end "
                                   f"in {timeout_s:.0f}s (an open transaction holds them?)")
            for m in c.consume(1000, timeout=1.0):
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        pending.discard(m.partition())
                        continue
                    raise RuntimeError(f"reading {topic}: {m.error()}")
                out.append(m)
        return out
    finally:
        c.close()


@dataclass
class CountsAudit:
    final: dict[str, int]
    updates: int
    duplicates: list[tuple[str, int]] = field(default_factory=list)
    regressions: list[tuple[str, int, int]] = field(default_factory=list)


def audit_counts(bootstrap: str, topic: str, timeout_s: float = 60.0) -> CountsAudit:
    """For a key → running count topic: the last count per key, and any update seen twice or going back."""
    last: dict[str, int] = {}
    dups, regress, n = [], [], 0
    for m in read_committed(bootstrap, topic, timeout_s):
        rec = json.loads(m.value())
        key, count = m.key().decode(), int(rec["count"])
        n += 1
        if key in last:
            if count == last[key]:
                dups.append((key, count))
            elif count < last[key]:
                regress.append((key, last[key], count))
        last[key] = count
    return CountsAudit(dict(sorted(last.items())), n, dups, regress)


def ledger_monotone(bootstrap: str, ledger_topic: str, timeout_s: float = 60.0) -> list[str]:
    """Problems found: a slot key whose recorded batch did not grow within one ledger partition (a record
    of the same batch is allowed only as a newer driver's epoch stamp)."""
    seen: dict[tuple[int, bytes], tuple[int, int]] = {}
    problems = []
    for m in read_committed(bootstrap, ledger_topic, timeout_s):
        if m.partition() == protocol.BATCH_PARTITION or m.key().endswith(b"/epoch"):   # epoch markers
            continue
        rec = protocol.SlotLedgerRecord.decode(m.value())
        k = (m.partition(), m.key())
        if k in seen:
            batch, epoch = seen[k]
            if rec.batch < batch or (rec.batch == batch and rec.epoch <= epoch):
                problems.append(f"partition {m.partition()} key {m.key().decode()}: batch {rec.batch} (epoch "
                                f"{rec.epoch}) after batch {batch} (epoch {epoch})")
        seen[k] = (rec.batch, rec.epoch)
    return problems


def open_transactions(bootstrap: str, topics: list[str], timeout_s: float = 30.0) -> set[tuple[str, int]]:
    from .clients import closed_admin
    from .resolution import open_transaction_partitions
    with closed_admin({"bootstrap.servers": bootstrap}) as admin:
        md = admin.list_topics(timeout=timeout_s).topics
        return open_transaction_partitions(admin, md, [t for t in topics if t in md], timeout_s)


@dataclass
class IdAudit:
    """A unique-id stream read back: every expected id exactly once, nothing else."""
    records: int
    missing: list[int]
    duplicates: dict[int, int]        # id -> times seen (> 1)
    unexpected: list[str]

    def violations(self) -> list[str]:
        out = []
        if self.missing:
            out.append(f"{len(self.missing)} ids lost (e.g. {self.missing[:8]})")
        if self.duplicates:
            out.append(f"{len(self.duplicates)} ids written more than once (e.g. {list(self.duplicates.items())[:8]})")
        if self.unexpected:
            out.append(f"{len(self.unexpected)} records with keys nobody sent (e.g. {self.unexpected[:8]})")
        return out


def audit_ids(bootstrap: str, topic: str, expected: set[int], timeout_s: float = 60.0) -> IdAudit:
    """Read ``topic`` read_committed (keys are record ids) and compare it, as a set, with ``expected``.

    Unlike final counts per key, nothing hides a loss here: a lost transaction of any batch leaves its ids
    missing, a record written twice shows its id twice."""
    seen: dict[int, int] = {}
    unexpected: list[str] = []
    records = read_committed(bootstrap, topic, timeout_s)
    for m in records:
        key = (m.key() or b"").decode(errors="replace")
        if key.isdigit() and int(key) in expected:
            seen[int(key)] = seen.get(int(key), 0) + 1
        else:
            unexpected.append(key)
    return IdAudit(len(records), sorted(expected - set(seen)), {k: n for k, n in sorted(seen.items()) if n > 1},
                   unexpected)


def audit_sink(bootstrap: str, topics: list[str], ledger_topic: str, *, dead_letter_topic: str | None = None,
               from_batch: int = 0, extra: dict[str, str] | None = None, timeout_s: float = 120.0) -> audit.SlotAudit:
    """Each (slot, batch) the ledger recorded, compared with the records the sink holds for it (read_committed,
    by their ``eos.batch``/``eos.slot`` headers): count, and digest where no record went to dead letters.
    ``topics``: the sink topic and any topic the transformation routes records to."""
    seen: dict[audit.Group, audit.Seen] = {}
    unlabelled = 0
    for topic in topics:
        for m in read_committed(bootstrap, topic, timeout_s, extra):
            group = audit.group_of(m.headers())
            if group is None:
                unlabelled += 1
                continue
            seen.setdefault(group, audit.Seen()).add(topic, m.partition(), m.offset(), m.key(), m.value(), m.headers())
    if dead_letter_topic:
        for m in read_committed(bootstrap, dead_letter_topic, timeout_s, extra):
            group = audit.group_of(m.headers())
            if group is not None:
                seen.setdefault(group, audit.Seen()).dead_letters += 1
    ledger: dict[audit.Group, tuple[int, protocol.SlotLedgerRecord]] = {}
    for m in read_committed(bootstrap, ledger_topic, timeout_s, extra):
        if m.partition() == protocol.BATCH_PARTITION or m.value() is None:
            continue
        try:
            rec = protocol.SlotLedgerRecord.decode(m.value())
        except (ValueError, KeyError, TypeError):
            continue
        group = audit.ledger_group(m.key().decode(errors="replace"), rec)
        if group is not None and (group not in ledger or rec.epoch >= ledger[group][0]):
            ledger[group] = (rec.epoch, rec)   # an epoch stamp of the same batch: the newest driver's
    return audit.compare(seen, {g: r for g, (_, r) in ledger.items()}, from_batch=from_batch, unlabelled=unlabelled)
