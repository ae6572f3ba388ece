"""Pre-flight: can a (new) spec start from the state in a checkpoint? Answered by Spark, writing no output.

A copy of the checkpoint is cut so that its last committed batch N becomes the
replay batch (``checkpoint.Cut.replaying_batch``): ``offsets/N`` kept, ``commits/N``
and the state N wrote dropped. The config's query then runs on the copy with a
single trigger, so Spark re-runs exactly batch N against the restored state
version N, with the new transformation, and evaluates its output into a no-op
sink: no Kafka write, no ledger record. Spark's own checks decide (state schema
compatibility, analysis of the plan, the module's import). The copy is deleted
afterwards; the checkpoint itself is only read.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from . import checkpoint
from .checkpoint import Cut
from .spec import RunConfig
from .storage import Loc

log = logging.getLogger(__name__)

SCRATCH_MARK = ".eos-preflight-scratch"


@dataclass
class PreFlightResult:
    passed: bool
    batch: int | None = None
    message: str = ""
    error: str | None = None

    def termination(self, checkpoint_dir: str) -> dict:
        doc = {"reason": "PreFlightPassed" if self.passed else "PreFlightFailed", "checkpoint": checkpoint_dir,
               "batch": self.batch, "message": self.message, "error": self.error}
        return {k: v for k, v in doc.items() if v is not None and v != ""}


def _why(exc) -> str:
    """Spark's refusal in a line or two: the error class and, for state schemas, what differs."""
    from .runtime import _short

    line = re.sub(r"^\[STREAM_FAILED\] Query \[[^]]*\] terminated with exception: ", "", _short(exc))
    text = str(getattr(exc, "desc", None) or exc)
    detail = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("Existing ")]
    return (line + (" " + detail[0] if detail else ""))[:2000]


def evaluate_only(df, batch_id: int) -> None:
    """The pre-flight's foreachBatch: compute the batch completely, keep nothing."""
    df.write.format("noop").mode("overwrite").save()


def _prepare_scratch(scratch: str | Path | Loc, ckpt: str | Path | Loc) -> None:
    scratch, ckpt = Loc.of(scratch), Loc.of(ckpt)
    s, c = scratch.uri.rstrip("/") + "/", ckpt.uri.rstrip("/") + "/"
    if s.startswith(c) or c.startswith(s):
        raise ValueError(f"scratch {scratch} overlaps checkpoint {ckpt}; give the pre-flight its own directory")
    if scratch.iterdir() and not (scratch / SCRATCH_MARK).exists():
        raise ValueError(f"scratch {scratch} exists and is not a pre-flight scratch directory; refusing to "
                         "delete what is in it")
    scratch.rmtree()  # a crashed pre-flight's leftovers
    scratch.mkdir()
    (scratch / SCRATCH_MARK).write_text("")


def run_preflight(config: RunConfig, from_checkpoint: str | Path, scratch: str | Path, *, spark=None,
                  timeout_s: float = 600.0) -> PreFlightResult:
    """Re-run the last committed batch of ``from_checkpoint`` with ``config``'s query; never raises for Spark's no."""
    from .runtime import JobFailed, build_query, load_transform, spark_conf_for

    ckpt, scratch = Loc.of(from_checkpoint), Loc.of(scratch)
    # The last committed batch; before the first commit, the batch in flight: its state files and the
    # state schema may already be written, and a new spec must match them just the same.
    last = checkpoint.last_committed_batch(ckpt)
    if last is None:
        last = checkpoint.last_offsets_batch(ckpt)
    try:  # before starting a JVM: a module that does not import fails in a second
        load_transform(config.spec.job.module, config.spec.job.function)
    except JobFailed as failed:
        return PreFlightResult(False, last, error=str(failed))
    except Exception as failed:  # noqa: BLE001 - the module raised while imported
        return PreFlightResult(False, last, error=f"job.module: importing {config.spec.job.module} failed: "
                                                  f"{type(failed).__name__}: {failed}"[:2000])
    if last is None:
        return PreFlightResult(True, message=f"no state yet: checkpoint {ckpt} has no batch, "
                                             "the spec starts without state")
    _prepare_scratch(scratch, ckpt)
    query = None
    try:
        copy = scratch / "checkpoint"
        from .snapshot import SnapshotError, copy_cut
        try:
            copy_cut(ckpt, copy, Cut.replaying_batch(last))
        except SnapshotError as exc:
            return PreFlightResult(False, last, error=str(exc))
        try:
            if spark is None:
                from .session import build_spark_session
                spark = build_spark_session(f"eos-preflight-{config.stream.name}", conf=spark_conf_for(config))
            query = build_query(spark, config, evaluate_only, once=True, checkpoint_dir=copy.uri,
                                query_name=f"eos-preflight-{config.stream.namespace}-{config.stream.name}").start()
            query.awaitTermination(timeout_s)
            exc = query.exception()
        except JobFailed as failed:
            return PreFlightResult(False, last, error=str(failed))
        except Exception as failed:  # noqa: BLE001 - analysis or import errors of user code are the answer
            return PreFlightResult(False, last, error=_why(failed))
        if exc is not None:
            return PreFlightResult(False, last, error=_why(exc))
        if query.isActive:
            return PreFlightResult(False, last, error=f"batch {last} did not finish within {timeout_s:.0f}s")
        rerun = checkpoint.last_committed_batch(copy)
        if rerun is None or rerun < last:
            return PreFlightResult(False, last, error=f"Spark ended without re-running batch {last}")
        return PreFlightResult(True, last, message=f"batch {last} re-ran on the checkpoint's state with this spec")
    finally:
        if query is not None and query.isActive:
            query.stop()
        scratch.rmtree()
