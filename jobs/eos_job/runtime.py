"""The driver: builds the query from a RunConfig and runs it until stopped or failed.

What the user's transformation receives and must return: ``contract``.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from . import checkpoint, faults, protocol
from .contract import JobFailed, TransformContext, load_transform, prepare_output
from .ledger import (admin_client, base_config, ensure_ledger_topic, idempotent_producer,
                     produce_sync, require_topics, sink_security)
from .sink import COMMIT_SCHEMA, SlotWriterConfig, slot_task
from .spec import RunConfig

log = logging.getLogger("eos_job")


class StopRequested(RuntimeError):
    """Raised inside a batch that started after a graceful stop was requested: nothing of it is written."""


@dataclass
class RunSummary:
    reason: str
    last_committed_batch: int | None = None
    batches: int = 0
    records: int = 0
    skipped_slots: int = 0
    dead_letters: int = 0
    nondeterministic_slots: int = 0
    snapshot: str | None = None
    error: str | None = None

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in self.__dict__.items() if v is not None}, sort_keys=True)


class BatchWriter:
    """The ``foreachBatch`` function: one exactly-once write per micro-batch."""

    def __init__(self, config: RunConfig):
        self.config = config
        spec = config.spec
        self.slots = spec.job.parallelism
        self.lock = threading.Lock()
        self.stopping = False
        self.summary = RunSummary(reason="Running")
        self.last_done: int | None = None
        self._ckpt_id: str | None = None
        self._producer = None
        self._nondet_total: int | None = None   # continued from the ledger's last batch record
        sec = sink_security(spec.sink)
        self.base = dict(bootstrap=spec.sink.bootstrap_servers,
                         producer_config={**spec.sink.producer_config, **sec},
                         topic=spec.sink.topic, dead_letter_topic=spec.sink.dead_letter_topic,
                         ledger_topic=config.ledger_topic(), tx_prefix=config.stream.transactional_prefix,
                         generation=config.stream.generation, stream_uid=config.stream.uid,
                         spec_hash=spec.spec_hash(), transaction_timeout_ms=spec.sink.transaction_timeout_ms,
                         slots=self.slots)
        self.sec = sec

    def checkpoint_identity(self) -> str:
        if self._ckpt_id is None:
            self._ckpt_id = checkpoint.checkpoint_id(_local_path(self.config.checkpoint_dir))
            if not self._ckpt_id:
                raise JobFailed(f"checkpoint {self.config.checkpoint_dir} has no metadata file after the query "
                                "started; is the checkpoint store writable?")
        return self._ckpt_id

    def __call__(self, df, batch_id: int) -> None:
        with self.lock:
            if self.stopping:
                raise StopRequested(f"stop requested before batch {batch_id}; it is replayed on the next start")
            t0 = time.monotonic()
            cfg = SlotWriterConfig(**self.base, checkpoint_id=self.checkpoint_identity(), batch=batch_id)
            rows = df.repartition(self.slots, "key").mapInArrow(slot_task(cfg), COMMIT_SCHEMA).collect()
            commits = [protocol.SlotCommit.from_row(r.asDict()) for r in rows]
            protocol.check_batch_commits(batch_id, self.slots, commits)
            count = sum(c.count for c in commits if not c.skipped)
            skipped = sum(1 for c in commits if c.skipped)
            dead = sum(c.dead_letters for c in commits if not c.skipped)
            nondet = sum(1 for c in commits if c.nondeterministic)
            nondet_total = self._nondeterministic_total() + nondet
            record = protocol.BatchCompleteRecord(batch_id, self.slots, count, skipped, dead,
                                                  self._source_positions(batch_id), nondet, nondet_total)
            produce_sync(self._batch_producer(), self.base["ledger_topic"], protocol.BATCH_PARTITION,
                         protocol.batch_key(self.base["stream_uid"], self._ckpt_id, self.base["generation"]),
                         record.encode())
            faults.batch_in_sink(batch_id)
            s = self.summary
            s.batches += 1
            s.records += count
            s.skipped_slots += skipped
            s.dead_letters += dead
            s.nondeterministic_slots += nondet
            s.last_committed_batch = batch_id
            self.last_done = batch_id
            self._nondet_total = nondet_total
            log.info("batch %d committed: %d records, %d/%d slots skipped as already committed, %d dead letters%s "
                     "(%.0f ms)", batch_id, count, skipped, self.slots, dead,
                     f", {nondet} NON-DETERMINISTIC slots" if nondet else "", (time.monotonic() - t0) * 1000)

    def _nondeterministic_total(self) -> int:
        """Detections so far, from the ledger's last batch record (read once per driver)."""
        if self._nondet_total is None:
            from .resolution import last_batch_record

            last = last_batch_record(self.config, timeout_s=10.0)
            self._nondet_total = last.nondeterministic_slots_total if last is not None else 0
        return self._nondet_total

    def _source_positions(self, batch_id: int) -> dict[str, dict[str, int]]:
        """offsets/<batch_id> of the checkpoint (Spark logs it before the batch runs); {} if unreadable.

        Informative only (the operator's replay-horizon check): never a reason to fail the batch.
        """
        try:
            return checkpoint.kafka_offsets(_local_path(self.config.checkpoint_dir), batch_id)
        except (OSError, ValueError) as exc:
            log.debug("source offsets of batch %d not read: %s", batch_id, exc)
            return {}

    def _batch_producer(self):
        if self._producer is None:
            self._producer = idempotent_producer(self.base["bootstrap"], self.sec)
        return self._producer


