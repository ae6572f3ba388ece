"""The sink benchmark's Spark side: one SparkSession, the stream configs, both sinks' queries, one run.

``Bench`` holds the session (built once, as the runtime builds it, plus the event log), the topics, the
CPU meter and the producer settings. ``config`` is the ExactlyOnceStream of one run (shape, producer
setting, input and output topics, a fresh checkpoint); ``builtin_writer`` and ``ours_writer`` are the two
queries over the same source and transformation (``source_df``, as ``eos_job.runtime.build_query`` builds
them); ``run_available_now`` runs one of them over a whole topic and measures it.
"""
from __future__ import annotations

import os
import re
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks import report
from benchmarks.kafka_io import Topics
from benchmarks.report import say
from benchmarks.sink_meters import CpuMeter, EventLog, progress
from benchmarks.sink_shapes import INPUT_PARTITIONS

REPO = Path(__file__).resolve().parents[1]


def stack_env() -> tuple[str, str]:
    from eos_stack.common import read_env_file
    f = REPO / ".stack" / "env"
    env = read_env_file(f) if f.exists() else {}
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP") or env.get("KAFKA_BOOTSTRAP")
    jars = os.environ.get("SPARK_JARS") or env.get("SPARK_JARS")
    if not bootstrap or not jars:
        sys.exit("KAFKA_BOOTSTRAP/SPARK_JARS unknown: start the stack with "
                 "`PYTHONPATH=stack .venv/bin/python -m eos_stack up kafka spark` (or `make bench`)")
    os.environ["SPARK_JARS"] = jars
    writer_jar = os.environ.get("EOS_SLOT_WRITER_JAR") or env.get("EOS_SLOT_WRITER_JAR")
    if writer_jar:   # the JVM slot writer (the "jvm" sink): on spark.jars (eos_job.session.writer_jars)
        os.environ["EOS_SLOT_WRITER_JAR"] = writer_jar
    return bootstrap, jars


