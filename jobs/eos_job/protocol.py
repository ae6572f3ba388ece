"""The exactly-once protocol's decisions (see shared/design/exactly-once-protocol.md).

Everything here is deterministic and free of I/O, so it is unit-tested with
fakes: batch identity, the slot decision, the driver's batch checks, digests,
catch-up and the generation a driver runs. What the ledger holds (its layout,
keys and record formats) is ``eos_job.ledger_format``, re-exported here so
callers keep naming ``protocol.SlotLedgerRecord`` and the like. The Kafka side
effects live in ``eos_job.ledger`` and ``eos_job.sink``.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from enum import Enum

import numpy as np

from .ledger_format import (BATCH_PARTITION, HISTORY_BATCHES, BatchCompleteRecord, BatchHistoryRecord,
                            EpochRecord, GenerationHistory, Ranges, SlotLedgerRecord, batch_key,
                            driver_transactional_id, epoch_key, generations_key, history_key, history_prefix,
                            ledger_partition, ledger_partitions_needed, newest_history, slot_key, transactional_id)

__all__ = [  # the protocol's own names, then the ledger format's it re-exports
    "DIGEST_MASK", "HASH_COL", "input_ranges", "input_digest", "same_input", "describe_ranges",
    "FINISH_WITH_THAT_SPEC", "SlotAction", "SlotDecision", "decide_slot", "digest_of_hashes", "combine_digests",
    "SlotCommit", "check_batch_commits", "BatchVerdict", "judge_batch", "committed_mismatch", "catch_up",
    "effective_generation",
    "BATCH_PARTITION", "HISTORY_BATCHES", "BatchCompleteRecord", "BatchHistoryRecord", "EpochRecord",
    "GenerationHistory", "Ranges", "SlotLedgerRecord", "batch_key", "driver_transactional_id", "epoch_key",
    "generations_key", "history_key", "history_prefix", "ledger_partition", "ledger_partitions_needed",
    "newest_history", "slot_key", "transactional_id",
]

DIGEST_MASK = (1 << 64) - 1
HASH_COL = "__eos_hash"   # the per-record hash column the runtime adds to the output (digests)


# ------------------------------------------------------------------ batch identity
def input_ranges(start: dict[str, dict[str, int]] | None, end: dict[str, dict[str, int]]) -> Ranges:
    """Batch N's input: per source partition, where it starts (the end of N-1) and where it ends."""
    start = start or {}
    return {t: {str(p): [start.get(t, {}).get(str(p)), int(o)] for p, o in sorted(parts.items())}
            for t, parts in sorted(end.items())}


def input_digest(ranges: Ranges) -> str:
    """A short, order-independent name of an input, carried by every slot record of the batch."""
    if not ranges:
        return ""
    return hashlib.sha256(json.dumps(ranges, sort_keys=True).encode()).hexdigest()[:16]


def same_input(a: Ranges, b: Ranges) -> bool:
    """Equal ends, and equal starts where both sides know them."""
    if set(a) != set(b):
        return False
    for t, parts in a.items():
        if set(parts) != set(b[t]):
            return False
        for p, (start, end) in parts.items():
            other_start, other_end = b[t][p]
            if end != other_end or (start is not None and other_start is not None and start != other_start):
                return False
    return True


def describe_ranges(r: Ranges) -> str:
    return ", ".join(f"{t}[{p}] {s}..{e}" for t, parts in r.items() for p, (s, e) in parts.items()) or "(none)"


# Which records a committed slot holds depends on the spec that cut the batch into slots by key: only that
# spec may finish the batch. What a user can do when it cannot (a broken upgrade's batch, after a rollback).
FINISH_WITH_THAT_SPEC = (
    "finish it with that spec first (the operator's drain does); with job.slotsFrom key another spec would cut "
    "the batch into other slots and lose or duplicate records. If that spec cannot run, restore a snapshot taken "
    "before the batch into a new stream with another sink topic; a map-only job with job.slotsFrom: "
    "sourcePartitions lets any spec finish such a batch")


class SlotAction(Enum):
    WRITE = "write"
    SKIP = "skip"
    SUPERSEDED = "superseded"   # a newer driver (epoch) wrote or stamped the slot: this driver stops for good
    REPLAN = "replan"   # the ledger's batch N is another input: fail; the restart re-runs the ledger's batches
    REFUSE = "refuse"   # the ledger's batch N is another spec's, partially committed: stop for good


@dataclass(frozen=True)
class SlotDecision:
    action: SlotAction
    recorded: SlotLedgerRecord | None
    reason: str


