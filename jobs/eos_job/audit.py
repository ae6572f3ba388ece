"""The sink audit's pure pieces: the headers every output record carries, Spark's record hash recomputed
outside Spark, and the comparison of what the sink holds with what the ledger says each slot committed.

Every record a slot writes (to the sink, a routed topic or the dead-letter topic) carries two headers:
``eos.batch`` (the batch number) and ``eos.slot`` (``<checkpoint id, 8 chars>/<generation>/<slot>``, the
ledger's slot key without the stream). The ledger's slot record of that batch holds the slot's record
count and digest (the sum of Spark's ``xxhash64`` of each record's key, value and the optional
topic/headers columns), written in the same transaction as the records. So a read_committed reader can
check, per (slot, batch), that the sink holds each committed record once: a doubled slot shows twice the
count, a lost one less, a swapped record another digest. The Kafka reading is ``eos_job.verify.audit_sink``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import xxhash

from .protocol import DIGEST_MASK, SlotLedgerRecord

BATCH_HEADER = "eos.batch"
SLOT_HEADER = "eos.slot"
AUDIT_HEADERS = (BATCH_HEADER, SLOT_HEADER)
SPARK_HASH_SEED = 42   # org.apache.spark.sql.catalyst.expressions.XxHash64's default seed


def run_label(checkpoint_id: str, generation: int) -> str:
    """What names a slot's run in headers: the checkpoint (batch numbers restart with a fresh one) and
    the generation (each has its own slot records)."""
    return f"{checkpoint_id[:8]}/{generation}"


def audit_headers(checkpoint_id: str, generation: int, slot: int, batch: int) -> list[tuple[str, bytes]]:
    return [(BATCH_HEADER, str(batch).encode()), (SLOT_HEADER, f"{run_label(checkpoint_id, generation)}/{slot}".encode())]


Group = tuple[str, int, int]   # (run label, slot, batch)


def group_of(headers) -> Group | None:
    """The (run, slot, batch) a record's headers name, or None for a record written without them."""
    found = {k: v for k, v in (headers or []) if k in AUDIT_HEADERS}
    try:
        run, _, slot = found[SLOT_HEADER].decode().rpartition("/")
        return run, int(slot), int(found[BATCH_HEADER])
    except (KeyError, ValueError, AttributeError):
        return None


def _signed(h: int) -> int:
    return h - (1 << 64) if h >= 1 << 63 else h


def _step(data: bytes | None, seed: int) -> int:
    # Spark's XXH64.hashUnsafeBytes is XXH64 with the previous column's (signed) hash as seed; a null
    # column leaves the hash as it was.
    if data is None:
        return seed
    return _signed(xxhash.xxh64_intdigest(data, seed & DIGEST_MASK))


def record_hash(key: bytes | None, value: bytes | None, topic: str | None = None,
                headers: list[tuple[str, bytes | None]] | None = None) -> int:
    """``F.xxhash64(key, value[, topic][, headers])`` as the runtime computes it (eos_job.contract): headers
    are an array of (key string, value binary) structs, hashed element by element, field by field."""
    h = _step(key, SPARK_HASH_SEED)
    h = _step(value, h)
    if topic is not None:
        h = _step(topic.encode(), h)
    for hk, hv in headers or []:
        h = _step(hk.encode() if hk is not None else None, h)
        h = _step(hv, h)
    return h


def user_headers(headers) -> list[tuple[str, bytes | None]]:
    return [(k, v) for k, v in (headers or []) if k not in AUDIT_HEADERS]


@dataclass
class Seen:
    """A group's records in the sink: where they are, and their hashes both ways (the transformation's
    ``topic`` column null, or naming the topic the record is in: both write the same record)."""
    where: list[tuple[str, int, int]] = field(default_factory=list)   # (topic, partition, offset)
    digest: int = 0
    digest_topic: int = 0
    dead_letters: int = 0

    def add(self, topic: str, partition: int, offset: int, key, value, headers) -> None:
        self.where.append((topic, partition, offset))
        mine = user_headers(headers)
        self.digest = (self.digest + record_hash(key, value, None, mine)) & DIGEST_MASK
        self.digest_topic = (self.digest_topic + record_hash(key, value, topic, mine)) & DIGEST_MASK


