"""The lifecycle model's state and the rules that are not the protocol's (the model: ``lifecycle.py``).

The stores (source, checkpoints, ledger, sink) and the drivers, Spark's planning rule, which slot an id goes
to, how the ledger's batch history keeps the newest of the highest epoch, and what a finished lifecycle must
hold. Every field of ``World`` is in its ``key`` (the constants of an exploration aside), the epochs only as
"newer than the zombie's or not", all that the protocol's decisions compare them with: the exploration
expands each key once.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

from eos_job import protocol, source_slots
from eos_job.protocol import BatchHistoryRecord, SlotLedgerRecord

SLOTS = 2
MAX = 2          # ids per batch at most (maxOffsetsPerTrigger)
MAX_IDS = 6      # the source holds at most this many ids: the state space is finite and explored whole
PARTITIONS = 3   # ledger slot partitions: the most slots a generation has
OUTPUT_HASH = "o"
# The specs a stream runs (upgrades and rollbacks, ``upgrades.py``): each one's output hash, what the protocol
# compares. Spec A is every driver of the explorations without upgrades.
SPEC_HASHES = {"A": OUTPUT_HASH, "B": "p"}

History = dict[int, BatchHistoryRecord]


@dataclass(frozen=True)
class Checkpoint:
    ident: str
    offsets: tuple[tuple[int, tuple[int, int]], ...] = ()   # (batch, (start, end))
    commits: frozenset[int] = frozenset()
    origin: int = 0                                          # where batch 0 starts (startingOffsets)

    def offset(self, n: int) -> tuple[int, int] | None:
        return dict(self.offsets).get(n)

    @property
    def committed(self) -> int | None:
        return max(self.commits) if self.commits else None

    def logging(self, n: int, r: tuple[int, int]) -> "Checkpoint":
        """``offsets/n`` written (again)."""
        return Checkpoint(self.ident, tuple(p for p in self.offsets if p[0] != n) + ((n, r),), self.commits,
                          self.origin)

    def committing(self, n: int) -> "Checkpoint":
        return Checkpoint(self.ident, self.offsets, self.commits | {n}, self.origin)


@dataclass(frozen=True)
class Driver:
    """A driver: its checkpoint (the zombie's: its own copy), epoch, generation, slot count, view of the
    batch history, and a batch it planned and recorded whose slots have not run (the zombie's)."""
    ckpt: Checkpoint
    epoch: int
    generation: int
    n_slots: int
    view: History = field(default_factory=dict)     # never changed in place
    inflight: tuple[int, int, int, int] | None = None     # (batch, start, end, next slot)
    spec: str = "A"
    slots_from: str = "key"                         # its generation's job.slotsFrom


@dataclass
class World:
    safeties: frozenset[str]
    source: int = 0                                   # ids 0..source-1 exist
    ckpt: Checkpoint = field(default_factory=lambda: Checkpoint("c0"))
    slots: dict[tuple[str, int, int], SlotLedgerRecord] = field(default_factory=dict)  # (ckpt id, gen, slot)
    history: dict[tuple[str, int], BatchHistoryRecord] = field(default_factory=dict)  # (ckpt id, batch)
    sink: list[int] = field(default_factory=list)
    snapshots: list[Checkpoint] = field(default_factory=list)
    started: bool = False
    generation: int = 0
    n_slots: int = SLOTS
    max_ids: int = MAX_IDS
    epoch: int = 0                                    # the newest driver's epoch
    zombie: Driver | None = None
    slots_from: str = "key"                           # job.slotsFrom (see slot_of)
    previous: Checkpoint | None = None                # replayOffsetsFrom: where the stream ran before a restore
    view: History = field(default_factory=dict)       # the running driver's view of its batch history
    markers: tuple[int, ...] = (0,) * PARTITIONS      # the newest epoch marker of each slot partition
    generations: frozenset[tuple[int, int]] = frozenset()   # (generation, slots) of every driver that started
    # What partition 0 holds last per (ckpt id, batch), whoever wrote it: what compaction keeps. ``history``
    # is what a reader takes (``protocol.newest_history``: the newest of the highest epoch).
    written: dict[tuple[str, int], BatchHistoryRecord] = field(default_factory=dict)
    # A ledger that can lose its last records (``forgetful``, constant): the ledger as it was before the last
    # operation that wrote to it, and whether it forgot once already (one loss per lifecycle).
    forgetful: bool = False
    before_last: tuple | None = None
    forgot: bool = False
    # The running spec, and an upgrade not yet verified (no batch committed under the new spec): the spec to
    # roll back to and the snapshot taken before the upgrade; ``broken``: the new spec fails every batch.
    spec: str = "A"
    upgrading: tuple[str, Checkpoint] | None = None
    broken: bool = False

    def copy(self) -> "World":
        c = object.__new__(World)
        c.__dict__.update(self.__dict__)     # the rest is immutable or replaced whole, never changed in place
        c.slots, c.history, c.sink, c.snapshots = dict(self.slots), dict(self.history), list(self.sink), \
            list(self.snapshots)
        c.written = dict(self.written)
        return c

    def key(self):
        # Epochs only matter against the zombie's (a newer record supersedes it): without a zombie they are
        # all alike, with one they are "not newer" or "newer". The state space stays finite.
        z = self.zombie.epoch if self.zombie is not None else None

        def e(epoch: int) -> int:
            return 0 if z is None or epoch <= z else 1

        def hist(h) -> tuple:
            return tuple(sorted((n, r.generation, r.slots, r.offset_log, r.complete, r.output_hash, e(r.epoch))
                                for n, r in h.items()))

        def ledger(slots, history, written, markers, epoch, generations) -> tuple:
            # Of what partition 0 holds last, only where it is not what a reader takes (never, with the fence).
            return (tuple(sorted((k, r.batch, r.count, r.input, r.output_hash, e(r.epoch))
                                 for k, r in slots.items())),
                    hist(history), hist({k: r for k, r in written.items() if history.get(k) != r}),
                    tuple(e(m) for m in markers), e(epoch), generations)
        zombie = self.zombie and (self.zombie.ckpt, self.zombie.generation, self.zombie.n_slots,
                                  hist(self.zombie.view), self.zombie.inflight, self.zombie.slots_from)
        lost = (ledger(*self.before_last) if self.before_last else None, self.forgot) if self.forgetful else ()
        return (self.source, self.ckpt, ledger(self.slots, self.history, self.written, self.markers, self.epoch,
                                                self.generations),
                hist(self.view), tuple(sorted(self.sink)), tuple(self.snapshots), self.started,
                self.generation, self.n_slots, zombie, self.previous, lost, self.spec, self.upgrading, self.broken,
                self.slots_from)

    # -- the ledger's own failures ----------------------------------------------------------------------------
    def ledger_state(self) -> tuple:
        return (dict(self.slots), dict(self.history), dict(self.written), self.markers, self.epoch,
                self.generations)

    def forget(self) -> bool:
        """The ledger loses every record the last operation that wrote to it wrote (acknowledged, then lost
        with a replica: replication factor 1, or an unclean leader election); the sink keeps its output. Only
        on a ledger less durable than the runtime's start check asks (``ledger-durable`` off)."""
        if "ledger-durable" in self.safeties or self.forgot or self.before_last is None:
            return False
        self.slots, self.history, self.written, self.markers, self.epoch, self.generations = self.before_last
        self.before_last, self.forgot = None, True
        return True

    # -- parallelism changes, upgrades and rollbacks (the operator's) ------------------------------------------
    def rescale(self) -> bool:
        """A parallelism change, at a clean boundary only (the operator drains a partial batch first): a new
        generation of transactional ids and slot keys."""
        if self.generation >= 2 or any(not r.complete for r in history_of(self, self.ckpt.ident).values()):
            return False
        self.generation += 1
        self.n_slots = 3 if self.n_slots == 2 else 2
        self.started = False
        return True

    def reslot(self) -> bool:
        """A job.slotsFrom change (key <-> sourcePartitions), at a clean boundary only, as a parallelism change:
        a new generation, the same slot count, the batch cut into slots otherwise."""
        if not self.rescale():
            return False
        self.n_slots = 3 if self.n_slots == 2 else 2          # rescale changed it: keep the count
        self.slots_from = "sourcePartitions" if self.slots_from == "key" else "key"
        return True

    def upgrade(self) -> bool:
        """The other spec, at a clean boundary of the ledger's history (the operator drains a partial batch
        first): same generation and slot count; the new driver starts from the snapshot taken at the stop
        (the checkpoint as it is), replaying the checkpoint it ran on. Unverified until it commits a batch."""
        if self.upgrading is not None or any(not r.complete for r in history_of(self, self.ckpt.ident).values()):
            return False
        self.upgrading = (self.spec, self.ckpt)
        self.spec = "B" if self.spec == "A" else "A"
        self.previous, self.started = self.ckpt, False
        return True

    def verify(self) -> None:
        """The new spec committed a batch after the upgrade's snapshot: no rollback any more."""
        def last(c: Checkpoint) -> int:
            return -1 if c.committed is None else c.committed
        if self.upgrading is not None and last(self.ckpt) > last(self.upgrading[1]):
            self.upgrading = None

    def rollback(self) -> bool:
        """The operator's rollback of an upgrade not verified in time: the previous spec from the snapshot taken
        before the upgrade, in a new checkpoint location, replaying the checkpoint the new spec ran on."""
        if self.upgrading is None:
            return False
        self.spec, snapshot = self.upgrading
        self.previous, self.ckpt = self.ckpt, snapshot
        self.upgrading, self.broken, self.started = None, False, False
        return True

    def compact(self) -> bool:
        """Compaction: partition 0 keeps the last record written per key, and that is what a reader finds."""
        if self.history == self.written:
            return False
        self.history = dict(self.written)
        return True



def ranges(r: tuple[int, int]) -> protocol.Ranges:
    return {"events": {"0": [r[0], r[1]]}}


def slot_of(w: World, i: int, n_slots: int, epoch: int, spec: str = "A", slots_from: str | None = None) -> int:
    """The slot id ``i`` goes to. By key, which depends on the spec's transform: ``i % n_slots`` under spec A,
    ``(i + 1) % n_slots`` under spec B (the same ids cut otherwise: a batch of ids 0 and 1 is slots 0, 1
    under A and 1, 0 under B). By source partition (``job.slotsFrom:
    sourcePartitions``): the source then has two partitions (id i in partition i % 2) and the slot is the
    partition's rank in the batch's offset log, by the runtime's own ``source_slots.ranks``; without the
    ``slot-order`` safety every other driver ranks them the other way round (what a derivation that is not a
    function of the offset log could do on a replay)."""
    if (slots_from or w.slots_from) == "key":     # the driver's generation's, else the stream's
        return (i if spec == "A" else i + 1) % n_slots
    rank = source_slots.ranks({"events": {"0": [None, 0], "1": [None, 0]}})[("events", i % 2)]
    return 1 - rank if "slot-order" not in w.safeties and epoch % 2 else rank


@functools.cache
def input_digest(begin: int, end: int) -> str:
    return protocol.input_digest(ranges((begin, end)))


def log_text(r: tuple[int, int]) -> str:
    return f"{r[0]}:{r[1]}"


def history_of(w: World, ident: str) -> History:
    return {n: r for (i, n), r in w.history.items() if i == ident}


def plan(ckpt: Checkpoint, source: int) -> tuple[int, tuple[int, int]] | None:
    done = ckpt.committed
    n = 0 if done is None else done + 1
    logged = ckpt.offset(n)
    if logged is not None:
        return n, logged
    begin = ckpt.origin if done is None else ckpt.offset(done)[1]
    end = min(begin + MAX, source)
    return (n, (begin, end)) if end > begin else None     # Spark runs no batch without new input


def record_history(w: World, ident: str, rec: BatchHistoryRecord) -> None:
    """Of the input records of a batch, the newest of the highest epoch counts (``protocol.newest_history``)."""
    w.written[(ident, rec.batch)] = rec
    old = w.history.get((ident, rec.batch))
    if old is not None and "epoch" in w.safeties and old.epoch > rec.epoch:
        return
    w.history[(ident, rec.batch)] = rec


def violation(w: World, refused: str | None = None) -> str | None:
    """Lost or twice-written ids; a stream stopped by a refusal has lost nothing, it has not finished."""
    seen: dict[int, int] = {}
    for i in w.sink:
        seen[i] = seen.get(i, 0) + 1
    lost = sorted(set(range(w.source)) - set(seen))
    twice = sorted(i for i, c in seen.items() if c > 1)
    if lost and refused is None:
        return f"lost {lost}"
    if twice:
        return f"written twice {twice}"
    return None
