"""A driver stand-in for the process kubelet: ``python -m eos_job run`` toward Kafka and the operator, without Spark.

Hundreds of streams cannot each run a JVM on one machine. A Pod whose image matches the kubelet's
``standin_image`` runs this program instead, given the Pod's command as its arguments, with the Pod's
environment and volumes. A command other than a driver's (``eos_job run`` without ``--drain``: pre-flight,
drain, probe and snapshot Pods) is exec'd as it is. A driver's is stood in: the run config is read as the
driver reads it (``eos_job.cli``), then the driver's own code runs, with only Spark's part played here:

* **Start**, as ``runtime.run``: the pre-flight (the sink topic; the ledger topic made and checked), the
  claim (``BatchWriter.claim``: the generation history, the stream's next driver epoch, stamped on every
  slot's newest ledger record of the checkpoint), the ledger's batch history of the checkpoint.
* **A micro-batch every** ``EOS_STANDIN_BATCH_SECONDS`` (default 5), as Spark runs one: the offset log
  ``offsets/N`` (the stand-in reads no input: partition 0 of every source topic at offset 0), the
  ``foreachBatch`` function (``BatchWriter``: the batch-input check and record, then one task per slot
  through the sink's write path ``sink.slot_task`` with ``EOS_STANDIN_RECORDS`` records (default 1): fence
  with the slot's transactional id, read its ledger record, output and ledger record in one transaction;
  then the batch-complete record), then ``commits/N`` and the checkpoint's ``metadata`` as Spark writes them.
  A batch logged without a commit (the previous driver died in it) is run again with its logged input.
* **SIGTERM**: stop after the running batch, exit 0 (reason ``Stopped``), with the snapshot-on-stop when
  ``EOS_SNAPSHOT_ON_STOP`` asks for one. A superseded or refused driver exits 1, an unusable sink 3, as the
  driver does.
* **Crashes**: the driver's own fault switches work unchanged, as the same hooks run (``eos_job.faults``:
  ``EOS_FAULT_KILL_AFTER_COMMIT``, ``EOS_FAULT_KILL_BEFORE_COMMIT_LOG``, ``EOS_FAULT_PARTIAL_BATCH``, ...,
  with ``EOS_FAULT_FROM_BATCH``); the kubelet's ``kill9`` SIGKILLs a stand-in at any moment.

``python -m tests.harness.standin --zygote`` is the fork server the kubelet starts stand-ins from
(``tests/harness/zygote.py``): they share the pages of all this code, imported once.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
import uuid

import pyarrow as pa
from pyspark import TaskContext

from eos_job import checkpoint, cli, faults, protocol
from eos_job.contract import BatchRefused, DriverSuperseded, JobFailed
from eos_job.ledger import SinkUnavailable
from eos_job.runtime import install_signal_handlers, preflight, termination_message_path
from eos_job.snapshot import take_snapshot
from eos_job.storage import Loc
from eos_job.writer import BatchWriter, RunSummary

from .zygote import serve

BATCH_SECONDS_ENV, RECORDS_ENV = "EOS_STANDIN_BATCH_SECONDS", "EOS_STANDIN_RECORDS"

log = logging.getLogger("eos_job.standin")


def is_driver(command: list[str]) -> bool:
    """The driver's command (``children.DRIVER_COMMAND``), not a drain."""
    return command[1:4] == ["-m", "eos_job", "run"] and "--drain" not in command and \
        os.environ.get(cli.DRAIN_ENV, "") != "1"


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
            ctx = TaskContext._taskContext = object.__new__(TaskContext)   # as pyspark's worker sets it up
            ctx._partitionId, ctx._attemptNumber, ctx._stageId, ctx._taskAttemptId = slot, 0, 0, slot
            try:
                for out in self.fn(iter([self.records_of(slot)])):
                    rows += [_Row(r) for r in out.to_pylist()]
            finally:
                TaskContext._taskContext = None
        return rows

    def records_of(self, slot: int) -> pa.RecordBatch:
        """Deterministic per (batch, slot), so a replayed batch has the same digest."""
        ids = [f"{self.batch}-{slot}-{i}" for i in range(self.records)]
        hashes = [hash((self.batch, slot, i)) & 0x7FFF_FFFF_FFFF_FFFF for i in range(self.records)]
        return pa.RecordBatch.from_pydict({"key": [i.encode() for i in ids], "value": [i.encode() for i in ids],
                                           protocol.HASH_COL: pa.array(hashes, pa.int64())})


