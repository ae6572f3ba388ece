"""Re-running batches with their original input before Spark plans anything new.

A checkpoint can be behind what the sink holds: a restore of an older snapshot
of the same stream, a stream re-created on a stale checkpoint, a rollback. Spark
would plan the batches after the checkpoint's last commit again, from what the
source holds now: other ranges under the same numbers, so the ledger would skip
a batch whose records are not all in the sink (loss), or write records another
batch already wrote (duplicates). So the driver first re-runs those batches,
one trigger each, with the offsets they had the first time: every replayed slot
is then either in the sink (skipped) or written once.

The original offsets come from the ledger's batch history, which records
Spark's ``offsets/N`` file of every batch before its slots commit, or, for a
batch the ledger holds no record of, from the previous checkpoint
(``replayOffsetsFrom``, set by the operator on a restore and a rollback). The
history is read before any batch is re-run, so every replayed batch is judged
against the ledger (a batch complete under another generation is skipped whole,
one partially committed by another spec is refused), never written blind.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

from . import checkpoint, protocol
from .contract import BatchRefused, JobFailed
from .storage import Loc

log = logging.getLogger(__name__)

RunOnce = Callable[[int], None]   # runs one trigger of the query: the batch logged without a commit


def catch_up(ckpt: Loc, history: dict[int, protocol.BatchHistoryRecord], run_once: RunOnce,
             stop_event: threading.Event, previous: Loc | None = None) -> int:
    """Re-run, one trigger each, the batches after ``ckpt``'s last commit that the sink may already hold:
    those the ledger recorded for this checkpoint identity (``history``, loaded before anything runs) and
    those ``previous`` (``replayOffsetsFrom``: the checkpoint the stream ran on before) logged. Each runs with
    the input the ledger recorded for it, else with ``previous``'s ``offsets/N``; the writer then judges it
    against the ledger's record like any batch. Refuses (BatchRefused) when a batch's input is known to
    neither. Returns how many batches were re-run."""
    from .snapshot import copy_offset_file

    elsewhere = _previous_batches(ckpt, previous)
    batches, error = protocol.catch_up(checkpoint.last_committed_batch(ckpt), history, elsewhere)
    if error:
        raise BatchRefused(error)
    replayed = 0
    for n in batches:
        if stop_event.is_set():
            break
        recorded = history.get(n)
        logged = checkpoint.replay_batch(ckpt) == n
        if logged and (recorded is None or protocol.same_input(checkpoint.batch_input(ckpt, n), recorded.input)):
            pass   # the checkpoint's own offsets/N: Spark re-runs it as logged
        elif recorded is not None and recorded.offset_log:
            if logged:
                log.warning("batch %d: the checkpoint logged %s, the ledger recorded %s; re-running the ledger's",
                            n, protocol.describe_ranges(checkpoint.batch_input(ckpt, n)),
                            protocol.describe_ranges(recorded.input))
            checkpoint.write_offset_log(ckpt, n, recorded.offset_log)
        else:
            assert previous is not None and n in elsewhere   # protocol.catch_up said where N's input is
            copy_offset_file(previous, ckpt, n)
        _run(ckpt, n, run_once)
        replayed += 1
    if replayed:
        origin = " and ".join(w for w, used in (("the ledger", bool(history)),
                                                (str(previous), bool(elsewhere))) if used)
        log.info("re-ran %d batches with their original input from %s (through batch %s): the checkpoint was "
                 "behind the sink", replayed, origin or "the checkpoint", checkpoint.last_committed_batch(ckpt))
    return replayed


def _previous_batches(ckpt: Loc, previous: Loc | None) -> frozenset[int]:
    """The batches ``previous`` logged, if it is an earlier location of ``ckpt``'s lineage."""
    if previous is None or not previous.is_dir() or previous == ckpt:
        return frozenset()
    if checkpoint.checkpoint_id(previous) != checkpoint.checkpoint_id(ckpt):
        log.info("replay: %s is another checkpoint lineage (its ledger keys differ); nothing to replay", previous)
        return frozenset()
    return frozenset(checkpoint.offset_batches(previous))


def _next_batch(ckpt: Loc) -> int:
    last = checkpoint.last_committed_batch(ckpt)
    return 0 if last is None else last + 1


def _run(ckpt: Loc, batch: int, run_once: RunOnce) -> None:
    run_once(batch)
    done = checkpoint.last_committed_batch(ckpt)
    if done is None or done < batch:
        raise JobFailed(f"re-running batch {batch} with its original offsets did not commit it")
