"""Test-only fault injection: the driver is SIGKILLed at named points of the write path.

Nothing happens unless a test sets one of these environment variables. They are
read once per process, at the first hook call; Spark's Python workers inherit
the driver's environment through the JVM (local mode), so the hooks fire there.

``EOS_FAULT_KILL_AFTER_COMMIT=<p>``
    ``slot_committed``: right after a slot's transaction committed, before the
    driver hears of it, kill the driver's process group with probability p
    (drawn per slot and batch).
``EOS_FAULT_KILL_BEFORE_COMMIT_LOG=<p>``
    ``batch_in_sink``: every slot and the batch-complete record are in the
    sink, Spark's ``commits/N`` is not: kill the driver with probability p
    (drawn per batch).
``EOS_FAULT_KILL_IN_TRANSACTION=<p>``
    ``in_transaction``: a slot produced its records and its ledger record, its
    transaction is open, the commit not yet sent: kill with probability p.
``EOS_FAULT_KILL_DURING_COMMIT=<p>``
    ``committing``: with probability p, a timer kills the driver 0-20 ms after
    the slot sent its commit: the kill lands while the commit is in flight.
``EOS_FAULT_HOLD_OPEN=<seconds>``
    ``in_transaction``: the first transaction of a slot task stays open this
    long before its commit (longer than transaction.timeout.ms: Kafka aborts
    it, and the slot must fence again and write it once).
``EOS_FAULT_HOLD_RELEASE=<file>``
    The hold above ends early once this file exists (a test releases it when
    another driver has done what the scenario needs).
``EOS_FAULT_FROM_BATCH=<n>``
    The kill and hold faults above fire only from batch n on, so a run commits
    something before its planned kill.
``EOS_FAULT_JOURNAL=<file>``
    Every fault also appends what it does to this file, synced before a kill.
``EOS_FAULT_PARTIAL_BATCH=<batch>:<slot>``
    From that batch on, every other slot waits 120 s before its transaction
    (``before_slot_commit``) and the chosen one kills the driver once it
    committed (``slot_committed``): a partially committed batch.

``EOS_FAULT_COMMIT_OUTCOME_LOST=<batch>:<slot>``
    ``commit_returned``: the first commit of that slot and batch in this process
    applies, then the slot task sees an error as if its outcome were lost (a
    timeout after the coordinator wrote the commit).

``EOS_UNSAFE_DISABLE=<safety>[,<safety>...]``
    Negative controls: switch a safety of the protocol off, so a test can show
    that its verifier reports the violation that follows. ``input-check``: the
    driver neither compares a batch's input with the ledger's nor re-runs a
    checkpoint that is behind the ledger; ``ledger-skip``: a slot writes even
    when the ledger says its batch is committed; ``fence``: every producer of a
    slot (and every epoch stamp) takes a transactional id of its own, so
    ``init_transactions`` aborts nothing an older attempt left open, and a
    ledger read an open transaction holds back is taken as the answer;
    ``slot-order``: with ``job.slotsFrom: sourcePartitions`` the source
    partitions are ranked into slots the other way round; ``stream-epoch``: a
    slot ignores the epoch markers a newer driver of the stream wrote into its
    ledger partition and the driver ignores newer epochs in partition 0, so a
    driver of an older generation or another checkpoint is superseded only by a
    stamp on its own keys (what the protocol did before); ``spec-check``: a
    batch another spec left partial is finished by this one even when its slots
    are cut by key (as if ``job.slotsFrom: sourcePartitions``); ``poison-alone``:
    a record the broker refused with a record error is a dead letter at once,
    even when the request it was in was refused whole; ``held-clean``: a slot's
    producer held in a worker stays trusted (no fence, no ledger read, amendment
    A2) after a failed or unknown commit, so a commit that applied but whose
    outcome was lost is written again by the retry. Never set
    in production; the driver logs an error when one is.

    Two guards keep them out of a stream's reach. No spec can set an ``EOS_*``
    variable (``spec_rules.spark_env_errors``, the Pod templates' rule, the CRD's
    CEL rules), and only the driver reads this one, from its own process
    environment (``unsafe_switches``), which the operator builds without it: the
    driver carries the set into the slot tasks' config (``SlotWriterConfig.unsafe``),
    and a Python worker ignores the variable in its own environment, where
    Spark settings such as ``spark.executorEnv.*`` would put it.

Every kill takes every process of the driver, as a container kill or a crashed
node does: ``driver_starting`` records the driver's process and group
(``EOS_DRIVER_PID``, ``EOS_DRIVER_PGID``), and a kill SIGKILLs the driver's
group, every process descending from the driver (the JVM, PySpark's daemon and
its workers, which put themselves in a process group of their own) and their
groups, the killing process last. Killing only the driver's group let the
worker that held the transaction go on and commit.
"""
from __future__ import annotations

