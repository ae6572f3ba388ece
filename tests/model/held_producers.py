"""The lifecycle model of held producers (protocol amendment A2): slot tasks on Python workers that keep a
slot's producer across batches, and may trust it (no fence, no ledger read) while it is clean.

The broker keeps, per slot transactional id, its producer epoch (bumped by every ``init_transactions``), the
slot's newest ledger record (its batch) and the ids committed to the sink. A worker holds per slot at most one
producer: its epoch, the ledger batch R it believes newest and ``clean``. A slot task of the current batch
picks a worker (a hit when that worker holds a clean producer, a miss otherwise) and decides: trusted, on R
with ``protocol.decide_slot``; otherwise it fences (a new epoch) and reads the ledger. Its commit then applies
only if the producer's epoch is the id's current one; an applied commit's outcome may be lost (the task sees
an error), and a task may be killed mid-transaction (before its commit, or during it, applied or not). A
failure the task sees sends it down fence-then-read (``fallback``); a killed or failed task is retried by
Spark on any worker; a task of an older batch may still be in flight (a zombie attempt).

Safeties (model names): ``held-clean`` (the runtime's ``faults.SAFETIES`` switch): any failure makes a held
producer not clean; off, a producer keeps trusting its R after a failed or unknown commit. ``never-as-success``
(the contract's rule): a failed commit is never taken as success; off, a trusted task whose commit the broker
refused reports its batch as written.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from eos_job import protocol
from eos_job.protocol import SlotAction, SlotLedgerRecord

SAFE = frozenset({"held-clean", "never-as-success"})

# A worker's held producer: (epoch, R, clean); R is the newest ledger batch it knows (-1: none).
# A task in flight: (worker, slot, batch, phase, epoch, R): phase "decided" (a write of `batch` is due, with the
# producer of `epoch`) or "fallback" (its trusted path failed: fence, read, decide next).


@dataclass(frozen=True)
class State:
    batch: int = 0                                   # the driver's current batch
    done: frozenset = frozenset()                    # slots reported for it
    epochs: tuple = ()                               # per slot: the transactional id's producer epoch
    ledger: tuple = ()                               # per slot: newest ledger batch (-1: none)
    sink: tuple = ()                                 # per slot: the batches whose ids were committed, in order
    held: frozenset = frozenset()                    # ((worker, slot), (epoch, R, clean))
    tasks: frozenset = frozenset()                   # tasks in flight, as above
    faults: int = 0                                  # faults injected so far
    trusted: int = 0                                 # trusted decisions made (to show the rule is used)
    safeties: frozenset = SAFE                       # constant in an exploration


def initial(slots: int, safeties=SAFE) -> State:
    return State(epochs=(0,) * slots, ledger=(-1,) * slots, sink=((),) * slots, safeties=frozenset(safeties))


def _set(t: tuple, i: int, v) -> tuple:
    return t[:i] + (v,) + t[i + 1:]


def _held(s: State) -> dict:
    return dict(s.held)


def _decide(batch: int, r: int) -> SlotAction:
    rec = None if r < 0 else SlotLedgerRecord(r, 1, r, 0, "s", "", "o", 0)
    return protocol.decide_slot(batch, rec, input="", output_hash="o", epoch=0, stream_epoch=0).action


def _report(s: State, slot: int, batch: int) -> State:
    if batch != s.batch or slot in s.done:
        return s
    done = s.done | {slot}
    if len(done) == len(s.epochs):
        return replace(s, batch=s.batch + 1, done=frozenset())
    return replace(s, done=done)


def _fence_and_decide(s: State, w: int, slot: int, batch: int) -> State:
    """Steps 1 and 2: a fresh producer (the old one, if any, discarded), the id's epoch bumped, the ledger read;
    then the decision."""
    epoch = s.epochs[slot] + 1
    r = s.ledger[slot]
    held = _held(s)
    held[(w, slot)] = (epoch, r, False)   # clean only once its own commit returned
    s = replace(s, epochs=_set(s.epochs, slot, epoch), held=frozenset(held.items()))
    if _decide(batch, r) is SlotAction.SKIP:
        return _report(s, slot, batch)
    return replace(s, tasks=s.tasks | {(w, slot, batch, "decided", epoch, r)})


def start(s: State, w: int, slot: int) -> State:
    """A slot task of the current batch lands on worker w."""
    h = _held(s).get((w, slot))
    if h is not None and h[2]:
        epoch, r, _ = h
        s = replace(s, trusted=s.trusted + 1)
        if _decide(s.batch, r) is SlotAction.SKIP:
            return _report(s, slot, s.batch)
        return replace(s, tasks=s.tasks | {(w, slot, s.batch, "decided", epoch, r)})
    return _fence_and_decide(s, w, slot, s.batch)


def _after_failure(s: State, task, keep_clean: bool) -> State:
    """The task saw its transaction fail: the producer not clean (discarded), or, with ``held-clean`` off,
    still trusted with its old R; the task goes on to the fallback."""
    w, slot, batch, _, epoch, r = task
    held = _held(s)
    if keep_clean:
        held[(w, slot)] = (epoch, r, True)   # as the runtime's control: the failure forgotten, R kept
    else:
        held.pop((w, slot), None)
    return replace(s, held=frozenset(held.items()),
                   tasks=(s.tasks - {task}) | {(w, slot, batch, "fallback", epoch, r)})


def commit(s: State, task, outcome: str) -> State:
    """``outcome``: "seen" (the task learns what happened) or "lost" (applied or not, it sees an error)."""
    w, slot, batch, _, epoch, r = task
    safe_clean = "held-clean" in s.safeties
    applies = epoch == s.epochs[slot]
    if applies:
        s = replace(s, ledger=_set(s.ledger, slot, batch), sink=_set(s.sink, slot, s.sink[slot] + (batch,)))
    if applies and outcome == "seen":
        held = _held(s)
        held[(w, slot)] = (epoch, batch, True)
        s = replace(s, held=frozenset(held.items()), tasks=s.tasks - {task})
        return _report(s, slot, batch)
    if outcome == "lost":
        s = replace(s, faults=s.faults + 1)
    if not applies and outcome == "seen" and "never-as-success" not in s.safeties:
        # The refused commit taken as success: the producer believes it wrote, the batch is reported.
        held = _held(s)
        held[(w, slot)] = (epoch, batch, True)
        s = replace(s, held=frozenset(held.items()), tasks=s.tasks - {task})
        return _report(s, slot, batch)
    return _after_failure(s, task, keep_clean=not safe_clean)


def fallback(s: State, task) -> State:
    """The failed task's next round: fence, read, decide (``held-clean`` off: a still-trusted producer is used
    again, as the runtime's control keeps it)."""
    w, slot, batch, _, _, _ = task
    s = replace(s, tasks=s.tasks - {task})
    h = _held(s).get((w, slot))
    if h is not None and h[2]:
        return replace(s, trusted=s.trusted + 1,
                       tasks=s.tasks | {(w, slot, batch, "decided", h[0], h[1])}) \
            if _decide(batch, h[1]) is not SlotAction.SKIP else _report(s, slot, batch)
    return _fence_and_decide(s, w, slot, batch)


