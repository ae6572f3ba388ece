"""The exactly-once protocol's pure pieces (see shared/design/exactly-once-protocol.md).

Everything here is deterministic and free of I/O, so it is unit-tested with
fakes: transactional ids, ledger keys and records, the slot decision, digests.
The Kafka side effects live in ``eos_job.ledger`` and ``eos_job.sink``.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import Enum

import numpy as np

DIGEST_MASK = (1 << 64) - 1

# Ledger partition layout: partition 0 holds the driver's batch-complete
# records (idempotent, non-transactional writes); slot p writes partition p+1
# only, with its own transactional id, so after fencing that id no open
# transaction can hide a committed record of the slot from a read_committed read.
BATCH_PARTITION = 0


def ledger_partition(slot: int) -> int:
    return slot + 1


def ledger_partitions_needed(slots: int) -> int:
    return slots + 1


def transactional_id(prefix: str, generation: int, slot: int) -> str:
    """``<prefix>-<generation>-<p>``: stable across batches, so each attempt fences every older one."""
    return f"{prefix}-{generation}-{slot}"


def slot_key(stream_uid: str, checkpoint_id: str, generation: int, slot: int) -> str:
    # The checkpoint identity keeps a fresh (stateless) checkpoint, whose batch
    # numbers restart at 0, from inheriting the old checkpoint's skips.
    return f"{stream_uid}/{checkpoint_id}/{generation}/{slot}"


def batch_key(stream_uid: str, checkpoint_id: str, generation: int) -> str:
    return f"{stream_uid}/{checkpoint_id}/{generation}/batch"


@dataclass(frozen=True)
class SlotLedgerRecord:
    """The last batch a slot committed, written in the same transaction as its output."""
    batch: int
    count: int
    digest: int
    dead_letters: int = 0
    spec_hash: str = ""

    def encode(self) -> bytes:
        d = asdict(self)
        d["digest"] = f"{self.digest:016x}"
        return json.dumps(d, sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> "SlotLedgerRecord":
        d = json.loads(raw)
        d["digest"] = int(d["digest"], 16)
        return cls(**d)


@dataclass(frozen=True)
class BatchCompleteRecord:
    """Batch N is fully in the sink. ``source_offsets`` is where the source stands after N
    ({topic: {partition: next offset}}, from ``offsets/N``): a restart replays from there, so
    the operator compares it with what the source still retains (the replay horizon).
    ``nondeterministic_slots_total`` is carried from record to record (each driver continues
    the last one), so the operator sees every detection even if it reads only the latest."""
    batch: int
    slots: int
    count: int
    skipped_slots: int
    dead_letters: int = 0
    source_offsets: dict[str, dict[str, int]] = field(default_factory=dict)
    nondeterministic_slots: int = 0        # slots of this batch whose replay differed from the sink
    nondeterministic_slots_total: int = 0  # the same, summed over every batch of the ledger so far

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> "BatchCompleteRecord":
        d = json.loads(raw)   # records of older versions lack source_offsets; unknown keys are dropped
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


class SlotAction(Enum):
    WRITE = "write"
    SKIP = "skip"


@dataclass(frozen=True)
class SlotDecision:
    action: SlotAction
    recorded: SlotLedgerRecord | None
    reason: str


def decide_slot(batch: int, recorded: SlotLedgerRecord | None) -> SlotDecision:
    """Step 2 of the write path, after the fence: write, or skip because already committed.

    A recorded batch later than ``batch`` happens after restoring an older
    snapshot of the same checkpoint: those batches are in the sink already.
    """
    if recorded is None:
        return SlotDecision(SlotAction.WRITE, None, "no ledger record for this slot")
    if recorded.batch >= batch:
        why = "batch already committed" if recorded.batch == batch else (
            f"a later batch ({recorded.batch}) is already committed")
        return SlotDecision(SlotAction.SKIP, recorded, why)
    return SlotDecision(SlotAction.WRITE, recorded, f"last committed batch is {recorded.batch}")


def digest_of_hashes(hashes: np.ndarray) -> int:
    """Order-independent slot digest: the sum of 64-bit record hashes modulo 2**64."""
    if len(hashes) == 0:
        return 0
    return int(np.asarray(hashes).astype(np.uint64, copy=False).sum(dtype=np.uint64)) & DIGEST_MASK


def combine_digests(*digests: int) -> int:
    return sum(digests) & DIGEST_MASK


@dataclass(frozen=True)
class SlotCommit:
    """The commit message a slot task returns to the driver."""
    slot: int
    batch: int
    count: int
    digest: int
    skipped: bool
    dead_letters: int = 0
    nondeterministic: bool = False
    attempt: int = 0

    def to_row(self) -> dict:
        return {**asdict(self), "digest": f"{self.digest:016x}"}

    @classmethod
    def from_row(cls, row: dict) -> "SlotCommit":
        d = dict(row)
        d["digest"] = int(d["digest"], 16)
        return cls(**d)


def check_batch_commits(batch: int, slots: int, commits: list[SlotCommit]) -> None:
    """The driver's check before it writes batch-complete: one commit per slot, all for this batch."""
    seen = sorted(c.slot for c in commits)
    if seen != list(range(slots)):
        raise RuntimeError(f"batch {batch}: expected one commit per slot 0..{slots - 1}, got slots {seen}; "
                           "the output partitioning does not match spec.job.parallelism")
    wrong = [c for c in commits if c.batch != batch]
    if wrong:
        raise RuntimeError(f"batch {batch}: slot commits for other batches {[(c.slot, c.batch) for c in wrong]}")