import logging
import os
import random
import threading
import time
from dataclasses import dataclass

from .process_tree import descendants, kill_tree

log = logging.getLogger(__name__)

KILL_AFTER_COMMIT_ENV = "EOS_FAULT_KILL_AFTER_COMMIT"
KILL_BEFORE_COMMIT_LOG_ENV = "EOS_FAULT_KILL_BEFORE_COMMIT_LOG"
PARTIAL_BATCH_ENV = "EOS_FAULT_PARTIAL_BATCH"
KILL_IN_TRANSACTION_ENV = "EOS_FAULT_KILL_IN_TRANSACTION"
KILL_DURING_COMMIT_ENV = "EOS_FAULT_KILL_DURING_COMMIT"
HOLD_OPEN_ENV = "EOS_FAULT_HOLD_OPEN"
HOLD_IN_SINK_ENV = "EOS_FAULT_HOLD_IN_SINK"
HOLD_RELEASE_ENV = "EOS_FAULT_HOLD_RELEASE"
FROM_BATCH_ENV = "EOS_FAULT_FROM_BATCH"
UNSAFE_ENV = "EOS_UNSAFE_DISABLE"
JOURNAL_ENV = "EOS_FAULT_JOURNAL"
SAFETIES = ("input-check", "ledger-skip", "fence", "slot-order", "stream-epoch", "spec-check", "poison-alone",
            "held-clean")
COMMIT_OUTCOME_LOST_ENV = "EOS_FAULT_COMMIT_OUTCOME_LOST"
DRIVER_PGID_ENV = "EOS_DRIVER_PGID"
DRIVER_PID_ENV = "EOS_DRIVER_PID"
PARTIAL_HOLD_S = 120   # long enough for the driver to be killed meanwhile

# An indirection the unit tests replace.
_sleep = time.sleep


@dataclass(frozen=True)
class Faults:
    kill_after_commit: float = 0.0
    kill_before_commit_log: float = 0.0
    partial_batch: tuple[int, int] | None = None   # (batch, slot)
    kill_in_transaction: float = 0.0
    kill_during_commit: float = 0.0
    hold_open_s: float = 0.0
    hold_in_sink_s: float = 0.0   # the driver pauses once after a batch reached the sink, before commits/N
    from_batch: int = 0
    hold_release: str = ""
    outcome_lost: tuple[int, int] | None = None   # (batch, slot) whose first commit's outcome is lost

    @property
    def enabled(self) -> bool:
        return (self.kill_after_commit > 0 or self.kill_before_commit_log > 0 or self.partial_batch is not None
                or self.kill_in_transaction > 0 or self.kill_during_commit > 0 or self.hold_open_s > 0
                or self.hold_in_sink_s > 0 or self.outcome_lost is not None)

    @classmethod
    def from_env(cls, env) -> Faults:
        partial = None
        raw = env.get(PARTIAL_BATCH_ENV, "")
        if raw:
            batch, slot = raw.split(":")
            partial = int(batch), int(slot)
        lost = None
        raw = env.get(COMMIT_OUTCOME_LOST_ENV, "")
        if raw:
            batch, slot = raw.split(":")
            lost = int(batch), int(slot)
        return cls(kill_after_commit=float(env.get(KILL_AFTER_COMMIT_ENV, "0") or 0),
                   kill_before_commit_log=float(env.get(KILL_BEFORE_COMMIT_LOG_ENV, "0") or 0),
                   partial_batch=partial,
                   kill_in_transaction=float(env.get(KILL_IN_TRANSACTION_ENV, "0") or 0),
                   kill_during_commit=float(env.get(KILL_DURING_COMMIT_ENV, "0") or 0),
                   hold_open_s=float(env.get(HOLD_OPEN_ENV, "0") or 0),
                   hold_in_sink_s=float(env.get(HOLD_IN_SINK_ENV, "0") or 0),
                   from_batch=int(env.get(FROM_BATCH_ENV, "0") or 0),
                   hold_release=env.get(HOLD_RELEASE_ENV, ""), outcome_lost=lost)


