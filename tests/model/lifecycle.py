"""An exhaustive model of a stream's lifecycle, checking exactly-once with the protocol's real decisions.

The model is small and plain (its state: ``world.py``): one source partition (a list of unique ids), a
checkpoint (offset log, commit log, identity, where a fresh one starts reading), the ledger (each slot
key's newest record, the batch history of each checkpoint identity, the stream's epoch and generation
history in partition 0, and the newest epoch marker in each slot partition), the sink (a list of ids: a
multiset) and two slots (id % 2). Spark is modelled by one rule: batch N re-runs the range logged in
``offsets/N``, else it is planned from the end of N-1 (a fresh checkpoint: from where it starts) up to what
the source holds, at most MAX ids. What decides is not modelled but called: ``protocol.catch_up`` at each
driver start, ``judge_batch`` before each batch, ``decide_slot`` in each slot.

Operations. Every sequence up to a depth (new input, a whole batch, a driver killed after k slots committed
or after the batch reached the sink but before its commit log, a snapshot, a restore of any earlier
snapshot of the same checkpoint identity, which is also "delete and re-create on a stale checkpoint") is
followed by a clean finish (a restart that runs until the source is consumed); then every id must be in the
sink exactly once. A parallelism change ("rescale", at a clean boundary of the ledger's history) moves the
stream to a new generation with another slot count; a restore across it keeps the current spec, so the
batches after the snapshot are judged across generations. A job.slotsFrom change ("reslot", also with a
restore: "restore-reslotted") is a new generation too, with the same slot count and the batch cut otherwise
(each driver cuts by its own generation's job.slotsFrom). A stateless start ("stateless", once, when the
checkpoint has consumed the source; ``startingOffsets: latest``, which the runtime resolves after the new
driver's claim, so the driver starts within the operation) moves the stream to a fresh checkpoint of
another identity: batch numbers from 0 again, new ledger keys, the same generation and transactional ids.
An upgrade ("upgrade", at a clean boundary) runs the other spec (A or B: another output hash, and with key
slots another cut of the ids into slots) from a snapshot of the checkpoint; until a batch commits under it,
it may break ("broken-batch": one slot committed, then every start fails) and the operator rolls it back
("rollback", also at the finish): the previous spec from that snapshot, replaying the new spec's checkpoint.

Drivers. Every start records its generation in the generation history, takes the next stream epoch
(partition 0), writes that epoch as the marker into every slot partition of every generation that ever
wrote (under that generation's transactional id, whose fence aborts what a driver of it left open), stamps
it on the slot records of its own (checkpoint, generation, slot) keys, and then reads its checkpoint's batch
history once: its view, which it judges every batch against and adds its own writes to, never another
driver's (the runtime's ``BatchWriter.history``). A zombie ("split": the running driver is given up for
dead, on an unreachable node, and keeps running on its own copy of the checkpoint with its view) runs
batches of its own whenever the exploration says, interleaved with everything else: a whole batch
("zombie-batch"), or in steps: its planning, judging and input record ("zombie-plan"), then one slot at a
time ("zombie-slot", the last one completing the batch) or the rest ("zombie-batch"), after whatever came
between. The new driver may be of another generation ("rescale" after the split) or on another checkpoint
identity ("stateless"): the zombie's own slot keys then never carry a newer stamp. Of two input records of a
batch the newer epoch's counts (``protocol.newest_history``). A batch recorded incomplete by another
generation is refused unless no slot of that generation holds it (``judge_batch(untouched=True)``: an
intent none of whose slots committed runs).

Safeties (each negative control switches one off and must find the violation): ``input-check``,
``ledger-skip``, ``slot-order``, ``stream-epoch`` and ``spec-check`` (without it key slots are finished by
another spec as if fixed by the input) are the runtime's (``faults.SAFETIES``); ``epoch``
(stamps, and epochs at all) and ``history-first`` (the ledger's history read before replays) are what the
protocol did before. With ``stream-epoch`` a slot passes the newest marker of its partition to
``decide_slot`` as ``stream_epoch``, and a driver superseded by a newer epoch writes no batch input or
complete record to partition 0 (the runtime's ``EpochWatch`` and the fenced ``<prefix>-driver`` writer) and
stops; without it a driver sees only the stamps on its own keys. ``driver-fence`` is that fenced writer on its
own: without it the zombie's partition-0 writes land after a newer driver's (the reader's epoch rule still
takes the newer one; compaction, which keeps the last record written per key, does not: "compact").
``ledger-durable`` is the start's check that the ledger is as durable as the sink: without it the ledger may
forget the records of the last operation that wrote to it ("ledger-forgets", once per lifecycle; the sink
keeps its output). A lifecycle whose finish ends in a refusal
(a batch partially committed under another generation, refused by every start) has not finished: nothing in
it may be written twice, and the tests say which lifecycles end so.

Not modelled: Spark's planning beyond the one rule; the stores' failures other than the ledger's two;
transactions that interleave (a slot's fence, read, write and commit are one step; the fence's part is tested
on the broker); the order of markers and records in a partition (a slot meets its partition's newest marker:
with the check on, no driver commits a record after a marker newer than its epoch, so the real read, back from
the end to the slot's record, meets that marker too; with it off, markers are not read at all); more than one
zombie at a time; the operator's drain (it looks at the checkpoint, not at the ledger's history the rescale
here waits on) and what a refusal asks of the user; stateless starts from ``earliest`` and restores of another
identity's snapshot (duplicates by design); batch-complete records, dead letters."""
from __future__ import annotations