def decide_slot(batch: int, recorded: SlotLedgerRecord | None, *, input: str = "",
                output_hash: str = "", epoch: int = 0, stream_epoch: int = 0,
                input_slots: bool = False) -> SlotDecision:
    """Step 2 of the write path, after the fence: write, skip because already committed, or refuse.

    A recorded batch later than ``batch`` happens after restoring an older
    snapshot of the same checkpoint: those batches are in the sink already (the
    driver made sure, from the ledger's batch history, that ``batch`` is the same
    input as then). The same batch number under another input or another spec is
    never skipped on its number, and never written on top: refused. ``stream_epoch`` is the newest epoch
    marker the slot's read met in its ledger partition: a newer driver of the stream, whatever its
    generation or checkpoint, supersedes this one. ``input_slots``: the generation's slots are fixed by the
    input (``job.slotsFrom: sourcePartitions``), so a slot another spec committed of this batch holds the
    records this slot would write: skipped, not refused (docs/protocol-amendments.md, A1).
    """
    if epoch and stream_epoch > epoch:
        return SlotDecision(SlotAction.SUPERSEDED, recorded, f"a newer driver (epoch {stream_epoch}) runs this "
                            f"stream; this one (epoch {epoch}) stops without writing")
    if recorded is None:
        return SlotDecision(SlotAction.WRITE, None, "no ledger record for this slot")
    if epoch and recorded.epoch > epoch:
        return SlotDecision(SlotAction.SUPERSEDED, recorded, f"a newer driver (epoch {recorded.epoch}) runs this "
                            f"stream; this one (epoch {epoch}) stops without writing")
    if recorded.batch == batch and input and recorded.input and input != recorded.input:
        return SlotDecision(SlotAction.REPLAN, recorded, f"batch {batch} was committed for another input "
                            f"(ledger {recorded.input}, now {input})")
    if recorded.batch == batch and output_hash and recorded.output_hash and output_hash != recorded.output_hash:
        if input_slots:
            return SlotDecision(SlotAction.SKIP, recorded, f"batch {batch} committed by another spec (output hash "
                                f"{recorded.output_hash}) from this slot's own source partitions")
        return SlotDecision(SlotAction.REFUSE, recorded, f"batch {batch} was partially committed by another spec "
                            f"(output hash {recorded.output_hash}, now {output_hash}); {FINISH_WITH_THAT_SPEC}")
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


def check_batch_commits(batch: int, slots: list[int], commits: list[SlotCommit]) -> None:
    """The driver's check before it writes batch-complete: one commit per slot the batch ran, all for it."""
    seen = sorted(c.slot for c in commits)
    if seen != sorted(slots):
        raise RuntimeError(f"batch {batch}: expected one commit per slot {sorted(slots)}, got slots {seen}; "
                           "the output partitioning does not match spec.job.parallelism")
    wrong = [c for c in commits if c.batch != batch]
    if wrong:
        raise RuntimeError(f"batch {batch}: slot commits for other batches {[(c.slot, c.batch) for c in wrong]}")


# ------------------------------------------------------------------ the driver's batch checks
@dataclass(frozen=True)
class BatchVerdict:
    action: str   # "run": the slots decide; "skip": all in the sink; "replan": fail, the restart re-runs the
                  # ledger's batches first; "refuse": stop for good (a restart would refuse again)
    reason: str


def judge_batch(batch: int, planned: Ranges, recorded: BatchHistoryRecord | None, generation: int,
                output_hash: str, untouched: bool = False, input_slots: bool = False) -> BatchVerdict:
    """Before batch N's slots run: is N the input the ledger says N was, and may it run under this spec?

    ``untouched``: no slot of the generation that recorded N holds N (read after this driver's start fenced
    every generation's ids): the record is an intent none of whose slots committed (a driver superseded,
    or stopped, before its first slot commit), so N is not partial and runs under this spec.
    ``input_slots``: this generation's slots are fixed by the input (``job.slotsFrom: sourcePartitions``):
    a batch another spec left partial runs, its committed slots skipped (docs/protocol-amendments.md, A1)."""
    if recorded is None:
        return BatchVerdict("run", "the ledger has no record of this batch")
    if not same_input(planned, recorded.input):
        return BatchVerdict("replan", (
            f"batch {batch} was planned over {describe_ranges(planned)}, but the ledger's batch {batch} of this "
            f"checkpoint is {describe_ranges(recorded.input)}: skipping it by its number would lose records and "
            "writing it would duplicate them, so nothing was written. Another driver recorded it since this one "
            "started; the restart re-runs the ledger's batches before planning new ones"))
    if not recorded.complete and untouched:
        return BatchVerdict("run", f"the ledger's record of batch {batch} (generation {recorded.generation}) is an "
                                   "intent none of whose slots committed")
    if recorded.generation != generation:
        if recorded.complete:
            return BatchVerdict("skip", f"batch {batch} is complete in the sink (generation "
                                        f"{recorded.generation}, {recorded.slots} slots)")
        return BatchVerdict("refuse", (
            f"batch {batch} is partially committed under generation {recorded.generation} "
            f"({recorded.slots} slots), and this driver runs generation {generation}: a spec with {recorded.slots} "
            f"slots (and that generation's job.slotsFrom) finishes it under generation {recorded.generation}, as "
            "the operator's drain does; change the slot count after that. Nothing was written"))
    if recorded.complete and recorded.output_hash and output_hash and recorded.output_hash != output_hash:
        # Re-run with its recorded input under another spec (a restore of an older snapshot with a changed spec):
        # every slot of it is in the sink, so writing nothing is exactly once; a slot must not refuse it.
        return BatchVerdict("skip", f"batch {batch} is complete in the sink (written by another spec, output "
                                    f"hash {recorded.output_hash})")
    if not recorded.complete and recorded.output_hash and output_hash and recorded.output_hash != output_hash:
        if input_slots:
            return BatchVerdict("run", (
                f"batch {batch} is partially committed by another spec (output hash {recorded.output_hash}); its "
                "slots are its source partitions (job.slotsFrom: sourcePartitions), the same under every spec: "
                "the committed ones are skipped, this spec writes the rest"))
        return BatchVerdict("refuse", (
            f"batch {batch} is partially committed by another spec (output hash {recorded.output_hash}, now "
            f"{output_hash}): {FINISH_WITH_THAT_SPEC}; nothing was written"))
    return BatchVerdict("run", "the same input as the ledger's record")