def parse_unsafe(env) -> frozenset[str]:
    """The safeties ``EOS_UNSAFE_DISABLE`` in ``env`` switches off; an unknown one is an error."""
    unsafe = frozenset(s.strip() for s in env.get(UNSAFE_ENV, "").split(",") if s.strip())
    unknown = unsafe - set(SAFETIES)
    if unknown:
        raise ValueError(f"{UNSAFE_ENV}: unknown safety {sorted(unknown)}; known: {', '.join(SAFETIES)}")
    return unsafe


_current: Faults | None = None
_held_in_sink: list[int] = []   # the batch the hold-in-sink fault held (once per process)
_outcomes_lost: set[tuple[int, int]] = set()   # the outcome-lost fault fired (once per batch and slot)
_driver_unsafe: frozenset[str] | None = None


def current() -> Faults:
    """This process's fault settings, read from the environment once."""
    global _current
    if _current is None:
        _current = Faults.from_env(os.environ)
    return _current


def reset() -> None:
    """Read the environment again at the next hook (tests)."""
    global _current, _driver_unsafe
    _current = None
    _driver_unsafe = None
    _held_in_sink.clear()
    _outcomes_lost.clear()


# ------------------------------------------------------------------ hooks
def unsafe_switches() -> frozenset[str]:
    """The negative controls of this driver: ``EOS_UNSAFE_DISABLE`` of the driver's own process environment,
    read once. In a Spark task (a Python worker) always empty, whatever its environment says: a worker
    knows only the set its driver put into the task's config."""
    global _driver_unsafe
    if _in_spark_task():
        return frozenset()
    if _driver_unsafe is None:
        _driver_unsafe = parse_unsafe(os.environ)
    return _driver_unsafe


def _in_spark_task() -> bool:
    try:
        from pyspark import TaskContext
    except ImportError:
        return False
    return TaskContext.get() is not None


def unsafe(safety: str, switched_off: frozenset[str] | None = None) -> bool:
    """Whether a negative control switched ``safety`` off (see the module's docstring): in ``switched_off``, the
    set a slot task's config carries, or, on the driver (None), in ``unsafe_switches()``."""
    off = safety in (unsafe_switches() if switched_off is None else switched_off)
    if off:
        log.error("UNSAFE: the %s safety of the exactly-once protocol is switched off (%s) for a negative "
                  "control; the output will not be exact", safety, UNSAFE_ENV)
    return off


def transactional_id(txid: str, switched_off: frozenset[str] | None = None) -> str:
    """The transactional id a producer of ``txid`` really uses: ``txid`` itself, unless the ``fence``
    negative control gives each producer an id of its own (then its fence aborts nothing). ``switched_off``
    as for ``unsafe``."""
    if unsafe("fence", switched_off):
        return f"{txid}-unfenced-{os.getpid()}-{time.time_ns()}"
    return txid


def driver_starting() -> None:
    """The driver, before its SparkSession starts: let the Python workers know which group to kill."""
    if current().enabled:
        os.environ[DRIVER_PGID_ENV] = str(os.getpgrp())  # inherited by the JVM and its Python workers
        os.environ[DRIVER_PID_ENV] = str(os.getpid())


def before_slot_commit(batch: int, slot: int) -> None:
    """A slot task, before its transaction: in the partial-batch fault every other slot waits."""
    f = current()
    if f.partial_batch is not None and batch >= f.partial_batch[0] and slot != f.partial_batch[1]:
        _sleep(PARTIAL_HOLD_S)


def slot_committed(batch: int, slot: int) -> None:
    """A slot task, right after its transaction committed, before the driver hears of it."""
    f = current()
    if not f.enabled:
        return
    if f.kill_after_commit > 0 and batch >= f.from_batch:
        rng = random.Random(hash((batch, slot, os.getpid(), time.time_ns())))
        if rng.random() < f.kill_after_commit:
            _say("fault injection: killing the driver after slot %d of batch %d committed", slot, batch)
            kill_driver()
    if f.partial_batch is not None and batch >= f.partial_batch[0] and slot == f.partial_batch[1]:
        _say("fault injection: killing the driver after slot %d of batch %d committed (partial batch)",
                    slot, batch)
        kill_driver()