def _local_path(path: str) -> str:
    return path[len("file://"):] if path.startswith("file://") else path


def preflight(config: RunConfig, timeout_s: float = 15.0) -> None:
    """Fail fast with a clear message when the sink cannot be used; set up the ledger topic."""
    spec = config.spec
    admin = admin_client(base_config(spec.sink.bootstrap_servers, sink_security(spec.sink)))
    admin._eos_bootstrap = spec.sink.bootstrap_servers  # for error messages
    topics = {spec.sink.topic: "sink.topic"}
    if spec.sink.dead_letter_topic:
        topics[spec.sink.dead_letter_topic] = "sink.deadLetterTopic"
    require_topics(admin, topics, timeout_s)
    ensure_ledger_topic(admin, config.ledger_topic(), spec.job.parallelism, timeout_s=timeout_s)


def build_query(spark, config: RunConfig, writer, *, once: bool = False, checkpoint_dir: str | None = None,
                query_name: str | None = None):
    """The streaming query of ``config`` with ``writer`` as its foreachBatch function.

    ``once``: run a single batch and stop (a drain or a pre-flight re-runs exactly the uncommitted batch).
    """
    spec = config.spec
    src = spark.readStream.format("kafka") \
        .option("kafka.bootstrap.servers", spec.source.bootstrap_servers) \
        .option("subscribe", ",".join(spec.source.topics)) \
        .option("startingOffsets", spec.source.starting_offsets) \
        .option("failOnDataLoss", "true")
    if spec.source.max_offsets_per_trigger:
        src = src.option("maxOffsetsPerTrigger", str(spec.source.max_offsets_per_trigger))
    for k, v in spec.source.options.items():
        src = src.option(k, v)
    source_df = src.load()
    transform = load_transform(spec.job.module, spec.job.function)
    ctx = TransformContext(spark=spark, args=dict(spec.job.args), stream=config.stream.name,
                           namespace=config.stream.namespace, slots=spec.job.parallelism)
    out = prepare_output(transform(source_df, ctx))
    trigger = {"once": True} if once else {"processingTime": f"{spec.trigger_interval_ms} milliseconds"}
    return (out.writeStream.foreachBatch(writer)
            .outputMode(spec.job.output_mode)
            .trigger(**trigger)
            .option("checkpointLocation", checkpoint_dir or config.checkpoint_dir)
            .queryName(query_name or f"eos-{config.stream.namespace}-{config.stream.name}"))