from dataclasses import replace

from eos_job import protocol
from eos_job.protocol import BatchHistoryRecord, SlotAction, SlotLedgerRecord

from .world import (MAX_IDS, SPEC_HASHES, Checkpoint, Driver, World, history_of, input_digest, log_text, plan,
                    ranges, record_history, slot_of, violation)

OPS = ("append", "batch", "kill-after-0-slots", "kill-after-1-slot", "kill-before-commit-log", "snapshot",
       "restore-latest", "restore-oldest")
RESCALING = (*OPS, "rescale")
ZOMBIES = (*OPS, "split", "zombie-batch")
# Zombies of another generation or checkpoint identity: the zombie's batches cut into steps, the new driver
# of a rescale or a stateless start after the split.
ELSEWHERE = (*ZOMBIES, "zombie-plan", "zombie-slot", "rescale", "stateless")
# Restores as the operator launches them: replayOffsetsFrom names the checkpoint the stream ran on, and a
# restore may come with a parallelism change.
REPLAYING = ("append", "batch", "kill-after-0-slots", "kill-after-1-slot", "kill-before-commit-log", "snapshot",
             "rescale", "restore-replaying", "restore-rescaled")
# job.slotsFrom changes (a new generation cutting the batch otherwise), alone and with restores, beside rescales.
RESLOTTING = (*REPLAYING, "reslot", "restore-reslotted")
# A ledger that forgets its last records (less durable than the start check asks), and compaction.
FORGETTING = (*REPLAYING, "ledger-forgets")
COMPACTING = (*ELSEWHERE, "compact")
SAFE = frozenset({"input-check", "ledger-skip", "epoch", "history-first", "stream-epoch", "driver-fence",
                  "ledger-durable", "spec-check"})


class DriverFailed(Exception):
    """The driver stopped with an error: the next start goes on. ``refused``: a batch it may not run (another
    generation's or spec's partial batch), which every start refuses again until something else changes."""

    def __init__(self, reason: str, refused: bool = False):
        super().__init__(reason)
        self.refused = refused