class Bench:
    def __init__(self, args, bootstrap: str, producers: dict):
        self.args = args
        self.bootstrap = bootstrap
        self.producers = producers
        self.run_id = uuid.uuid4().hex[:6]
        self.topics = Topics(bootstrap)
        self.work = Path(tempfile.mkdtemp(prefix=f"eos-bench-{self.run_id}-"))
        self.n_ckpt = 0
        self.spark = None
        self.events: EventLog | None = None
        self.tee = None

        def broker_pid():
            from eos_stack.common import Stack
            return Stack().running_pid("kafka")  # None when the broker is elsewhere: no broker CPU then
        self.cpu = CpuMeter(broker_pid)

    # configs ---------------------------------------------------------------
    def config(self, shape, producer: str, in_topic: str, out_topic: str, writer: str = "python"):
        from eos_job.spec import load_run_config
        self.n_ckpt += 1
        root = self.work / f"run{self.n_ckpt:03d}"
        slots_from = self.args.map_slots if shape.name == "map" else "key"
        # Source-partition slots: one per input partition (the benchmark's topics have INPUT_PARTITIONS).
        slots = max(self.args.parallelism, INPUT_PARTITIONS) if slots_from != "key" else self.args.parallelism
        manifest = {
            "apiVersion": "streaming.eos.dev/v1beta1", "kind": "ExactlyOnceStream",
            # One stream identity per producer setting: its slot producers (same transactional ids) live on
            # across runs in the Python workers, as they do in a long-running stream. The Python workers keep
            # a slot's producer by transactional id whatever its settings, so another setting needs another
            # identity.
            # How slots are derived is part of the identity too: a generation keeps its derivation.
            # The JVM writer ("jvm" sink) too: its executor JVM and the Python workers would fence each other.
            "metadata": {"name": f"bench-{self.run_id}-{producer}{'-src' if slots_from != 'key' else ''}"
                                 f"{'-jvm' if writer == 'jvm' else ''}",
                         "namespace": "bench"},
            "spec": {
                "job": {"module": shape.module, "args": dict(shape.args), "parallelism": slots,
                        "slotsFrom": slots_from, "outputMode": "update"},
                "source": {"bootstrapServers": self.bootstrap, "topics": [in_topic],
                           "startingOffsets": "earliest", "maxOffsetsPerTrigger": self.args.max_offsets},
                "sink": {"bootstrapServers": self.bootstrap, "topic": out_topic,
                         "producerConfig": dict(self.producers[producer]["ours"]),
                         "auditHeaders": not self.args.no_audit_headers, "writer": writer},
                "checkpoint": {"store": "local", "path": str(root)},
                "triggerIntervalMs": self.args.trigger_ms,
            },
        }
        return load_run_config(manifest)

    def session(self, shape, producer: str):
        from eos_job.runtime import spark_conf_for
        from eos_job.session import build_spark_session
        cfg = self.config(shape, producer, "bench-x", "bench-y")
        events = self.work / "events"
        events.mkdir()
        self.events = EventLog(events)
        conf = {**spark_conf_for(cfg), "spark.eventLog.enabled": "true", "spark.eventLog.dir": f"file://{events}",
                "spark.eventLog.compress": "false",
                # A run of 10,000,000 records is 100+ batches: keep all their progress (default: the last 100).
                "spark.sql.streaming.numRecentProgressUpdates": "100000"}
        self.spark = build_spark_session("eos-sink-bench", conf=conf)
        return self.spark

    def source_df(self, config):
        """The source exactly as ``runtime.build_query`` builds it, and the job's transform."""
        from eos_job.runtime import TransformContext, load_transform
        spec = config.spec
        src = self.spark.readStream.format("kafka") \
            .option("kafka.bootstrap.servers", spec.source.bootstrap_servers) \
            .option("subscribe", ",".join(spec.source.topics)) \
            .option("startingOffsets", spec.source.starting_offsets) \
            .option("failOnDataLoss", "true") \
            .option("kafka.isolation.level", "read_committed") \
            .option("maxOffsetsPerTrigger", str(spec.source.max_offsets_per_trigger))
        ctx = TransformContext(spark=self.spark, args=dict(spec.job.args), stream=config.stream.name,
                               namespace=config.stream.namespace, slots=spec.job.parallelism)
        return load_transform(spec.job.module, spec.job.function)(src.load(), ctx)

    # queries ----------------------------------------------------------------
    def builtin_writer(self, config, producer: str, repartition: bool = False):
        df = self.source_df(config)
        if repartition:
            df = df.repartition(config.spec.job.parallelism, "key")
        dsw = (df.writeStream.format("kafka")
               .outputMode(config.spec.job.output_mode)
               .option("kafka.bootstrap.servers", config.spec.sink.bootstrap_servers)
               .option("topic", config.spec.sink.topic)
               .option("checkpointLocation", config.checkpoint_dir)
               .queryName(f"builtin-{self.n_ckpt}"))
        for k, v in self.producers[producer]["builtin"].items():
            dsw = dsw.option(k, v)
        return dsw

    def ours_writer(self, config, timer=None):
        from eos_job.runtime import BatchWriter, build_query, preflight
        limits = preflight(config)
        Path(config.checkpoint_dir).mkdir(parents=True, exist_ok=True)
        self.topics.track(config.ledger_topic())
        writer = BatchWriter(config, limits)
        # As eos_job.runtime.run starts a driver: its generation and epoch (the driver's partition-0 writer
        # among them) and the ledger's history of the (fresh) checkpoint; not measured.
        from eos_job.storage import Loc
        ckpt = Loc.of(config.checkpoint_dir)
        writer.claim(ckpt)
        writer.load_history(ckpt)
        fn = writer if timer is None else timer.wrap(writer)
        return build_query(self.spark, config, fn), writer

    # runs --------------------------------------------------------------------
    def run_available_now(self, dsw, n: int, label: str) -> dict:
        c0 = self.cpu.snapshot()
        e0 = time.time() * 1000
        t0 = time.perf_counter()
        q = dsw.trigger(availableNow=True).start()
        last = time.perf_counter()
        while not q.awaitTermination(2):
            if time.perf_counter() - last > 20:
                done = sum(p["numInputRows"] for p in progress(q))
                say(f"    {label}: {done:,}/{n:,} records so far")
                last = time.perf_counter()
        wall = time.perf_counter() - t0
        cpu = CpuMeter.delta(c0, self.cpu.snapshot())
        if q.exception() is not None:
            raise RuntimeError(f"{label}: the query failed: {q.exception()}")
        prog = progress(q)
        rows = sum(p["numInputRows"] for p in prog)
        if rows != n:
            raise RuntimeError(f"{label}: processed {rows} rows, expected {n}")
        trig = [p["durationMs"].get("triggerExecution", 0) for p in prog if p["numInputRows"]]
        add = [p["durationMs"].get("addBatch", 0) for p in prog if p["numInputRows"]]
        time.sleep(0.2)  # the event log is flushed at job end
        stages = self.events.profile(e0, time.time() * 1000)
        return {"stages": stages, "wall_s": round(wall, 3), "records_per_s": round(n / wall), "batches": len(trig),
                "batch_ms_median": statistics.median(trig) if trig else None,
                "add_batch_ms_total": sum(add), "trigger_ms_total": sum(trig), "cpu_s": cpu,
                "cpu_us_per_record": {k: round(v / n * 1e6, 2) for k, v in cpu.items()}}

    def throughput_run(self, shape, producer: str, sink: str, in_topic: str, n: int, label: str) -> dict:
        """One run of ``builtin``, ``ours`` or ``jvm`` (ours with sink.writer jvm) over all of ``in_topic`` into a
        fresh output topic."""
        out = f"bench-out-{shape.name}-{sink}-{self.run_id}-{self.n_ckpt + 1:03d}"
        self.topics.create({out: self.args.parallelism})
        config = self.config(shape, producer, in_topic, out, writer="jvm" if sink == "jvm" else "python")
        dsw, writer = (self.builtin_writer(config, producer), None) if sink == "builtin" else self.ours_writer(config)
        before = self.tee.snapshot()
        res = self.run_available_now(dsw, n, label)
        if writer is not None:
            res["slot_stats"] = slot_stats_of(writer)
        after = self.tee.snapshot()
        res["refence_warnings"] = after["refence"] - before["refence"]
        res["task_failures"] = after["lost_task"] - before["lost_task"]
        res["output_topic"] = out
        return res


def slot_stats_of(writer) -> dict:
    """The run's slot task counters (eos_job.slot_stats, summed by the driver) and its batches."""
    return {**writer.slot_stats.to_row(), "batches": writer.summary.batches}


def machine_info(bench: Bench) -> dict:
    import confluent_kafka
    import pyarrow
    jars = os.environ.get("SPARK_JARS", "")
    kc = re.search(r"kafka-clients-([\d.]+)\.jar", jars)
    return {**report.machine_info(), "spark_jvm": bench.spark.version,
            "kafka_clients_jar": kc.group(1) if kc else "unknown",
            "confluent_kafka": getattr(confluent_kafka, "__version__", None) or str(confluent_kafka.version()),
            "pyarrow": pyarrow.__version__, "load_avg_start": bench.load_start, "load_avg_end": list(os.getloadavg())}
