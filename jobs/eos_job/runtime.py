"""The driver: builds the query from a RunConfig and runs it until stopped or failed.

What the user's transformation receives and must return: ``contract``.
"""
from __future__ import annotations

import logging
import re
import os
import signal
import threading
import time
from pathlib import Path

from . import checkpoint, faults
from . import replay as rerun
from .contract import (BatchRefused, DriverSuperseded, JobFailed, SpecRefused, TransformContext, load_transform,
                       prepare_output)
from .kafka_security import KafkaSecrets, java_config
from .ledger import admin_client, base_config, ledger_consumer, require_topics, sink_security
from .ledger_topic import check_ledger_topic, ensure_ledger_topic, ledger_durability
from .request_limits import SinkLimits, check_sink_limits
from .spec import RunConfig
from .storage import Loc
from .writer import BatchWriter, RunSummary, StopRequested  # noqa: F401 - RunSummary: the CLI's

log = logging.getLogger("eos_job")


def preflight(config: RunConfig, timeout_s: float = 15.0) -> SinkLimits:
    """Fail fast with a clear message when the sink cannot be used; set up the ledger topic. Returns the
    sink topics' request limits the slot producers must keep (``request_limits``)."""
    spec = config.spec
    bootstrap = spec.sink.bootstrap_servers
    with admin_client(base_config(bootstrap, sink_security(spec.sink)), bootstrap) as admin:
        topics = {spec.sink.topic: "sink.topic"}
        if spec.sink.dead_letter_topic:
            topics[spec.sink.dead_letter_topic] = "sink.deadLetterTopic"
        require_topics(admin, topics, timeout_s)
        limits = check_sink_limits(admin, spec.sink.producer_config, topics, timeout_s)
        durability = ledger_durability(admin, spec.sink.topic, timeout_s)
        ensure_ledger_topic(admin, config.ledger_topic(), spec.job.parallelism, durability, timeout_s=timeout_s)
        consumer = ledger_consumer(spec.sink.bootstrap_servers, sink_security(spec.sink))
        try:
            check_ledger_topic(admin, consumer, config.ledger_topic(), config.stream.uid, durability, timeout_s)
        finally:
            consumer.close()
        return limits


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
        .option("failOnDataLoss", "false" if spec.source.accept_data_loss else "true") \
        .option("kafka.isolation.level", "read_committed") \
        .option("maxOffsetsPerTrigger", str(spec.source.max_offsets_per_trigger))
    for k, v in spec.source.options.items():   # never a reserved one (spec.semantic_errors)
        src = src.option(k, v)
    # SASL/TLS of the source, Secret values from the environment (Spark redacts sasl.jaas.config in its logs).
    for k, v in java_config("source", spec.source.credentials, spec.source.tls,
                            KafkaSecrets.from_env("source")).items():
        src = src.option(f"kafka.{k}", v)
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
    if spec.checkpoint.store == "s3" and spec.checkpoint.s3 is not None:
        from .session import s3a_conf
        conf.update(s3a_conf(spec.checkpoint.s3))
    conf.update(spec.job.spark_conf)
    from . import driver_metrics, event_log
    conf.update(driver_metrics.spark_conf(spec.job.metrics))   # validation refuses a sparkConf that sets these
    conf.update(event_log.spark_conf(spec))
    return conf