def warm_up() -> None:
    """What a first batch initialises lazily, done once in the zygote: Arrow's first arrays (~38 MB of private
    memory per process otherwise) and the slot task's result rows."""
    from eos_job.sink import _commit_arrow_schema
    pa.RecordBatch.from_pylist([], schema=_commit_arrow_schema()).to_pylist()
    MicroBatch(0, 1).records_of(0).to_pylist()


def offset_log(batch: int, topics: list[str]) -> str:
    """``offsets/N`` in Spark's v1 format: the batch's metadata, then the Kafka source's positions."""
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": int(time.time() * 1000), "conf": {}}
    return "v1\n" + json.dumps(meta) + "\n" + json.dumps({t: {"0": 0} for t in topics})


def run_standin(cfg, stop: threading.Event, *, batch_seconds: float, records: int,
                snapshot_dir: str | None) -> RunSummary:
    limits = preflight(cfg)
    ckpt = Loc.of(cfg.checkpoint_dir)
    ckpt.mkdir()
    faults.driver_starting()
    writer = BatchWriter(cfg, limits)
    log.info("driver epoch %d, generation %d (stand-in: a batch every %gs, %d record(s) per slot)",
             writer.claim(ckpt), writer.base["generation"], batch_seconds, records)
    if checkpoint.checkpoint_id(ckpt) is None:   # Spark writes it when the query first starts
        (ckpt / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}) + "\n")
    writer.load_history(ckpt)
    for sub in ("offsets", "commits"):
        (ckpt / sub).mkdir()
    while not stop.is_set():
        t0 = time.monotonic()
        last = checkpoint.last_committed_batch(ckpt)
        batch = 0 if last is None else last + 1
        if not (ckpt / "offsets" / str(batch)).exists():
            checkpoint.write_offset_log(ckpt, batch, offset_log(batch, cfg.spec.source.topics))
        writer(MicroBatch(batch, records), batch)
        (ckpt / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')
        stop.wait(max(0.0, batch_seconds - (time.monotonic() - t0)))
    writer.summary.reason = "Stopped"
    log.info("stopped at a clean boundary after batch %s", writer.last_done)
    if snapshot_dir:
        manifest = take_snapshot(cfg.checkpoint_dir, snapshot_dir, stream=cfg.stream.wire(),
                                 spec_hash=cfg.spec.spec_hash())
        writer.summary.snapshot = snapshot_dir
        log.info("snapshot written to %s at batch %s", snapshot_dir, manifest["lastBatch"])
    return writer.summary


def main(argv: list[str]) -> int:
    """``argv``: the Pod's command. The exit codes and termination message of ``eos_job.cli``'s run."""
    if not is_driver(argv):
        os.execvp(argv[0], argv)
    ap = argparse.ArgumentParser(prog="standin")
    ap.add_argument("--config")
    ap.add_argument("--config-env")
    ap.add_argument("--checkpoint")
    ap.add_argument("--snapshot-on-stop", default=os.environ.get(cli.SNAPSHOT_ON_STOP_ENV) or None)
    args, _ = ap.parse_known_args(argv[4:])
    args.command = "run"
    logging.basicConfig(level=os.environ.get("EOS_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr, force=True)
    try:
        cfg = cli._load(args, cli._read(args))
    except (ValueError, OSError) as exc:
        print(f"{exc}", file=sys.stderr)
        return cli.EXIT_BAD_CONFIG
    stop = threading.Event()
    install_signal_handlers(stop)
    code = cli.EXIT_OK
    try:
        summary = run_standin(cfg, stop, batch_seconds=float(os.environ.get(BATCH_SECONDS_ENV, "5")),
                              records=int(os.environ.get(RECORDS_ENV, "1")), snapshot_dir=args.snapshot_on_stop)
    except SinkUnavailable as exc:
        summary, code = RunSummary(reason="SinkUnavailable", error=str(exc)), cli.EXIT_SINK
    except (BatchRefused, DriverSuperseded) as exc:
        summary, code = RunSummary(reason=exc.REASON, error=str(exc)), cli.EXIT_FAILED
    except JobFailed as exc:
        summary, code = RunSummary(reason="Failed", error=str(exc)), cli.EXIT_FAILED
    if summary.error:
        log.error("%s: %s", summary.reason, summary.error)
    path = termination_message_path()
    if path is not None:
        path.write_text(summary.to_json()[:4000])
    log.info("exit %d: %s", code, summary.to_json())
    return code


if __name__ == "__main__":
    if sys.argv[1:] == ["--zygote"]:
        warm_up()
        sys.exit(serve(main))
    sys.exit(main(sys.argv[1:]))
