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
``EOS_FAULT_PARTIAL_BATCH=<batch>:<slot>``
    From that batch on, every other slot waits 120 s before its transaction
    (``before_slot_commit``) and the chosen one kills the driver once it
    committed (``slot_committed``): a partially committed batch.

Python workers run in process groups of their own, so ``driver_starting``
records the driver's group in ``EOS_DRIVER_PGID`` for them to kill, as a
crashed node would take down the driver and its workers together.
"""
from __future__ import annotations

import logging
import os
import random
import signal
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)

KILL_AFTER_COMMIT_ENV = "EOS_FAULT_KILL_AFTER_COMMIT"
KILL_BEFORE_COMMIT_LOG_ENV = "EOS_FAULT_KILL_BEFORE_COMMIT_LOG"
PARTIAL_BATCH_ENV = "EOS_FAULT_PARTIAL_BATCH"
DRIVER_PGID_ENV = "EOS_DRIVER_PGID"
PARTIAL_HOLD_S = 120   # long enough for the driver to be killed meanwhile

# Indirections the unit tests replace.
_killpg = os.killpg
_sleep = time.sleep


@dataclass(frozen=True)
class Faults:
    kill_after_commit: float = 0.0
    kill_before_commit_log: float = 0.0
    partial_batch: tuple[int, int] | None = None   # (batch, slot)

    @property
    def enabled(self) -> bool:
        return self.kill_after_commit > 0 or self.kill_before_commit_log > 0 or self.partial_batch is not None

    @classmethod
    def from_env(cls, env) -> Faults:
        partial = None
        raw = env.get(PARTIAL_BATCH_ENV, "")
        if raw:
            batch, slot = raw.split(":")
            partial = int(batch), int(slot)
        return cls(kill_after_commit=float(env.get(KILL_AFTER_COMMIT_ENV, "0") or 0),
                   kill_before_commit_log=float(env.get(KILL_BEFORE_COMMIT_LOG_ENV, "0") or 0),
                   partial_batch=partial)


_current: Faults | None = None


def current() -> Faults:
    """This process's fault settings, read from the environment once."""
    global _current
    if _current is None:
        _current = Faults.from_env(os.environ)
    return _current


def reset() -> None:
    """Read the environment again at the next hook (tests)."""
    global _current
    _current = None


# ------------------------------------------------------------------ hooks
def driver_starting() -> None:
    """The driver, before its SparkSession starts: let the Python workers know which group to kill."""
    if current().enabled:
        os.environ[DRIVER_PGID_ENV] = str(os.getpgrp())  # inherited by the JVM and its Python workers


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
    if f.kill_after_commit > 0:
        rng = random.Random(hash((batch, slot, os.getpid(), time.time_ns())))
        if rng.random() < f.kill_after_commit:
            log.warning("fault injection: killing the driver after slot %d of batch %d committed", slot, batch)
            _killpg(_driver_pgid(), signal.SIGKILL)
    if f.partial_batch is not None and batch >= f.partial_batch[0] and slot == f.partial_batch[1]:
        log.warning("fault injection: killing the driver after slot %d of batch %d committed (partial batch)",
                    slot, batch)
        _killpg(_driver_pgid(), signal.SIGKILL)


def batch_in_sink(batch: int) -> None:
    """The driver, after every slot and the batch-complete record reached the sink, before ``commits/N``."""
    p = current().kill_before_commit_log
    if p > 0 and random.random() < p:
        log.warning("fault injection: killing the driver after batch %d reached the sink, before commits/%d",
                    batch, batch)
        _killpg(os.getpgrp(), signal.SIGKILL)


def _driver_pgid() -> int:
    return int(os.environ.get(DRIVER_PGID_ENV, os.getpgrp()))
