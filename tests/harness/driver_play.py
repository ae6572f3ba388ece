"""Spark's part of a driver, played without Spark: the driver's own start and exactly-once batches through the
sink's write path, so that hundreds of drivers fit on one machine.

``kwok_drivers.py`` runs one per thread, for every Running driver Pod of a KWOK node (the scale benchmark). It
takes the Pod's command and environment as the driver does (``eos_job.cli``) and ends with its exit codes and
termination message (``play``):

* **Start**, as ``runtime.run``: the pre-flight (the sink topic; the ledger topic made and checked), the
  claim (``BatchWriter.claim``: the generation history, the stream's next driver epoch, stamped on every
  slot's newest ledger record of the checkpoint), the ledger's batch history of the checkpoint.
* **A micro-batch every** ``batch_seconds``, as Spark runs one: the offset log ``offsets/N`` (no input is
  read: partition 0 of every source topic at offset 0), the ``foreachBatch`` function (``BatchWriter``: the
  batch-input check and record, then one task per slot through ``sink.slot_task`` with ``records`` records:
  fence with the slot's transactional id, read its ledger record, output and ledger record in one
  transaction; then the batch-complete record), then ``commits/N`` and the checkpoint's ``metadata`` as Spark
  writes them. A batch logged without a commit (the previous driver died in it) is run again with its input.
* **Stop** (``stop`` set: SIGTERM, or the Pod deleted): after the running batch, reason ``Stopped``, with the
  snapshot-on-stop when asked. A superseded or refused driver exits 1, an unusable sink 3, as the driver does.

``TaskContext.get()`` is per thread here (``_task``): each slot task runs in its driver's own thread, as each
runs in its own Python worker under Spark, so many drivers can share one process.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import threading
import time
import uuid
from typing import Mapping

import pyarrow as pa
from pyspark import TaskContext

from eos_job import checkpoint, cli, faults, protocol
from eos_job.contract import BatchRefused, DriverSuperseded, JobFailed
from eos_job.ledger import SinkUnavailable
from eos_job.runtime import preflight
from eos_job.snapshot import take_snapshot
from eos_job.storage import Loc
from eos_job.writer import BatchWriter, RunSummary

log = logging.getLogger("eos_job.driver_play")


class _Task(threading.local):
    ctx: TaskContext | None = None


_task = _Task()
TaskContext.get = classmethod(lambda cls: _task.ctx)   # as pyspark's worker sets it up, one per thread


def is_driver(command: list[str], env: Mapping[str, str] = os.environ) -> bool:
    """The driver's command (``children.DRIVER_COMMAND``), not a drain."""
    return command[1:4] == ["-m", "eos_job", "run"] and "--drain" not in command and \
        env.get(cli.DRAIN_ENV, "") != "1"


def run_args(command: list[str], env: Mapping[str, str]) -> argparse.Namespace:
    """The driver's arguments (``eos_job run``) from its command; ``--snapshot-on-stop`` also from ``env``."""
    ap = argparse.ArgumentParser(prog="driver_play")
    ap.add_argument("--config")
    ap.add_argument("--config-env")
    ap.add_argument("--checkpoint")
    ap.add_argument("--snapshot-on-stop", default=env.get(cli.SNAPSHOT_ON_STOP_ENV) or None)
    args, _ = ap.parse_known_args(command[4:])
    args.command = "run"
    return args


class _Row(dict):
    def asDict(self) -> dict:   # noqa: N802 - Spark's Row
        return dict(self)