def committed_mismatch(batch: int, logged: Ranges, recorded: BatchHistoryRecord | None) -> str | None:
    """At start: the checkpoint's last committed batch against the ledger's record of it. Different inputs mean
    the checkpoint and the sink disagree on what batch N was (two drivers on one checkpoint, an ``offsets/N``
    overwritten after its commit): going on from the checkpoint's end would lose or duplicate records."""
    if recorded is None or same_input(logged, recorded.input):
        return None
    return (f"the checkpoint's committed batch {batch} covers {describe_ranges(logged)}, but the ledger's batch "
            f"{batch} of this checkpoint is {describe_ranges(recorded.input)}: the checkpoint and the sink disagree "
            "on what was written (was offsets/{batch} overwritten, by a second driver on the same checkpoint?), so "
            "nothing was written. Restore a snapshot taken before that batch: the driver then re-runs the ledger's "
            "batches with their recorded input").replace("{batch}", str(batch))


def catch_up(committed: int | None, history: dict[int, BatchHistoryRecord],
             elsewhere: frozenset[int] | set[int] = frozenset()) -> tuple[list[int], str | None]:
    """The batches to re-run with their original input before Spark plans anything new, or an error.

    The checkpoint's last committed batch is ``committed``; the ledger recorded batches up to ``max(history)``
    of the same checkpoint identity (a restore of an older snapshot, a stream re-created on a stale
    checkpoint), and the checkpoint the stream ran on before (``replayOffsetsFrom``) logged the batches in
    ``elsewhere``. Spark would plan those again from what the source holds now: other ranges, same numbers.
    A batch's input comes from the ledger where it recorded one (what the sink holds was written from it),
    else from the previous checkpoint.
    """
    first = 0 if committed is None else committed + 1
    last = max([*history, *elsewhere], default=-1)
    if last < first:
        return [], None
    missing = [n for n in range(first, last + 1) if n not in history and n not in elsewhere]
    if missing:
        return [], (f"the checkpoint is at batch {committed} and the ledger or the previous checkpoint hold this "
                    f"checkpoint's batches up to {last}, but not the input of batch(es) "
                    f"{missing[:5]}{'...' if len(missing) > 5 else ''} (the ledger keeps the last "
                    f"{HISTORY_BATCHES}, Spark spark.sql.streaming.minBatchesToRetain): restore a newer snapshot, "
                    "or give the previous checkpoint as replayOffsetsFrom")
    missing_log = [n for n in range(first, last + 1)
                   if n in history and not history[n].offset_log and n not in elsewhere]
    if missing_log:
        return [], f"the ledger's records of batch(es) {missing_log[:5]} carry no offset log to re-run them from"
    return list(range(first, last + 1)), None



def effective_generation(requested: int, slots: int, history: GenerationHistory, slots_from: str = "key") -> int:
    """The generation a driver runs: the operator's (``status.txGeneration``) unless the ledger knows a later
    one. A re-created resource starts at 0 again: it continues the ledger's latest generation when the slot
    count is the same (the same transactional ids and slot keys as before), and takes a new generation above
    every one that ever wrote when it differs; it never reuses an old generation's ids for other slots."""
    if not history.generations:
        return requested
    latest, latest_slots, _ = max(history.generations)
    if requested > latest:
        return requested
    if latest_slots == slots and history.slots_from(latest) == slots_from:
        return latest
    return latest + 1