def start(w: World) -> None:
    """A driver start: its generation into the generation history; the next epoch, marked in every slot
    partition of every generation that ever wrote and stamped on its own slot records; its view of the batch
    history; then re-run what the ledger recorded beyond the checkpoint, and what the previous checkpoint
    (replayOffsetsFrom) logged, with their original input (``eos_job.replay.catch_up``: the ledger's record
    first), each batch judged against the ledger. Without the ``history-first`` safety the driver does what it
    did before: it re-runs the previous checkpoint's batches before it has read the ledger's history, so they
    are judged against nothing."""
    w.started = True
    w.generations |= {(w.generation, w.n_slots)}
    w.epoch += 1
    width = max(s for _, s in w.generations)
    w.markers = tuple(w.epoch if p < width else m for p, m in enumerate(w.markers))
    if "epoch" in w.safeties:
        for slot in range(w.n_slots):
            k = (w.ckpt.ident, w.generation, slot)
            old = w.slots.get(k)
            w.slots[k] = replace(old, epoch=w.epoch) if old is not None else SlotLedgerRecord(-1, 0, 0, epoch=w.epoch)
    w.view = history_of(w, w.ckpt.ident)
    checked = "input-check" in w.safeties
    previous = w.previous if w.previous is not None and w.previous.ident == w.ckpt.ident else None
    elsewhere = frozenset(n for n, _ in previous.offsets) if previous is not None else frozenset()
    if elsewhere and not ("history-first" in w.safeties and checked):
        replay(w, protocol.catch_up(w.ckpt.committed, {}, elsewhere), previous, judged=False)
    if checked:
        replay(w, protocol.catch_up(w.ckpt.committed, w.view, elsewhere if "history-first" in w.safeties
                                    else frozenset()), previous)


def replay(w: World, planned: tuple[list[int], str | None], previous: Checkpoint | None,
           judged: bool = True) -> None:
    batches, error = planned
    if error:
        raise DriverFailed(error)
    for n in batches:
        recorded = w.view.get(n) if judged else None
        if recorded is not None:
            start_, end = (int(x) for x in recorded.offset_log.split(":"))
        else:
            start_, end = previous.offset(n)
        w.ckpt = w.ckpt.logging(n, (start_, end))
        run_batch(w, kill_after=None, judged=judged)


def untouched(w: World, ident: str, recorded: BatchHistoryRecord) -> bool:
    """No slot of the generation that recorded a batch holds it or a later one: read after the driver's start
    fenced every generation's transactional ids (``BatchWriter._untouched``), an intent none of whose slots
    committed, which ``judge_batch`` then lets run."""
    return all((r := w.slots.get((ident, recorded.generation, s))) is None or r.batch < recorded.batch
               for s in range(recorded.slots))


def driver(w: World, zombie: bool) -> Driver:
    return w.zombie if zombie else Driver(w.ckpt, w.epoch, w.generation, w.n_slots, w.view, spec=w.spec,
                                          slots_from=w.slots_from)