def kill(s: State, task, applied: bool) -> State:
    """The task is killed mid-transaction: before its commit (nothing applied) or during it (applied if the
    epoch holds). The worker cannot tell: the held producer is not clean (``held-clean`` off: it stays)."""
    w, slot, batch, _, epoch, r = task
    s = replace(s, tasks=s.tasks - {task}, faults=s.faults + 1)
    if applied and epoch == s.epochs[slot]:
        s = replace(s, ledger=_set(s.ledger, slot, batch), sink=_set(s.sink, slot, s.sink[slot] + (batch,)))
    held = _held(s)
    if "held-clean" in s.safeties:
        held.pop((w, slot), None)
    elif (w, slot) in held:
        held[(w, slot)] = (epoch, r, True)
    return replace(s, held=frozenset(held.items()))


class Explorer:
    """Breadth first over every interleaving up to ``depth`` steps and ``max_faults`` injected faults."""

    def __init__(self, safeties=SAFE, slots: int = 1, workers: int = 2, batches: int = 3, depth: int = 12,
                 max_faults: int = 1):
        self.safeties, self.slots, self.workers = frozenset(safeties), slots, workers
        self.batches, self.depth, self.max_faults = batches, depth, max_faults

    def moves(self, s: State):
        if s.batch < self.batches:
            busy = {(t[0], t[1]) for t in s.tasks}
            for w in range(self.workers):
                for slot in range(self.slots):
                    if slot not in s.done and (w, slot) not in busy:
                        yield f"task-{s.batch}.{slot}@w{w}", lambda s=s, w=w, slot=slot: start(s, w, slot)
        for t in sorted(s.tasks):
            name = f"{t[2]}.{t[1]}@w{t[0]}"
            if t[3] == "fallback":
                yield f"fallback-{name}", lambda s=s, t=t: fallback(s, t)
                continue
            yield f"commit-{name}", lambda s=s, t=t: commit(s, t, "seen")
            if s.faults < self.max_faults:
                yield f"commit-outcome-lost-{name}", lambda s=s, t=t: commit(s, t, "lost")
                yield f"kill-before-commit-{name}", lambda s=s, t=t: kill(s, t, applied=False)
                yield f"kill-during-commit-{name}", lambda s=s, t=t: kill(s, t, applied=True)

    def violation(self, s: State) -> str | None:
        for slot, batches in enumerate(s.sink):
            twice = sorted({b for b in batches if batches.count(b) > 1})
            if twice:
                return f"written twice: slot {slot} batches {twice}"
        if s.batch >= self.batches:
            for slot, batches in enumerate(s.sink):
                lost = sorted(set(range(self.batches)) - set(batches))
                if lost:
                    return f"lost: slot {slot} batches {lost} reported written, never committed"
        return None

    def explore(self) -> tuple[int, list[tuple[tuple[str, ...], str]], int]:
        """(distinct states, violations with the shortest path to each, most trusted decisions on one path)."""
        first = initial(self.slots, self.safeties)
        seen = {_key(first)}
        frontier = [(first, ())]
        found: list[tuple[tuple[str, ...], str]] = []
        trusted = 0
        for _ in range(self.depth):
            nxt = []
            for s, path in frontier:
                for name, step in self.moves(s):
                    t = step()
                    if _key(t) in seen:
                        continue
                    seen.add(_key(t))
                    trusted = max(trusted, t.trusted)
                    v = self.violation(t)
                    if v:
                        found.append((path + (name,), v))
                        continue
                    nxt.append((t, path + (name,)))
            frontier = nxt
        return len(seen), found, trusted


def _key(s: State) -> tuple:
    """Everything a state's future depends on (the trusted count is a measurement, not state)."""
    return (s.batch, s.done, s.epochs, s.ledger, s.sink, s.held, s.tasks, s.faults)