def run(config: RunConfig, *, stop_event: threading.Event | None = None, snapshot_dir: str | None = None,
        spark=None, drain: bool = False) -> RunSummary:
    """Run the stream until ``stop_event`` is set (graceful stop) or the query fails (raises JobFailed).

    ``drain``: only finish the replay batch (offsets logged, no commit) through the normal exactly-once
    writer, then stop with reason "Drained": an upgrade that changes the slots needs a clean boundary.
    """
    from .session import build_spark_session

    stop_event = stop_event or threading.Event()
    ckpt = Loc.of(config.checkpoint_dir)
    seeding = bool(config.restore_from) and checkpoint.checkpoint_id(ckpt) is None
    replay = None
    if drain:
        source = Loc.of(config.restore_from) / "checkpoint" if seeding else ckpt
        replay = checkpoint.replay_batch(source)
        if replay is None:
            log.info("drain: checkpoint %s has no uncommitted batch; nothing to finish", source)
            return RunSummary(reason="Drained", last_committed_batch=checkpoint.last_committed_batch(source))
    limits = preflight(config)
    if seeding:
        from .snapshot import restore_snapshot
        manifest = restore_snapshot(config.restore_from, ckpt)
        log.info("checkpoint %s seeded from snapshot %s (batch %s, checkpoint id %s)", ckpt, config.restore_from,
                 manifest["lastBatch"], manifest["checkpointId"])
    ckpt.mkdir()
    torn = checkpoint.discard_torn_log_writes(ckpt)
    if torn:
        log.warning("removed %d file(s) a killed driver was writing when it died: %s", len(torn), ", ".join(torn))
    faults.driver_starting()
    cluster = config.spec.job.deploy_mode == "cluster"
    if spark is None:
        from .event_log import prepare
        prepare(config.spec)     # Spark will not start without the event log's folder
    try:
        spark = spark or build_spark_session(f"eos-{config.stream.name}", conf=spark_conf_for(config))
    except Exception as exc:  # noqa: BLE001 - in cluster mode, said as what to fix
        if not cluster:
            raise
        from .executors import start_failure
        raise start_failure(exc) from exc
    if cluster and spark.sparkContext.master.startswith("k8s://"):
        from .executors import wait_for_executors
        wait_for_executors(spark, config.spec.job.executor.start_timeout_seconds)
    writer = BatchWriter(config, limits)
    log.info("driver epoch %d, generation %d", writer.claim(ckpt), writer.base["generation"])

    def run_once(batch: int) -> None:
        """One trigger: Spark re-runs exactly the batch logged without a commit."""
        query = build_query(spark, config, writer, once=True).start()
        try:
            query.awaitTermination()          # raises the query's failure
            exc = query.exception()
        except Exception as failure:  # noqa: BLE001 - mapped below
            exc = failure
        if exc is not None:
            final = _final(exc)
            if final is not None:
                raise final
            raise JobFailed(f"re-running batch {batch} with its original offsets failed: {_short(exc)}")

    # The ledger's history first: every batch re-run below is judged against what the sink holds.
    if writer.checked:
        writer.load_history(ckpt)
        if drain and replay not in writer.history:
            # The driver records a batch's input before any of its slots commits: without that record nothing
            # of it reached the sink, and the new spec may run it (a batch the old spec refused, say).
            log.info("drain: batch %d has no record in the ledger, so none of it reached the sink; nothing to "
                     "finish, the new spec runs it", replay)
            return RunSummary(reason="Drained", last_committed_batch=checkpoint.last_committed_batch(ckpt))
    if not drain:
        previous = Loc.of(config.replay_offsets_from) if config.replay_offsets_from else None
        rerun.catch_up(ckpt, writer.history, run_once, stop_event, previous)
    # Draining runs a single trigger: Spark then re-runs exactly the batch logged without a commit.
    query = build_query(spark, config, writer, once=drain).start()
    log.info("stream %s/%s started (query id %s, checkpoint %s, %d slots, generation %d)%s",
             config.stream.namespace, config.stream.name, query.id, config.checkpoint_dir,
             config.spec.job.parallelism, writer.base["generation"],
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
                final = _final(exc)
                if final is not None:
                    raise final
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
        manifest = take_snapshot(config.checkpoint_dir, snapshot_dir,
                                 stream=config.stream.wire(), spec_hash=config.spec.spec_hash())
        writer.summary.snapshot = snapshot_dir
        log.info("snapshot written to %s at batch %s", snapshot_dir, manifest["lastBatch"])
    return writer.summary


def _stop_at_boundary(query, writer: BatchWriter, config: RunConfig) -> None:
    """Stop after the running batch committed: no batch is left partially written by us."""
    log.info("stop requested: waiting for the running batch to commit")
    with writer.lock:  # waits for a running foreachBatch to finish
        writer.stopping = True
        done = writer.last_done
    ckpt = config.checkpoint_dir
    deadline = time.monotonic() + 30
    # Spark writes commits/N right after foreachBatch returns; wait for it so the boundary is clean.
    def committed() -> int:
        last = checkpoint.last_committed_batch(ckpt)
        return -1 if last is None else last   # batch 0 is a batch: `or -1` would wait the full deadline after it
    while done is not None and time.monotonic() < deadline and committed() < done:
        time.sleep(0.05)
    query.stop()
    log.info("stopped at a clean boundary after batch %s", done)


def _final(exc) -> JobFailed | None:
    """A failure no restart can cure, found inside a query failure (raised by the driver's check or by a
    slot task): a refused batch, a newer driver, or a spec the job's plan contradicts."""
    text = str(getattr(exc, "desc", None) or exc)
    for cls in (DriverSuperseded, BatchRefused, SpecRefused):
        m = re.search(rf"{cls.__name__}: (.+)", text)
        if m:
            return cls(m.group(1).strip()[:2000])
    return None


def _short(exc) -> str:
    text = str(getattr(exc, "desc", None) or exc)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for ln in lines:  # the Python-side cause is the useful line
        if "Error:" in ln and "py4j" not in ln:
            return ln.strip()[:2000]
    return (lines[0] if lines else repr(exc))[:2000]


def install_signal_handlers(stop_event: threading.Event) -> None:
    """SIGTERM and SIGINT request a stop at the next clean batch boundary.

    The handler itself takes no lock: it runs in the main thread, which waits in ``stop_event.wait()`` and holds
    the Event's lock (not reentrant) while entering and leaving it, so ``stop_event.set()`` in the handler could
    wait for ever on a lock its own thread held, and the driver ran on until SIGKILL (an upgrade's snapshot not
    taken; seen in a clean-clone run). The handler writes the signal to a pipe; a thread sets the event.
    """
    read_end, write_end = os.pipe()

    def watch() -> None:
        signum = os.read(read_end, 1)[0]
        log.info("received %s: stopping at the next clean batch boundary", signal.Signals(signum).name)
        stop_event.set()

    threading.Thread(target=watch, name="eos-stop-signal", daemon=True).start()

    def handler(signum, _frame):
        os.write(write_end, bytes([signum]))

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def termination_message_path() -> Path | None:
    """Where the Pod's termination message goes: the variable if set, else Kubernetes' file if mounted."""
    explicit = os.environ.get("EOS_TERMINATION_MESSAGE_PATH")
    if explicit:
        return Path(explicit)
    default = Path("/dev/termination-log")
    return default if default.exists() and os.access(default, os.W_OK) else None
