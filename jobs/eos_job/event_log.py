"""Spark event logs in the stream's checkpoint store (``job.eventLog``), for Spark's History Server.

Where: by default ``<checkpoint.path>/eventlogs`` in the stream's own store, a sibling of ``live`` and
``snapshots``. That is the one place every store lets the driver write: for ``pvc`` and ``local`` the driver Pod
mounts only ``checkpoint.path``; for ``s3`` the stream's keys (or workload identity) already reach that bucket,
so the log needs no credential of its own. ``dir`` moves it elsewhere in the same store (a shared prefix that one
History Server reads for several streams); for ``pvc`` and ``local`` still under ``checkpoint.path``.

The Spark settings (:func:`spark_conf`):

* ``spark.eventLog.enabled``/``dir``: the listener that writes every job, stage, task, SQL and streaming-query
  event of the driver.
* ``spark.eventLog.rolling.enabled`` with ``maxFileSize``: a stream's driver runs for weeks; rolling cuts its log
  into files of that size (Spark's minimum is 10 MiB), which the History Server can compact
  (``spark.history.fs.eventLog.rolling.maxFilesToRetain``). On an object store a file is uploaded when it is
  closed (S3A cannot flush a part), so a running driver's log shows up file by file, and whole at its stop.
* ``spark.eventLog.compress``: zstd (Spark's default codec); the History Server reads it as it is.

Spark refuses to start when the directory is missing (``EventLogFileWriter``): :func:`prepare` creates it, on an
object store as a folder marker, before the session starts. :func:`close` stops the session before a driver that
ended cleanly exits: the log's last file is closed (uploaded, on an object store) and marked complete; left to the
JVM's shutdown hook, a Pod's container would end with its first process, the hook unfinished.
"""
from __future__ import annotations

from pydantic import Field

from .model import Model
from .spec_rules import CHECKPOINT_PATH_PATTERN, MAX_PATH

DEFAULT_SUBDIR = "eventlogs"


class EventLog(Model):
    enabled: bool = Field(False, description=(
        "Write Spark's event log (jobs, stages, tasks, the streaming query's progress) to the checkpoint store, "
        "for Spark's History Server (docs/operations.md). Costs the writes (compressed, a few MB per hour of "
        "batches) and a little driver CPU. A change restarts the driver."))
    dir: str | None = Field(None, max_length=MAX_PATH, pattern=CHECKPOINT_PATH_PATTERN, description=(
        "Directory in the stream's checkpoint store, absolute (the key prefix in the bucket for s3); default "
        "<checkpoint.path>/eventlogs. For pvc and local under checkpoint.path (the only part its Pods mount)."))
    max_file_size_mb: int = Field(128, ge=10, le=4096, description=(
        "Size at which a log file is closed and the next begun (spark.eventLog.rolling.maxFileSize); on s3 a "
        "file is visible once closed."))


def enabled(spec) -> EventLog | None:
    log = spec.job.event_log
    return log if log is not None and log.enabled else None


def location(spec) -> str:
    """Where the event log goes, as Spark spells it (``s3a://bucket/prefix``, or a path)."""
    log, ck = spec.job.event_log, spec.checkpoint
    path = (log.dir if log is not None and log.dir else f"{ck.path.rstrip('/')}/{DEFAULT_SUBDIR}").rstrip("/")
    if ck.store == "s3" and ck.s3 is not None:
        return f"s3a://{ck.s3.bucket}/{path.strip('/')}"
    return path


def spark_conf(spec) -> dict[str, str]:
    """The Spark settings of ``job.eventLog`` ({} when off)."""
    log = enabled(spec)
    if log is None:
        return {}
    return {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": location(spec),
        "spark.eventLog.rolling.enabled": "true",
        "spark.eventLog.rolling.maxFileSize": f"{log.max_file_size_mb}m",
        "spark.eventLog.compress": "true",
    }


def event_log_errors(spec) -> list[str]:
    """The settings above are the runtime's while ``job.eventLog.enabled``; a ``dir`` outside what a pvc or local
    store mounts is refused."""
    log = enabled(spec)
    if log is None:
        return []
    from .driver_metrics import owned_conf_errors
    errors = owned_conf_errors(spec, "job.eventLog", [k for k in spark_conf(spec)] + [
        k for k in spec.job.spark_conf if k.startswith("spark.eventLog.")], "the History Server recipe relies on it")
    ck = spec.checkpoint
    if log.dir and ck.store != "s3":
        root = ck.path.rstrip("/") + "/"
        if not (log.dir.rstrip("/") + "/").startswith(root):
            errors.append(f"job.eventLog.dir: {log.dir} is outside checkpoint.path {ck.path}, the only part of the "
                          f"{ck.store} store the driver Pod mounts; use a directory under it or leave dir unset")
    return errors


def prepare(spec) -> None:
    """Create the log's directory (Spark requires it): a folder, or an object store's folder marker."""
    if enabled(spec) is None:
        return
    from .storage import Loc
    loc = Loc.of(location(spec))
    loc.fs.create_dir(loc.path, recursive=True)


def close(spec, clean: bool, timeout_s: float = 30.0) -> None:
    """After a clean end (``clean``), stop the driver's SparkSession, which closes the event log, when
    ``job.eventLog`` is on; at most ``timeout_s`` (a store that does not answer must not hold the exit). A
    failed driver exits at once, as without an event log: its log stays incomplete (on an object store without
    its last file), and the restart is not delayed by S3A's retries against a store that may be the failure."""
    if enabled(spec) is None or not clean:
        return
    import threading

    from pyspark.sql import SparkSession
    spark = SparkSession.getActiveSession()
    if spark is None:
        return

    def stop() -> None:
        try:
            spark.stop()
        except Exception as exc:  # noqa: BLE001 - the run's outcome is decided; the log's end is best effort
            import logging
            logging.getLogger(__name__).warning("stopping Spark to close the event log failed: %s", exc)

    worker = threading.Thread(target=stop, daemon=True)
    worker.start()
    worker.join(timeout_s)