class MicroBatch:
    """What ``BatchWriter`` asks of Spark's DataFrame: ``repartition(P, key).mapInArrow(f, schema).collect()``
    runs ``f`` once per slot partition in a task whose ``TaskContext`` names the slot, over its records."""

    def __init__(self, batch: int, records: int):
        self.batch, self.records, self.slots, self.fn = batch, records, 0, None

    def repartition(self, slots: int, *_cols) -> "MicroBatch":
        self.slots = slots
        return self

    def mapInArrow(self, fn, _schema) -> "MicroBatch":   # noqa: N802 - Spark's name
        self.fn = fn
        return self

    def collect(self) -> list[_Row]:
        rows = []
        for slot in range(self.slots):
            ctx = _task.ctx = object.__new__(TaskContext)
            ctx._partitionId, ctx._attemptNumber, ctx._stageId, ctx._taskAttemptId = slot, 0, 0, slot
            try:
                for out in self.fn(iter([self.records_of(slot)])):
                    rows += [_Row(r) for r in out.to_pylist()]
            finally:
                _task.ctx = None
        return rows

    def records_of(self, slot: int) -> pa.RecordBatch:
        """Deterministic per (batch, slot), so a replayed batch has the same digest."""
        ids = [f"{self.batch}-{slot}-{i}" for i in range(self.records)]
        hashes = [hash((self.batch, slot, i)) & 0x7FFF_FFFF_FFFF_FFFF for i in range(self.records)]
        return pa.RecordBatch.from_pydict({"key": [i.encode() for i in ids], "value": [i.encode() for i in ids],
                                           protocol.HASH_COL: pa.array(hashes, pa.int64())})


def offset_log(batch: int, topics: list[str]) -> str:
    """``offsets/N`` in Spark's v1 format: the batch's metadata, then the Kafka source's positions."""
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": int(time.time() * 1000), "conf": {}}
    return "v1\n" + json.dumps(meta) + "\n" + json.dumps({t: {"0": 0} for t in topics})


def run_driver(cfg, stop: threading.Event, *, batch_seconds: float, records: int,
                snapshot_dir: str | None, gate=contextlib.nullcontext) -> RunSummary:
    """The driver's start, then a batch every ``batch_seconds`` until ``stop``; ``gate()`` is entered around
    the start and around each batch (many drivers in one process take turns at the broker)."""
    with gate():
        limits = preflight(cfg)
        ckpt = Loc.of(cfg.checkpoint_dir)
        ckpt.mkdir()
        faults.driver_starting()
        writer = BatchWriter(cfg, limits)
        log.info("%s: driver epoch %d, generation %d (played: a batch every %gs, %d record(s) per slot)",
                 cfg.stream.name, writer.claim(ckpt), writer.base["generation"], batch_seconds, records)
        if checkpoint.checkpoint_id(ckpt) is None:   # Spark writes it when the query first starts
            (ckpt / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}) + "\n")
        writer.load_history(ckpt)
        for sub in ("offsets", "commits"):
            (ckpt / sub).mkdir()
    while not stop.is_set():
        t0 = time.monotonic()
        with gate():
            last = checkpoint.last_committed_batch(ckpt)
            batch = 0 if last is None else last + 1
            if not (ckpt / "offsets" / str(batch)).exists():
                checkpoint.write_offset_log(ckpt, batch, offset_log(batch, cfg.spec.source.topics))
            writer(MicroBatch(batch, records), batch)
            (ckpt / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')
        stop.wait(max(0.0, batch_seconds - (time.monotonic() - t0)))
    writer.summary.reason = "Stopped"
    log.info("%s: stopped at a clean boundary after batch %s", cfg.stream.name, writer.last_done)
    if snapshot_dir:
        manifest = take_snapshot(cfg.checkpoint_dir, snapshot_dir, stream=cfg.stream.wire(),
                                 spec_hash=cfg.spec.spec_hash())
        writer.summary.snapshot = snapshot_dir
        log.info("snapshot written to %s at batch %s", snapshot_dir, manifest["lastBatch"])
    return writer.summary


def play(cfg, stop: threading.Event, **kw) -> tuple[int, RunSummary]:
    """``run_driver`` with ``eos_job.cli``'s exit codes and summary (the termination message)."""
    code = cli.EXIT_OK
    try:
        summary = run_driver(cfg, stop, **kw)
    except SinkUnavailable as exc:
        summary, code = RunSummary(reason="SinkUnavailable", error=str(exc)), cli.EXIT_SINK
    except (BatchRefused, DriverSuperseded) as exc:
        summary, code = RunSummary(reason=exc.REASON, error=str(exc)), cli.EXIT_FAILED
    except JobFailed as exc:
        summary, code = RunSummary(reason="Failed", error=str(exc)), cli.EXIT_FAILED
    if summary.error:
        log.error("%s: %s: %s", cfg.stream.name, summary.reason, summary.error)
    return code, summary