@dataclass(frozen=True)
class Finding:
    kind: str            # "missing" | "extra" | "digest"
    run: str
    slot: int
    batch: int
    committed: int       # the ledger's count for the slot's batch
    found: int           # records of it in the sink (and dead letters)
    where: tuple[tuple[str, int, int], ...] = ()

    def describe(self) -> str:
        span = _span(self.where)
        what = {"missing": f"{self.committed - self.found} record(s) lost", "extra":
                f"{self.found - self.committed} record(s) more than committed"
                + (" (the slot is doubled)" if self.committed and self.found == 2 * self.committed else ""),
                "digest": "the same count but other records (a record lost and another doubled?)"}[self.kind]
        return (f"batch {self.batch} slot {self.slot} (run {self.run}): {what}: the ledger committed "
                f"{self.committed}, the sink holds {self.found}{span}")


def _span(where) -> str:
    if not where:
        return ""
    parts: dict[tuple[str, int], list[int]] = {}
    for t, p, o in where:
        parts.setdefault((t, p), []).append(o)
    return " at " + ", ".join(f"{t}[{p}] offsets {min(os)}..{max(os)}" for (t, p), os in sorted(parts.items()))


@dataclass
class SlotAudit:
    slots_checked: int = 0            # (slot, batch) records of the ledger compared with the sink
    records: int = 0                  # labelled records read
    digests_checked: int = 0          # of the slots checked, those whose digest was compared too
    unlabelled: int = 0               # records without audit headers (written by an older version)
    unrecorded: int = 0               # labelled records whose ledger record is gone (compacted) or elsewhere
    findings: list[Finding] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not self.findings

    def summary(self) -> str:
        head = (f"{self.slots_checked} slot batch(es) checked against the ledger ({self.digests_checked} by digest"
                f" too), {self.records} labelled record(s)")
        extra = [f"{self.unlabelled} record(s) without audit headers not checked"] if self.unlabelled else []
        if self.unrecorded:
            extra.append(f"{self.unrecorded} record(s) whose ledger record is compacted away not checked")
        verdict = "exactly once" if self.exact else f"{len(self.findings)} violation(s)"
        return f"{verdict}: {head}" + "".join(f"; {e}" for e in extra)


def ledger_group(key: str, record: SlotLedgerRecord) -> Group | None:
    """A slot record's (run, slot, batch) from its key ``<stream>/<checkpoint id>/<generation>/<slot>``."""
    parts = key.rsplit("/", 3)
    if len(parts) != 4 or not parts[2].isdigit() or not parts[3].isdigit():
        return None   # a batch, input or epoch record
    return run_label(parts[1], int(parts[2])), int(parts[3]), record.batch


def compare(seen: dict[Group, Seen], ledger: dict[Group, SlotLedgerRecord], *, from_batch: int = 0,
            unlabelled: int = 0) -> SlotAudit:
    """Every (slot, batch) the ledger recorded from ``from_batch`` on, compared with what the sink holds."""
    out = SlotAudit(unlabelled=unlabelled, records=sum(len(s.where) for s in seen.values()))
    for group, rec in sorted(ledger.items()):
        run, slot, batch = group
        if batch < from_batch:
            continue
        s = seen.get(group, Seen())
        found = len(s.where) + s.dead_letters
        out.slots_checked += 1
        kind = "missing" if found < rec.count else "extra" if found > rec.count else None
        if kind is None and not rec.dead_letters and not s.dead_letters:
            out.digests_checked += 1
            if rec.digest not in (s.digest, s.digest_topic):
                kind = "digest"
        if kind:
            out.findings.append(Finding(kind, run, slot, batch, rec.count, found, tuple(s.where)))
    out.unrecorded = sum(len(s.where) + s.dead_letters for g, s in seen.items()
                         if g not in ledger and g[2] >= from_batch)
    return out