def spark_conf_for(config: RunConfig) -> dict[str, str]:
    spec = config.spec
    conf = {
        # Stateful operators keep this partition count for the checkpoint's life; fix it to P.
        "spark.sql.shuffle.partitions": str(spec.job.parallelism),
        # Adaptive execution may merge shuffle partitions, and slots must stay 1:1 with them.
        "spark.sql.adaptive.enabled": "false",
        "spark.sql.streaming.stopTimeout": "30s",
    }
    conf.update(spec.job.spark_conf)
    return conf


def run(config: RunConfig, *, stop_event: threading.Event | None = None, snapshot_dir: str | None = None,
        spark=None, drain: bool = False) -> RunSummary:
    """Run the stream until ``stop_event`` is set (graceful stop) or the query fails (raises JobFailed).

    ``drain``: only finish the replay batch (offsets logged, no commit) through the normal exactly-once
    writer, then stop with reason "Drained": an upgrade that changes the slots needs a clean boundary.
    """
    from .session import build_spark_session

    stop_event = stop_event or threading.Event()
    ckpt = Path(_local_path(config.checkpoint_dir))
    seeding = bool(config.restore_from) and checkpoint.checkpoint_id(ckpt) is None
    replay = None
    if drain:
        source = Path(_local_path(config.restore_from)) / "checkpoint" if seeding else ckpt
        replay = checkpoint.replay_batch(source)
        if replay is None:
            log.info("drain: checkpoint %s has no uncommitted batch; nothing to finish", source)
            return RunSummary(reason="Drained", last_committed_batch=checkpoint.last_committed_batch(source))
    preflight(config)
    if seeding:
        from .snapshot import restore_snapshot
        manifest = restore_snapshot(_local_path(config.restore_from), ckpt)
        log.info("checkpoint %s seeded from snapshot %s (batch %s, checkpoint id %s)", ckpt, config.restore_from,
                 manifest["lastBatch"], manifest["checkpointId"])
    ckpt.mkdir(parents=True, exist_ok=True)
    torn = checkpoint.discard_torn_log_writes(ckpt)
    if torn:
        log.warning("removed %d file(s) a killed driver was writing when it died: %s", len(torn), ", ".join(torn))
    faults.driver_starting()
    spark = spark or build_spark_session(f"eos-{config.stream.name}", conf=spark_conf_for(config))
    writer = BatchWriter(config)
    if config.replay_offsets_from and not drain:
        _replay_original_batches(spark, config, writer, ckpt, Path(_local_path(config.replay_offsets_from)),
                                 stop_event)
    # Draining runs a single trigger: Spark then re-runs exactly the batch logged without a commit.
    query = build_query(spark, config, writer, once=drain).start()
    log.info("stream %s/%s started (query id %s, checkpoint %s, %d slots, generation %d)%s",
             config.stream.namespace, config.stream.name, query.id, config.checkpoint_dir,
             config.spec.job.parallelism, config.stream.generation,
             f": draining batch {replay}" if drain else "")
    try:
        while query.isActive:
            if stop_event.wait(0.5):
                break
            exc = query.exception()
            if exc is not None:
                break
        if stop_event.is_set() and query.isActive:
            _stop_at_boundary(query, writer, config)
            writer.summary.reason = "Stopped"
        else:
            exc = query.exception()
            if exc is not None:
                raise JobFailed(f"the streaming query failed: {_short(exc)}")
            writer.summary.reason = "Finished"
    finally:
        if query.isActive:
            query.stop()
    if drain and writer.summary.reason == "Finished":
        done = checkpoint.last_committed_batch(ckpt)
        if done is None or done < replay:
            raise JobFailed(f"drain: the query ended without committing batch {replay} "
                            f"(last committed: {done}); the batch is still to be replayed")
        writer.summary.reason = "Drained"
        log.info("drained: batch %d is committed; the checkpoint is at a clean boundary", replay)
        return writer.summary
    if snapshot_dir and writer.summary.reason == "Stopped" and not drain:
        from .snapshot import take_snapshot
        manifest = take_snapshot(_local_path(config.checkpoint_dir), snapshot_dir,
                                 stream=config.stream.wire(), spec_hash=config.spec.spec_hash())
        writer.summary.snapshot = snapshot_dir
        log.info("snapshot written to %s at batch %s", snapshot_dir, manifest["lastBatch"])
    return writer.summary