def run_batch(w: World, kill_after: int | None, kill_before_commit_log: bool = False, zombie: bool = False,
              judged: bool = True, step: str = "batch") -> bool:
    """One batch of the driver (or of the zombie): False if there was nothing to run. ``kill_after``: the
    driver dies after that many slots. ``judged`` false: the driver has not read the ledger's history yet.
    The zombie's ``step``: "plan" plans, judges and records its batch (in flight); "slot" runs the next slot
    of the batch in flight (the last one also completes it); "batch" the rest of it, or a whole batch."""
    if not zombie and not w.started:
        start(w)
    d = driver(w, zombie)

    def failed(reason: str, refused: bool = False) -> DriverFailed:
        if zombie:
            w.zombie = None
        else:
            w.started = False
        return DriverFailed(reason, refused)

    def update(**changes) -> None:
        nonlocal d
        d = Driver(changes.get("ckpt", d.ckpt), d.epoch, d.generation, d.n_slots, changes.get("view", d.view),
                   changes.get("inflight", d.inflight), d.spec, d.slots_from)
        if zombie:
            w.zombie = d
        else:
            w.ckpt, w.view = d.ckpt, d.view
            w.verify()

    def watch() -> None:
        """Before a write to partition 0: a newer epoch there stops the driver for good (the fenced
        ``<prefix>-driver`` writer; without it the start's one look found no newer epoch and it writes on)."""
        if streamed and "driver-fence" in w.safeties and w.epoch > d.epoch:
            raise failed(f"a newer driver (epoch {w.epoch}) runs this stream")

    streamed = {"epoch", "stream-epoch"} <= w.safeties     # the markers and partition 0 are read
    output = SPEC_HASHES[d.spec]
    # Slots fixed by the input (amendment A1); without ``spec-check`` key slots are taken for such.
    inputs = d.slots_from == "sourcePartitions" or "spec-check" not in w.safeties
    first = 0
    if d.inflight is not None:
        n, begin, end, first = d.inflight
        update(inflight=None)
    else:
        planned = plan(d.ckpt, w.source)
        if planned is None:
            return False
        n, (begin, end) = planned
        update(ckpt=d.ckpt.logging(n, (begin, end)))
        if "input-check" in w.safeties:
            recorded = d.view.get(n) if judged else None
            verdict = protocol.judge_batch(n, ranges((begin, end)), recorded, d.generation, output,
                                           input_slots=inputs)
            if verdict.action == "refuse" and untouched(w, d.ckpt.ident, recorded):
                verdict = protocol.judge_batch(n, ranges((begin, end)), recorded, d.generation, output,
                                               untouched=True, input_slots=inputs)
            if verdict.action in ("refuse", "replan"):
                raise failed(verdict.reason, refused=verdict.action == "refuse")
            if verdict.action == "skip":        # complete under another generation: nothing is written
                update(ckpt=d.ckpt.committing(n))
                return True
        if not judged or n not in d.view or not d.view[n].complete:
            watch()
            intent = BatchHistoryRecord(n, d.generation, d.n_slots, ranges((begin, end)), log_text((begin, end)),
                                        output, epoch=d.epoch)
            record_history(w, d.ckpt.ident, intent)
            update(view={**d.view, n: intent})
        if step == "plan":
            update(inflight=(n, begin, end, 0))
            return True
    digest = input_digest(begin, end) if "input-check" in w.safeties else ""
    epoch = d.epoch if "epoch" in w.safeties else 0
    for slot in range(first, d.n_slots):
        if step == "slot" and slot > first:
            update(inflight=(n, begin, end, slot))
            return True
        if kill_after is not None and slot == kill_after:
            w.started = False
            return True
        rows = [i for i in range(begin, end) if slot_of(w, i, d.n_slots, d.epoch, d.spec, d.slots_from) == slot]
        k = (d.ckpt.ident, d.generation, slot)
        decision = protocol.decide_slot(n, w.slots.get(k), input=digest, output_hash=output, epoch=epoch,
                                        stream_epoch=w.markers[slot] if streamed else 0, input_slots=inputs)
        if decision.action in (SlotAction.REPLAN, SlotAction.SUPERSEDED, SlotAction.REFUSE):
            raise failed(decision.reason, refused=decision.action is SlotAction.REFUSE)
        skip = decision.action is SlotAction.SKIP and "ledger-skip" in w.safeties
        if not skip and rows:      # the sink writes no transaction for an empty slot
            w.sink.extend(rows)
            w.slots[k] = SlotLedgerRecord(n, len(rows), 0, input=digest, output_hash=output, epoch=d.epoch)
    watch()
    done = replace(d.view[n], complete=True)
    record_history(w, d.ckpt.ident, done)
    update(view={**d.view, n: done})
    if kill_before_commit_log:
        w.started = False
        return True
    update(ckpt=d.ckpt.committing(n))
    return True


def apply(w: World, op: str) -> bool:
    """Apply ``op``; False if it does not apply in this state (the sequence is not explored further)."""
    if op == "ledger-forgets":
        return w.forget()
    if op == "compact":
        return w.compact()
    before = w.ledger_state() if w.forgetful else None
    applies = _apply(w, op)
    if before is not None and applies and w.ledger_state() != before:
        w.before_last = before
    return applies


