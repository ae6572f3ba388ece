"""What the exactly-once ledger holds and where: its partition layout, transactional ids, keys and record
formats (see shared/design/exactly-once-protocol.md).

Pure data, no decisions and no I/O: the protocol's decisions over these records are in ``eos_job.protocol``
(which re-exports every name here, so ``protocol.SlotLedgerRecord`` and the like keep working); reading and
writing them on Kafka is ``eos_job.ledger``.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

Ranges = dict[str, dict[str, list]]   # {topic: {partition: [start offset or None, end offset]}}

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


def driver_transactional_id(prefix: str) -> str:
    """The driver's partition-0 writer: one per stream, so each driver start fences the previous driver's."""
    return f"{prefix}-driver"


def slot_key(stream_uid: str, checkpoint_id: str, generation: int, slot: int) -> str:
    # The checkpoint identity keeps a fresh (stateless) checkpoint, whose batch
    # numbers restart at 0, from inheriting the old checkpoint's skips.
    return f"{stream_uid}/{checkpoint_id}/{generation}/{slot}"


def batch_key(stream_uid: str, checkpoint_id: str, generation: int) -> str:
    return f"{stream_uid}/{checkpoint_id}/{generation}/batch"


def history_key(stream_uid: str, checkpoint_id: str, batch: int) -> str:
    """Batch ``batch``'s input record: keyed without the generation, so batch identity and completion are
    judged across generations."""
    return f"{stream_uid}/{checkpoint_id}/input/{batch}"


def history_prefix(stream_uid: str, checkpoint_id: str) -> str:
    return f"{stream_uid}/{checkpoint_id}/input/"


def epoch_key(stream_uid: str) -> str:
    """The stream's driver epoch: in partition 0 every driver start takes the next one; in every slot
    partition the same key is the epoch marker a starting driver writes under every generation's
    transactional id of that partition (``eos_job.epoch.mark``)."""
    return f"{stream_uid}/epoch"


@dataclass(frozen=True)
class EpochRecord:
    epoch: int
    started_at: str = ""
    host: str = ""

    def encode(self) -> bytes:
        return json.dumps({"kind": "epoch", **asdict(self)}, sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> "EpochRecord":
        d = json.loads(raw)
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def newest_history(values: list[bytes]) -> "BatchHistoryRecord":
    """Of the records of one batch (newest first), the one of the highest driver epoch: a superseded
    driver's late write never overrides what the newer driver recorded."""
    records = [BatchHistoryRecord.decode(v) for v in values]
    return max(records, key=lambda r: r.epoch)   # max keeps the first (newest) of equal epochs


# Input records older than this many batches behind the newest get a tombstone: the ledger stays small,
# and a checkpoint further behind than that is refused with a message rather than re-planned.
HISTORY_BATCHES = 10_000


@dataclass(frozen=True)
class SlotLedgerRecord:
    """The last batch a slot committed, written in the same transaction as its output."""
    batch: int
    count: int
    digest: int
    dead_letters: int = 0
    spec_hash: str = ""
    input: str = ""          # input_digest of the batch's source ranges
    output_hash: str = ""    # what decides the output: ExactlyOnceStreamSpec.output_hash()
    epoch: int = 0           # the driver epoch that wrote (or stamped) the record

    def encode(self) -> bytes:
        d = asdict(self)
        d["digest"] = f"{self.digest:016x}"
        return json.dumps(d, sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> "SlotLedgerRecord":
        d = json.loads(raw)
        d["digest"] = int(d["digest"], 16)
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class BatchHistoryRecord:
    """What batch N of a checkpoint was: written before any slot of N commits (``complete`` false) and
    again once every slot did (``complete`` true). ``offset_log`` is Spark's ``offsets/N`` file as written,
    so the batch can be re-run with exactly its input (and batch timestamp) from the ledger alone."""
    batch: int
    generation: int
    slots: int
    input: Ranges
    offset_log: str = ""
    output_hash: str = ""
    complete: bool = False
    epoch: int = 0

    def encode(self) -> bytes:
        return json.dumps({"kind": "input", **asdict(self)}, sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> "BatchHistoryRecord":
        d = json.loads(raw)
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class BatchCompleteRecord:
    """Batch N is fully in the sink. ``source_offsets`` is where the source stands after N
    ({topic: {partition: next offset}}, from ``offsets/N``): a restart replays from there, so
    the operator compares it with what the source still retains (the replay horizon).
    ``nondeterministic_slots_total`` is carried from record to record (each driver continues
    the last one), so the operator sees every detection even if it reads only the latest.
    ``runtime_version`` is the ``eos_job.__version__`` of the driver that wrote it (amendment A3: for the
    operator's version-skew check only; None in records of runtimes before it, and then left out)."""
    batch: int
    slots: int
    count: int
    skipped_slots: int
    dead_letters: int = 0
    source_offsets: dict[str, dict[str, int]] = field(default_factory=dict)
    nondeterministic_slots: int = 0        # slots of this batch whose replay differed from the sink
    nondeterministic_slots_total: int = 0  # the same, summed over every batch of the ledger so far
    runtime_version: str | None = None

    def encode(self) -> bytes:
        doc = asdict(self)
        if self.runtime_version is None:
            del doc["runtime_version"]
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> "BatchCompleteRecord":
        d = json.loads(raw)   # records of older versions lack source_offsets; unknown keys are dropped
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})




# ------------------------------------------------------------------ generation history
def generations_key(stream_uid: str) -> str:
    """The stream's generation history (partition 0): every (generation, slots, first batch) that wrote."""
    return f"{stream_uid}/generations"


@dataclass(frozen=True)
class GenerationHistory:
    generations: list[list[int]] = field(default_factory=list)   # [generation, slots, first batch], ascending
    # How each generation cut its output into slots (spec.job.slotsFrom), where not by key: {"3": "sourcePartitions"}
    derived: dict[str, str] = field(default_factory=dict)

    def encode(self) -> bytes:
        doc = {"kind": "generations", "generations": self.generations}
        if self.derived:
            doc["slotsFrom"] = self.derived
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes | None) -> "GenerationHistory":
        if raw is None:
            return cls()
        doc = json.loads(raw)
        return cls([list(g) for g in doc.get("generations", [])], dict(doc.get("slotsFrom", {})))

    def slots_of(self) -> dict[int, int]:
        return {g: s for g, s, _ in self.generations}

    def slots_from(self, generation: int) -> str:
        return self.derived.get(str(generation), "key")

    def with_generation(self, generation: int, slots: int, first_batch: int,
                        slots_from: str = "key") -> "GenerationHistory":
        if any(g == generation for g, _, _ in self.generations):
            return self
        derived = {**self.derived, **({str(generation): slots_from} if slots_from != "key" else {})}
        return GenerationHistory(sorted([*self.generations, [generation, slots, first_batch]]), derived)