def _replay_original_batches(spark, config: RunConfig, writer: BatchWriter, ckpt: Path, src: Path,
                             stop_event: threading.Event) -> int:
    """After a restore of an older snapshot: re-run, one trigger each, the batches the previous checkpoint
    logged after it, each with its ORIGINAL offsets (copied from ``src``'s offset log).

    A plain restart would plan those batches again from what the source holds now: other ranges under the
    same batch numbers, so the ledger would skip a batch whose records are not all in the sink (loss) or
    write records another batch already wrote (duplicates). With the original ranges every replayed slot
    is either in the sink (skipped) or written once. Returns the number of batches replayed.
    """
    from .snapshot import copy_offset_file

    if not src.is_dir() or src.resolve() == ckpt.resolve():
        return 0
    if checkpoint.checkpoint_id(src) != checkpoint.checkpoint_id(ckpt):
        log.info("replay: %s is another checkpoint lineage (its ledger keys differ); nothing to replay", src)
        return 0
    original = checkpoint.offset_batches(src)
    replayed = 0
    while original and not stop_event.is_set():
        last = checkpoint.last_committed_batch(ckpt)
        nxt = 0 if last is None else last + 1
        if nxt > original[-1]:
            break
        if checkpoint.replay_batch(ckpt) is None:
            if nxt not in original:
                raise JobFailed(f"cannot re-run batch {nxt} with its original offsets: {src} no longer has "
                                f"offsets/{nxt} (Spark keeps spark.sql.streaming.minBatchesToRetain batches). "
                                "Restore a newer snapshot, or raise minBatchesToRetain in job.sparkConf")
            copy_offset_file(src, ckpt, nxt)
        query = build_query(spark, config, writer, once=True).start()
        query.awaitTermination()
        exc = query.exception()
        if exc is not None:
            raise JobFailed(f"re-running batch {nxt} with its original offsets failed: {_short(exc)}")
        done = checkpoint.last_committed_batch(ckpt)
        if done is None or done < nxt:
            raise JobFailed(f"re-running batch {nxt} with its original offsets did not commit it")
        replayed += 1
    if replayed:
        log.info("re-ran %d batches after the snapshot with their original offsets from %s (through batch %s)",
                 replayed, src, checkpoint.last_committed_batch(ckpt))
    return replayed


def _stop_at_boundary(query, writer: BatchWriter, config: RunConfig) -> None:
    """Stop after the running batch committed: no batch is left partially written by us."""
    log.info("stop requested: waiting for the running batch to commit")
    with writer.lock:  # waits for a running foreachBatch to finish
        writer.stopping = True
        done = writer.last_done
    ckpt = _local_path(config.checkpoint_dir)
    deadline = time.monotonic() + 30
    # Spark writes commits/N right after foreachBatch returns; wait for it so the boundary is clean.
    def committed() -> int:
        last = checkpoint.last_committed_batch(ckpt)
        return -1 if last is None else last   # batch 0 is a batch: `or -1` would wait the full deadline after it
    while done is not None and time.monotonic() < deadline and committed() < done:
        time.sleep(0.05)
    query.stop()
    log.info("stopped at a clean boundary after batch %s", done)


def _short(exc) -> str:
    text = str(getattr(exc, "desc", None) or exc)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for ln in lines:  # the Python-side cause is the useful line
        if "Error:" in ln and "py4j" not in ln:
            return ln.strip()[:2000]
    return (lines[0] if lines else repr(exc))[:2000]


def install_signal_handlers(stop_event: threading.Event) -> None:
    def handler(signum, _frame):
        log.info("received %s: stopping at the next clean batch boundary", signal.Signals(signum).name)
        stop_event.set()
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def termination_message_path() -> Path | None:
    """Where the Pod's termination message goes: the variable if set, else Kubernetes' file if mounted."""
    explicit = os.environ.get("EOS_TERMINATION_MESSAGE_PATH")
    if explicit:
        return Path(explicit)
    default = Path("/dev/termination-log")
    return default if default.exists() and os.access(default, os.W_OK) else None