def _apply(w: World, op: str) -> bool:
    if w.broken and op not in ("append", "rollback"):
        return False      # the broken spec's driver fails at once; the operator rolls back
    try:
        if op == "append":
            if w.source >= w.max_ids:
                return False
            w.source += 1
        elif op == "batch":
            return run_batch(w, None)
        elif op.startswith("kill-after-"):
            return run_batch(w, int(op.split("-")[2]))
        elif op == "kill-before-commit-log":
            return run_batch(w, None, kill_before_commit_log=True)
        elif op == "snapshot":
            if len(w.snapshots) >= 2 or w.ckpt.committed is None:
                return False
            w.snapshots.append(w.ckpt)
        elif op == "rescale":
            return w.rescale()
        elif op == "reslot":
            return w.reslot()
        elif op == "upgrade":
            return w.upgrade()
        elif op == "rollback":
            return w.rollback()
        elif op == "broken-batch":
            # The upgraded spec runs a batch, commits its first slot and fails in the next, every time.
            if w.upgrading is None or not run_batch(w, kill_after=1) or w.upgrading is None:
                return False      # nothing to run, or a replay on the way committed: the upgrade is verified
            w.broken = True
        elif op in ("restore-replaying", "restore-rescaled", "restore-reslotted"):
            # spec.restoreFrom as the operator launches it: the oldest snapshot into a new checkpoint location,
            # replayOffsetsFrom naming the one the stream ran on (kept for later restarts), and with
            # "restore-rescaled" a job.parallelism change in the same spec.
            if not w.snapshots or (op == "restore-rescaled" and not w.rescale()) or (
                    op == "restore-reslotted" and not w.reslot()):
                return False
            w.previous, w.ckpt = w.ckpt, w.snapshots[0]
            w.started = False
        elif op.startswith("restore-"):
            if not w.snapshots:
                return False
            w.ckpt = w.snapshots[-1] if op == "restore-latest" else w.snapshots[0]
            w.started = False
        elif op == "stateless":
            # upgradeMode stateless with startingOffsets latest, once the checkpoint consumed the source: a
            # fresh checkpoint of another identity; "latest" is resolved after the new driver's claim, so the
            # driver starts here.
            if w.ckpt.ident != "c0" or plan(w.ckpt, w.source) is not None:
                return False
            w.ckpt, w.snapshots, w.previous = Checkpoint("c1", origin=w.source), [], None
            start(w)
        elif op == "split":
            # The running driver is given up for dead but keeps running on its own copy of the checkpoint;
            # the next operation of the stream starts a new driver.
            if not w.started or w.zombie is not None:
                return False
            w.zombie = driver(w, zombie=False)
            w.started = False
        elif op.startswith("zombie-"):
            step = op.split("-")[1]
            if w.zombie is None or (step == "plan" and w.zombie.inflight is not None) or \
                    (step == "slot" and w.zombie.inflight is None):
                return False
            return run_batch(w, None, zombie=True, step=step)
    except DriverFailed:
        pass   # the driver exited; the next operation starts a new one
    return True


def finish(w: World) -> str | None:
    """A clean restart that runs until the source is consumed (a re-planned batch on the way is a restart
    too). Returns the reason if the stream stops for good instead: a batch refused on every start."""
    w.started = False
    if w.broken:
        w.rollback()          # upgradeReadinessTimeoutSeconds
    for _ in range(40):
        try:
            if not run_batch(w, None):
                return None
        except DriverFailed as exc:
            if exc.refused:
                return str(exc)
    raise AssertionError("the stream does not finish")


def explore(safeties: frozenset[str], depth: int = 100, ops: tuple[str, ...] = OPS, max_ids: int = MAX_IDS,
            slots_from: str = "key", invariant=None) -> tuple[int, list[tuple[tuple[str, ...], str]], list]:
    """Every reachable state, breadth first (shortest sequences first), each state expanded once; up to
    ``depth`` operations (the default reaches the fixpoint: no new state). Returns the lifecycles checked,
    the violations (also of ``invariant(world) -> str | None`` in every state reached) and the lifecycles
    whose finish stopped at a refusal (sequence, reason)."""
    initial = World(safeties, source=2, max_ids=max_ids, slots_from=slots_from, forgetful="ledger-forgets" in ops)
    frontier = [((), initial)]
    seen = {initial.key()}
    checked, found, refusals = 0, [], []
    for _ in range(depth):
        if not frontier:
            break
        nxt = []
        for sequence, w in frontier:
            for op in ops:
                w2 = w.copy()
                if not apply(w2, op):
                    continue
                k = w2.key()
                if k in seen:
                    continue
                seen.add(k)
                nxt.append((sequence + (op,), w2))
                done = w2.copy()
                checked += 1
                try:
                    refused = finish(done)
                except AssertionError as stuck:      # a stream wedged without a refusal: a violation too
                    found.append((sequence + (op,), f"stuck: {stuck}"))
                    continue
                if refused is not None:
                    refusals.append((sequence + (op,), refused))
                v = violation(done, refused) or (invariant and invariant(w2))
                if v:
                    found.append((sequence + (op,), v))
        frontier = nxt
    return checked, found, refusals