def in_transaction(batch: int, slot: int, round_no: int, producer=None) -> None:
    """A slot task with its transaction open (records and ledger record produced), before the commit. A kill
    here flushes ``producer`` first, so the transaction it leaves open is open on the broker."""
    f = current()
    if batch < f.from_batch:
        return
    if f.hold_open_s > 0 and round_no == 0:
        _say("fault injection: holding the transaction of slot %d batch %d open for %.0f s", slot, batch,
                    f.hold_open_s)
        _hold(f.hold_open_s, f.hold_release)
        _say("fault injection: committing the held transaction of slot %d batch %d", slot, batch)
    if f.kill_in_transaction > 0 and _draw(batch, slot) < f.kill_in_transaction:
        if producer is not None:
            producer.flush(30)
        _say("fault injection: killing the driver inside the open transaction of slot %d of batch %d",
                    slot, batch)
        kill_driver()


def committing(batch: int, slot: int, producer=None) -> None:
    """A slot task about to send its commit: a timer may kill the driver while the commit is in flight
    (``producer`` flushed first: the records are on the broker, and the kill falls into the commit itself)."""
    f = current()
    if batch < f.from_batch or f.kill_during_commit <= 0 or _draw(batch, slot) >= f.kill_during_commit:
        return
    if producer is not None:
        producer.flush(30)
    delay = random.uniform(0, 0.02)
    _say("fault injection: killing the driver %.0f ms into the commit of slot %d of batch %d",
                delay * 1000, slot, batch)
    timer = threading.Timer(delay, kill_driver)
    timer.daemon = True
    timer.start()


def commit_returned(batch: int, slot: int) -> None:
    """A slot's ``commit_transaction`` returned: the outcome-lost fault raises as if it had not (once per
    process, batch and slot)."""
    f = current()
    if f.outcome_lost != (batch, slot) or (batch, slot) in _outcomes_lost:
        return
    _outcomes_lost.add((batch, slot))
    from confluent_kafka import KafkaError, KafkaException
    _say("fault injection: the commit of slot %d of batch %d applied, its outcome lost", slot, batch)
    raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "injected: commit outcome lost"))


def _hold(seconds: float, release: str) -> None:
    """Sleep ``seconds``, or less once the file ``release`` exists."""
    if not release:
        _sleep(seconds)
        return
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not os.path.exists(release):
        _sleep(min(0.2, max(0.0, deadline - time.monotonic())))


def _say(fmt: str, *args) -> None:
    """Log what a fault does, and append it to ``EOS_FAULT_JOURNAL`` (synced before the kill that follows):
    a Python worker's stderr reaches the driver's log through the JVM, which the kill may stop first."""
    log.warning(fmt, *args)
    path = os.environ.get(JOURNAL_ENV)
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, ((fmt % args) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)


def _draw(batch: int, slot: int) -> float:
    return random.Random(hash((batch, slot, os.getpid(), time.time_ns()))).random()


def batch_in_sink(batch: int) -> None:
    """The driver, after every slot and the batch-complete record reached the sink, before ``commits/N``."""
    f = current()
    if f.hold_in_sink_s > 0 and batch >= f.from_batch and not _held_in_sink:
        _held_in_sink.append(batch)   # once per process: the test takes the checkpoint's store away meanwhile
        _say("fault injection: holding the driver after batch %d reached the sink, before commits/%d", batch, batch)
        _hold(f.hold_in_sink_s, f.hold_release)
        _say("fault injection: released after batch %d; writing commits/%d", batch, batch)
    p = f.kill_before_commit_log
    if p > 0 and batch >= current().from_batch and random.random() < p:
        _say("fault injection: killing the driver after batch %d reached the sink, before commits/%d",
                    batch, batch)
        kill_driver()


def _driver_pgid() -> int:
    return int(os.environ.get(DRIVER_PGID_ENV, os.getpgrp()))


def kill_driver() -> None:
    """SIGKILL every process of the driver (see the module's docstring), this one last."""
    root = int(os.environ.get(DRIVER_PID_ENV, "0") or 0)
    kill_tree(descendants(root) if root else [], {_driver_pgid()})
