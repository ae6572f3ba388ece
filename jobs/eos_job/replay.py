"""Re-running batches with their original input before Spark plans anything new.

A checkpoint can be behind what the sink holds: a restore of an older snapshot
of the same stream, a stream re-created on a stale checkpoint, a rollback. Spark
would plan the batches after the checkpoint's last commit again, from what the
source holds now: other ranges under the same numbers, so the ledger would skip
a batch whose records are not all in the sink (loss), or write records another
batch already wrote (duplicates). So the driver first re-runs those batches,
one trigger each, with the offsets they had the first time: every replayed slot
is then either in the sink (skipped) or written once.

The original offsets come from the previous checkpoint (``replayOffsetsFrom``,
set by the operator on a restore) or from the ledger's batch history, which
records Spark's ``offsets/N`` file of every batch before its slots commit.
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


def from_checkpoint(ckpt: Loc, src: Loc, run_once: RunOnce, stop_event: threading.Event) -> int:
    """Re-run the batches ``src`` (the checkpoint the stream ran on before) logged after ``ckpt``'s last
    commit, each with its offsets from ``src``. Returns how many were re-run."""
    from .snapshot import copy_offset_file

    if not src.is_dir() or src == ckpt:
        return 0
    if checkpoint.checkpoint_id(src) != checkpoint.checkpoint_id(ckpt):
        log.info("replay: %s is another checkpoint lineage (its ledger keys differ); nothing to replay", src)
        return 0
    original = checkpoint.offset_batches(src)
    replayed = 0
    while original and not stop_event.is_set():
        nxt = _next_batch(ckpt)
        if nxt > original[-1]:
            break
        if checkpoint.replay_batch(ckpt) is None:
            if nxt not in original:
                raise JobFailed(f"cannot re-run batch {nxt} with its original offsets: {src} no longer has "
                                f"offsets/{nxt} (Spark keeps spark.sql.streaming.minBatchesToRetain batches). "
                                "Restore a newer snapshot, or raise minBatchesToRetain in job.sparkConf")
            copy_offset_file(src, ckpt, nxt)
        _run(ckpt, nxt, run_once)
        replayed += 1
    if replayed:
        log.info("re-ran %d batches after the snapshot with their original offsets from %s (through batch %s)",
                 replayed, src, checkpoint.last_committed_batch(ckpt))
    return replayed


def from_ledger(ckpt: Loc, history: dict[int, protocol.BatchHistoryRecord], run_once: RunOnce,
                stop_event: threading.Event) -> int:
    """Re-run the batches the ledger recorded for this checkpoint after its last commit, with the recorded
    offsets. Refuses (JobFailed) when the ledger is ahead but a batch's input is unknown."""
    batches, error = protocol.catch_up(checkpoint.last_committed_batch(ckpt), history)
    if error:
        raise BatchRefused(error)
    replayed = 0
    for n in batches:
        if stop_event.is_set():
            break
        recorded = history[n]
        if checkpoint.replay_batch(ckpt) == n:
            if protocol.same_input(checkpoint.batch_input(ckpt, n), recorded.input):
                _run(ckpt, n, run_once)
                replayed += 1
                continue
            log.warning("batch %d: the checkpoint logged %s, the ledger recorded %s; re-running the ledger's",
                        n, protocol.describe_ranges(checkpoint.batch_input(ckpt, n)),
                        protocol.describe_ranges(recorded.input))
        checkpoint.write_offset_log(ckpt, n, recorded.offset_log)
        _run(ckpt, n, run_once)
        replayed += 1
    if replayed:
        log.info("re-ran %d batches with the input the ledger recorded for them (through batch %s): the "
                 "checkpoint was behind the sink", replayed, checkpoint.last_committed_batch(ckpt))
    return replayed


def _next_batch(ckpt: Loc) -> int:
    last = checkpoint.last_committed_batch(ckpt)
    return 0 if last is None else last + 1


def _run(ckpt: Loc, batch: int, run_once: RunOnce) -> None:
    run_once(batch)
    done = checkpoint.last_committed_batch(ckpt)
    if done is None or done < batch:
        raise JobFailed(f"re-running batch {batch} with its original offsets did not commit it")
