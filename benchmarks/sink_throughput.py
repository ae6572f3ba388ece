#!/usr/bin/env python3
"""Sink benchmark: Spark's built-in Kafka sink (at-least-once) against the exactly-once sink.

Both sinks run the same job (``benchmarks/passthrough.py``: key and value of
~100-byte records) over the same input, in ONE process and ONE SparkSession
(warm JVM, same Python workers), with the same parallelism and the same
``maxOffsetsPerTrigger``. Ratios, not absolute numbers, are the result: the
machine is small and shared.

Phases:

1. Throughput: N records are produced once into a 4-partition input topic.
   Each sink is warmed up on a smaller topic, then processes all N with
   ``trigger(availableNow=True)`` from a fresh checkpoint into a fresh output
   topic, alternating the order over ``--repeats``; the median wall time
   counts. Every output topic is read back with read_committed: ours must hold
   each key exactly once; the built-in sink may hold duplicates only after a
   failure.
2. Breakdown (only with ``--breakdown``): the exactly-once write path cut
   after each step (shuffle, Arrow to Python, produce loop, transaction; see
   ``benchmarks/sink_probes.py``) next to the sink itself, with the driver's
   foreachBatch and batch-complete write times. The default run stays well
   under 10 minutes; this one takes a few minutes more.
3. Latency: a producer thread writes ``--rate`` records/s for ``--seconds``
   (after ``--latency-warmup`` seconds that are not counted), each stamped with
   its produce time; each sink runs as a continuous query with the same
   processingTime trigger; a read_committed consumer thread stamps the receive
   time. p50/p99 end-to-end latency per sink.

Besides wall time, each run records the CPU time of the driver, the JVM, the
Python workers and the broker (from /proc), Spark's stage timings (from the
event log) and the failed tasks and re-fences seen on stderr.

Results: a markdown table with the settings and machine, and the JSON of every
measurement, in ``benchmarks/results/<date>-sink.md`` (or ``--out``);
``--render FILE --findings NOTES.md`` adds notes to a results file.

Run: ``make bench``, or
``PYTHONPATH=stack:. .venv/bin/python benchmarks/sink_throughput.py --records 200000 --seconds 10``.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for _p in (REPO / "stack", REPO / "jobs", REPO):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))
# Python workers inherit this: they import eos_job (the slot task) and benchmarks.sink_probes.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(REPO), str(REPO / "jobs"), str(REPO / "stack")] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))

import numpy as np  # noqa: E402
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition  # noqa: E402

from benchmarks import procstat, report  # noqa: E402
from benchmarks.kafka_io import KEY_BYTES, VALUE_BYTES, Topics, audit, produce_records  # noqa: E402
from benchmarks.report import say  # noqa: E402


# ------------------------------------------------------------------ stderr tee
class StderrTee:
    """Sends fd 2 (the JVM's and the Python workers' stderr too) through a pipe.

    Everything goes to a log file and on to the real stderr; lines that show the
    slot producers being fenced are counted, per phase.
    """
    PATTERNS = {"refence": re.compile(r"fencing again"), "fenced": re.compile(r"(?i)fenced|PRODUCER_FENCED"),
                "spark_error": re.compile(r"\bERROR\b"), "lost_task": re.compile(r"WARN TaskSetManager: .*Lost task"),
                "producer_fatal": re.compile(r"\|FATAL\|rdkafka#producer")}

    def __init__(self, path: Path):
        self.path = path
        self.counts = {k: 0 for k in self.PATTERNS}
        self.samples: list[str] = []
        real = os.dup(2)
        r, w = os.pipe()
        os.dup2(w, 2)
        os.close(w)
        self.real = os.fdopen(real, "w", buffering=1)
        sys.stderr = self.real  # our own tracebacks go straight to the terminal
        self.reader = os.fdopen(r, "r", errors="replace")
        self.log = open(path, "w", buffering=1)
        threading.Thread(target=self._pump, daemon=True, name="stderr-tee").start()

    def _pump(self) -> None:
        for line in self.reader:
            self.log.write(line)
            for k, pat in self.PATTERNS.items():
                if pat.search(line):
                    self.counts[k] += 1
                    if len(self.samples) < 20:
                        self.samples.append(line.strip()[:300])
            self.real.write(line)

    def snapshot(self) -> dict[str, int]:
        time.sleep(0.2)  # let the pipe drain
        return dict(self.counts)


# ------------------------------------------------------------------ CPU accounting
class CpuMeter(procstat.CpuMeter):
    """CPU seconds used by this process tree and the broker, by component, from /proc.

    On a saturated two-core machine wall time follows CPU, and CPU per record
    is far less disturbed by the other work on the machine than wall time is:
    it is reported next to the wall-time ratio. A thread samples every process
    of the tree twice a second and adds up each one's increments, so Python
    workers that come and go are counted (less their last half second).
    ``other`` is the rest of the machine's busy time over the same interval
    (the noise from other work).
    """
    GROUPS = ("driver", "jvm", "python_workers", "broker")

    def __init__(self, broker_pid, interval: float = 0.5):
        self.find_broker = broker_pid  # a function: the broker may be restarted by other work on the stack
        super().__init__(interval)

    def classify(self, ps: dict[int, tuple], kids: dict[int, list[int]]) -> dict[int, str]:
        groups: dict[int, str] = {}
        me = os.getpid()
        if me in ps:
            groups[me] = "driver"
        for pid in procstat.tree(kids, me)[1:]:
            groups[pid] = "jvm" if ps[pid][1] == "java" else "python_workers"
        try:
            broker = self.find_broker()
        except Exception:  # noqa: BLE001
            broker = None
        if broker in ps:
            for pid in procstat.tree(kids, broker):
                groups[pid] = "broker"
        return groups

    @staticmethod
    def delta(a: dict, b: dict) -> dict[str, float]:
        if not a or not b:
            return {}
        d = procstat.CpuMeter.difference(a, b)
        d["spark"] = round(d["driver"] + d["jvm"] + d["python_workers"], 2)
        d["other"] = round(d.pop("machine") - d["spark"] - d["broker"], 2)
        return d


# ------------------------------------------------------------------ Spark event log
class EventLog:
    """Per-query stage timings from Spark's event log (JSON lines, flushed at stage and job end)."""

    def __init__(self, folder: Path):
        self.folder = folder

    def _events(self):
        for f in sorted(p for p in self.folder.rglob("*") if p.is_file() and "events" in p.name):
            with open(f, errors="replace") as fh:
                for line in fh:
                    try:
                        yield json.loads(line)
                    except ValueError:
                        continue  # a line being written

    def profile(self, start_ms: float, end_ms: float) -> dict:
        """Jobs submitted in [start_ms, end_ms] (epoch ms): one query runs at a time."""
        jobs: dict[int, dict] = {}
        stage_job: dict[int, int] = {}
        stages: dict[int, dict] = {}
        tasks: dict[int, list[dict]] = {}
        for e in self._events():
            kind = e.get("Event")
            if kind == "SparkListenerJobStart":
                if not start_ms <= (e.get("Submission Time") or 0) <= end_ms:
                    continue
                jobs[e["Job ID"]] = {"start": e.get("Submission Time"), "end": None}
                for sid in e.get("Stage IDs", []):
                    stage_job[sid] = e["Job ID"]
            elif kind == "SparkListenerJobEnd" and e.get("Job ID") in jobs:
                jobs[e["Job ID"]]["end"] = e.get("Completion Time")
            elif kind == "SparkListenerStageCompleted":
                info = e["Stage Info"]
                if info["Stage ID"] in stage_job:
                    stages[info["Stage ID"]] = info
            elif kind == "SparkListenerTaskEnd" and e.get("Stage ID") in stage_job:
                tasks.setdefault(e["Stage ID"], []).append(e)
        out: dict = {"jobs": len(jobs), "jobs_wall_s": round(sum((j["end"] or j["start"]) - j["start"]
                                                                 for j in jobs.values()) / 1000, 2)}
        for sid, info in stages.items():
            if info.get("Submission Time") is None or info.get("Completion Time") is None:
                continue  # skipped stage
            ts = tasks.get(sid, [])
            metrics = [t.get("Task Metrics") or {} for t in ts]
            writes = sum((m.get("Shuffle Write Metrics") or {}).get("Shuffle Bytes Written", 0) for m in metrics)
            k = "map" if writes else "result"
            d = out.setdefault(k, {"stages": 0, "tasks": 0, "wall_s": 0.0, "task_run_s": 0.0, "task_jvm_cpu_s": 0.0,
                                   "shuffle_write_s": 0.0, "fetch_wait_s": 0.0, "gc_s": 0.0, "failed_tasks": 0})
            d["stages"] += 1
            d["tasks"] += len(ts)
            d["wall_s"] += (info["Completion Time"] - info["Submission Time"]) / 1000
            d["failed_tasks"] += sum(1 for t in ts if (t.get("Task End Reason") or {}).get("Reason") != "Success")
            for m in metrics:
                d["task_run_s"] += m.get("Executor Run Time", 0) / 1000
                d["task_jvm_cpu_s"] += m.get("Executor CPU Time", 0) / 1e9
                d["gc_s"] += m.get("JVM GC Time", 0) / 1000
                d["shuffle_write_s"] += (m.get("Shuffle Write Metrics") or {}).get("Shuffle Write Time", 0) / 1e9
                d["fetch_wait_s"] += (m.get("Shuffle Read Metrics") or {}).get("Fetch Wait Time", 0) / 1000
        for k in ("map", "result"):
            if k in out:
                out[k] = {x: (round(v, 2) if isinstance(v, float) else v) for x, v in out[k].items()}
        return out


# ------------------------------------------------------------------ Kafka helpers
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
    return bootstrap, jars


# ------------------------------------------------------------------ Spark side
class Bench:
    def __init__(self, args, bootstrap: str):
        self.args = args
        self.bootstrap = bootstrap
        self.run_id = uuid.uuid4().hex[:6]
        self.topics = Topics(bootstrap)
        self.work = Path(tempfile.mkdtemp(prefix=f"eos-bench-{self.run_id}-"))
        self.n_ckpt = 0
        self.spark = None
        def broker_pid():
            from eos_stack.common import Stack
            return Stack().running_pid("kafka")  # None when the broker is elsewhere: no broker CPU then
        self.cpu = CpuMeter(broker_pid)

    # configs ---------------------------------------------------------------
    def config(self, in_topic: str, out_topic: str):
        from eos_job.spec import load_run_config
        self.n_ckpt += 1
        root = self.work / f"run{self.n_ckpt:03d}"
        manifest = {
            "apiVersion": "streaming.eos.dev/v1alpha1", "kind": "ExactlyOnceStream",
            # One stream identity for the whole benchmark: the slot producers (same transactional
            # ids) live on across runs in the Python workers, as they do in a long-running stream.
            "metadata": {"name": f"bench-{self.run_id}", "namespace": "bench"},
            "spec": {
                "job": {"module": "benchmarks.passthrough", "parallelism": self.args.parallelism},
                "source": {"bootstrapServers": self.bootstrap, "topics": [in_topic],
                           "startingOffsets": "earliest", "maxOffsetsPerTrigger": self.args.max_offsets},
                "sink": {"bootstrapServers": self.bootstrap, "topic": out_topic},
                "checkpoint": {"store": "local", "path": str(root)},
                "triggerIntervalMs": self.args.trigger_ms,
            },
        }
        return load_run_config(manifest)

    def session(self):
        from eos_job.runtime import spark_conf_for
        from eos_job.session import build_spark_session
        cfg = self.config("bench-x", "bench-y")
        events = self.work / "events"
        events.mkdir()
        self.events = EventLog(events)
        conf = {**spark_conf_for(cfg), "spark.eventLog.enabled": "true", "spark.eventLog.dir": f"file://{events}",
                "spark.eventLog.compress": "false"}
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
            .option("maxOffsetsPerTrigger", str(spec.source.max_offsets_per_trigger))
        ctx = TransformContext(spark=self.spark, args={}, stream=config.stream.name,
                               namespace=config.stream.namespace, slots=spec.job.parallelism)
        return load_transform(spec.job.module, spec.job.function)(src.load(), ctx)

    # queries ----------------------------------------------------------------
    def builtin_writer(self, config, repartition: bool = False):
        df = self.source_df(config)
        if repartition:
            df = df.repartition(config.spec.job.parallelism, "key")
        return (df.writeStream.format("kafka")
                .option("kafka.bootstrap.servers", config.spec.sink.bootstrap_servers)
                .option("topic", config.spec.sink.topic)
                .option("checkpointLocation", config.checkpoint_dir)
                .queryName(f"builtin-{self.n_ckpt}"))

    def ours_writer(self, config, timer: "DriverTimer | None" = None):
        from eos_job.runtime import BatchWriter, build_query, preflight
        preflight(config)
        Path(config.checkpoint_dir).mkdir(parents=True, exist_ok=True)
        self.topics.track(config.ledger_topic())
        writer = BatchWriter(config)
        fn = writer if timer is None else timer.wrap(writer)
        return build_query(self.spark, config, fn), writer

    def probe_writer(self, config, mode: str, stats: list):
        from eos_job.runtime import prepare_output

        from benchmarks.sink_probes import PROBE_SCHEMA, probe_task
        slots = config.spec.job.parallelism
        fn = probe_task(mode, self.bootstrap, config.spec.sink.topic, f"bench-probe-{self.run_id}")

        def each_batch(df, batch_id):
            rows = df.repartition(slots, "key").mapInArrow(fn, PROBE_SCHEMA).collect()
            stats.extend(r.asDict() for r in rows)

        df = prepare_output(self.source_df(config))
        return (df.writeStream.foreachBatch(each_batch).outputMode("update")
                .option("checkpointLocation", config.checkpoint_dir).queryName(f"probe-{mode}-{self.n_ckpt}"))

    # runs --------------------------------------------------------------------
    def run_available_now(self, dsw, n: int, label: str) -> dict:
        c0 = self.cpu.snapshot()
        e0 = time.time() * 1000
        t0 = time.perf_counter()
        q = dsw.trigger(availableNow=True).start()
        last = 0.0
        while not q.awaitTermination(2):
            if time.perf_counter() - last > 10:
                done = sum(p["numInputRows"] for p in _progress(q))
                say(f"    {label}: {done:,}/{n:,} records so far")
                last = time.perf_counter()
        wall = time.perf_counter() - t0
        cpu = CpuMeter.delta(c0, self.cpu.snapshot())
        if q.exception() is not None:
            raise RuntimeError(f"{label}: the query failed: {q.exception()}")
        prog = _progress(q)
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

    def throughput_run(self, sink: str, in_topic: str, n: int, label: str) -> dict:
        """``builtin`` or ``ours``."""
        out = f"bench-out-{sink}-{self.run_id}-{self.n_ckpt + 1:03d}"
        self.topics.create({out: self.args.parallelism})
        config = self.config(in_topic, out)
        dsw = self.builtin_writer(config) if sink == "builtin" else self.ours_writer(config)[0]
        res = self.run_available_now(dsw, n, label)
        res["output_topic"] = out
        return res


class DriverTimer:
    """Times the foreachBatch call on the driver and, inside it, the batch-complete write."""

    def __init__(self):
        self.calls: list[float] = []
        self.batch_complete: list[float] = []

    def wrap(self, writer):
        def each_batch(df, batch_id):
            t0 = time.perf_counter()
            try:
                writer(df, batch_id)
            finally:
                self.calls.append(time.perf_counter() - t0)
        return each_batch

    def __enter__(self):
        from eos_job import runtime
        self.orig = runtime.produce_sync

        def produce_sync(*a, **kw):
            t0 = time.perf_counter()
            try:
                return self.orig(*a, **kw)
            finally:
                self.batch_complete.append(time.perf_counter() - t0)
        runtime.produce_sync = produce_sync
        return self

    def __exit__(self, *exc):
        from eos_job import runtime
        runtime.produce_sync = self.orig
        return False

    def summary(self) -> dict:
        return {"foreach_batch_calls": len(self.calls), "foreach_batch_s": round(sum(self.calls), 2),
                "batch_complete_write_s": round(sum(self.batch_complete), 3)}


def time_split(r: dict) -> dict:
    """Wall seconds of one run by part, from the query progress and the event log."""
    st = r.get("stages") or {}
    trig = r["trigger_ms_total"] / 1000
    out = {"run_wall_s": r["wall_s"], "batches_s": round(trig, 2),
           "query_start_and_stop_s": round(r["wall_s"] - trig, 2), "spark_jobs_s": st.get("jobs_wall_s")}
    if st.get("jobs_wall_s") is not None:
        out["batch_outside_jobs_s"] = round(trig - st["jobs_wall_s"], 2)
    for k in ("map", "result"):
        if k in st:
            out[f"{k}_stages_s"] = st[k]["wall_s"]
            out[f"{k}_task_run_s"] = st[k]["task_run_s"]
            out[f"{k}_task_jvm_cpu_s"] = st[k]["task_jvm_cpu_s"]
    return out


def _progress(q) -> list[dict]:
    out = []
    for p in q.recentProgress:
        d = p if isinstance(p, dict) else json.loads(p.json)
        out.append(d)
    return out


# ------------------------------------------------------------------ latency
class LatencyProbe:
    """A paced, stamped producer and a read_committed consumer for one sink's run."""

    def __init__(self, bootstrap: str, in_topic: str, out_topic: str, rate: int, seconds: float, warmup: float):
        self.bootstrap, self.in_topic, self.out_topic = bootstrap, in_topic, out_topic
        self.rate, self.total = rate, int(rate * (seconds + warmup))
        self.first_counted = int(rate * warmup)
        self.lat_ns = np.full(self.total, -1, dtype=np.int64)
        self.dupes = 0
        self.produced = 0
        self.produce_lag_max = 0.0
        self.stop = threading.Event()
        self.consumer_thread = threading.Thread(target=self._consume, daemon=True, name="lat-consumer")
        self.producer_thread = threading.Thread(target=self._produce, daemon=True, name="lat-producer")
        self.received = 0

    def start_consumer(self) -> None:
        self.consumer_thread.start()

    def start_producer(self) -> None:
        self.producer_thread.start()

    def _produce(self) -> None:
        p = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 1, "acks": "all",
                      "enable.idempotence": True})
        pad = b"x" * (VALUE_BYTES - 10 - 1 - 19 - 1)
        start = time.perf_counter()
        sent = 0
        while sent < self.total and not self.stop.is_set():
            due = min(self.total, int((time.perf_counter() - start) * self.rate))
            self.produce_lag_max = max(self.produce_lag_max, (due - sent) / self.rate)
            while sent < due:
                k = b"%010d" % sent
                try:
                    p.produce(self.in_topic, key=k, value=b"%s|%019d|%s" % (k, time.time_ns(), pad))
                except BufferError:
                    p.poll(0.05)
                    continue
                sent += 1
            self.produced = sent
            p.poll(0)
            time.sleep(0.002)
        p.flush(60)
        self.produced = sent

    def _consume(self) -> None:
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"bench-lat-{uuid.uuid4().hex[:8]}",
                      "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                      "enable.auto.commit": False, "fetch.wait.max.ms": 10, "fetch.min.bytes": 1})
        parts = list(c.list_topics(self.out_topic, timeout=15).topics[self.out_topic].partitions)
        c.assign([TopicPartition(self.out_topic, p, OFFSET_BEGINNING) for p in parts])
        lat = self.lat_ns
        try:
            while not self.stop.is_set():
                msgs = c.consume(2000, 0.05)
                now = time.time_ns()
                for m in msgs:
                    if m.error() is not None:
                        continue
                    v = m.value()
                    seq = int(v[:10])
                    if 0 <= seq < self.total:
                        if lat[seq] >= 0:
                            self.dupes += 1
                        else:
                            lat[seq] = now - int(v[11:30])
                            self.received += 1
        finally:
            c.close()

    def wait_done(self, timeout: float) -> bool:
        self.producer_thread.join()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.received < self.produced:
            time.sleep(0.1)
        self.stop.set()
        self.consumer_thread.join(10)
        return self.received >= self.produced

    def stats(self) -> dict:
        counted = self.lat_ns[self.first_counted:]
        got = counted[counted >= 0] / 1e6
        out = {"produced": self.produced, "received": self.received, "duplicates": self.dupes,
               "counted": int(got.size), "missing_counted": int((counted < 0).sum()),
               "producer_max_lag_s": round(self.produce_lag_max, 3)}
        if got.size:
            out.update({"p50_ms": round(float(np.percentile(got, 50)), 1),
                        "p90_ms": round(float(np.percentile(got, 90)), 1),
                        "p99_ms": round(float(np.percentile(got, 99)), 1),
                        "max_ms": round(float(got.max()), 1), "mean_ms": round(float(got.mean()), 1)})
        return out


def latency_run(bench: Bench, sink: str) -> dict:
    a = bench.args
    in_topic = f"bench-lat-in-{sink}-{bench.run_id}"
    out_topic = f"bench-lat-out-{sink}-{bench.run_id}"
    bench.topics.create({in_topic: 4, out_topic: a.parallelism})
    config = bench.config(in_topic, out_topic)
    probe = LatencyProbe(bench.bootstrap, in_topic, out_topic, a.rate, a.seconds, a.latency_warmup)
    probe.start_consumer()
    writer = None
    if sink == "builtin":
        dsw = bench.builtin_writer(config).trigger(processingTime=f"{a.trigger_ms} milliseconds")
    else:
        dsw, writer = bench.ours_writer(config)  # build_query as is: processingTime trigger of the spec
    return _latency_query(bench, sink, dsw, writer, config, probe)


def _latency_query(bench: Bench, sink: str, dsw, writer, config, probe: LatencyProbe) -> dict:
    from eos_job import runtime
    c0 = bench.cpu.snapshot()
    e0 = time.time() * 1000
    q = dsw.start()
    probe.start_producer()
    t0 = time.monotonic()
    while probe.producer_thread.is_alive():
        probe.producer_thread.join(10)
        if q.exception() is not None:
            probe.stop.set()
            raise RuntimeError(f"latency {sink}: the query failed: {q.exception()}")
        say(f"    latency {sink}: {time.monotonic() - t0:4.0f}s, produced {probe.produced:,}, "
            f"received {probe.received:,}")
    complete = probe.wait_done(60)
    cpu = CpuMeter.delta(c0, bench.cpu.snapshot())
    if writer is not None:
        runtime._stop_at_boundary(q, writer, config)
    else:
        q.stop()
    prog = [p for p in _progress(q) if p["numInputRows"]]
    trig = sorted(p["durationMs"].get("triggerExecution", 0) for p in prog)
    res = probe.stats()
    time.sleep(0.2)
    res.update({"stages": bench.events.profile(e0, time.time() * 1000)})
    res.update({"complete": complete, "batches": len(trig), "cpu_s": cpu,
                "batch_ms_median": statistics.median(trig) if trig else None,
                "batch_ms_max": trig[-1] if trig else None,
                "rows_per_batch_median": statistics.median(p["numInputRows"] for p in prog) if prog else None})
    return res


# ------------------------------------------------------------------ phases
def phase_throughput(bench: Bench, tee: StderrTee) -> dict:
    a = bench.args
    n = a.records
    in_topic = f"bench-in-{bench.run_id}"
    warm_topic = f"bench-warm-{bench.run_id}"
    warm_n = min(n, a.warmup_records)
    bench.topics.create({in_topic: 4, warm_topic: 4})
    say(f"producing {n:,} input records of ~{KEY_BYTES + VALUE_BYTES} bytes into {in_topic} (4 partitions)")
    produce_s = produce_records(bench.bootstrap, in_topic, n)
    say(f"  done in {produce_s:.1f}s; {warm_n:,} warm-up records into {warm_topic}")
    produce_records(bench.bootstrap, warm_topic, warm_n)

    sinks = ["builtin", "ours"]
    warm = {}
    for sink in sinks:
        say(f"warm-up: {sink} sink on {warm_n:,} records")
        warm[sink] = bench.throughput_run(sink, warm_topic, warm_n, f"warm-up {sink}")
        say(f"  {sink}: {warm[sink]['records_per_s']:,} rec/s (batches {warm[sink]['batches']}, "
            f"median batch {warm[sink]['batch_ms_median']} ms)")

    runs: dict[str, list[dict]] = {s: [] for s in sinks}
    for rep in range(a.repeats):
        order = sinks if rep % 2 == 0 else list(reversed(sinks))
        for sink in order:
            before = tee.snapshot()
            say(f"repeat {rep + 1}/{a.repeats}: {sink} sink, {n:,} records")
            res = bench.throughput_run(sink, in_topic, n, f"{sink} #{rep + 1}")
            res["load_avg_1m"] = os.getloadavg()[0]
            after = tee.snapshot()
            res["refence_warnings"] = after["refence"] - before["refence"]
            res["task_failures"] = after["lost_task"] - before["lost_task"]
            cu = res["cpu_us_per_record"]
            say(f"  {sink}: {res['wall_s']:.2f}s = {res['records_per_s']:,} rec/s, CPU µs/record: "
                f"JVM {cu.get('jvm')}, Python workers {cu.get('python_workers')}, driver {cu.get('driver')}, "
                f"broker {cu.get('broker')}, rest of machine {cu.get('other')} "
                f"({res['batches']} batches, median batch {res['batch_ms_median']} ms, {res['refence_warnings']} re-fences, "
                f"{res['task_failures']} failed tasks); verifying output")
            res["audit"] = audit(bench.bootstrap, res["output_topic"], n)
            au = res["audit"]
            say(f"  {sink} output (read_committed): {au['records']:,} records, {au['distinct']:,} distinct keys, "
                f"{au['duplicates']} duplicates, {au['missing']} missing")
            if sink != "builtin" and (au["records"] != n or au["distinct"] != n):
                raise RuntimeError(f"exactly-once sink ({sink}) wrote {au} for {n} input records")
            if sink == "builtin" and au["missing"]:
                raise RuntimeError(f"built-in sink lost records: {au}")
            runs[sink].append(res)
    med = {s: statistics.median(r["wall_s"] for r in runs[s]) for s in runs}
    rps = {s: round(n / med[s]) for s in runs}
    ratios = {s: round(rps[s] / rps["builtin"], 3) for s in runs if s != "builtin"}
    cpu = {}
    for s in runs:
        keys = runs[s][0].get("cpu_us_per_record", {}).keys()
        cpu[s] = {k: round(statistics.median(r["cpu_us_per_record"][k] for r in runs[s]), 2) for k in keys}
        if cpu[s]:
            cpu[s]["spark+broker"] = round(cpu[s]["spark"] + cpu[s]["broker"], 2)
    cpu_ratios = {s: round(cpu[s]["spark+broker"] / cpu["builtin"]["spark+broker"], 3)
                  for s in runs if s != "builtin" and cpu[s] and cpu["builtin"]}
    where = {}
    for s in runs:
        r = sorted(runs[s], key=lambda x: x["wall_s"])[len(runs[s]) // 2]
        where[s] = time_split(r)
        say(f"  where the time goes ({s}, median run): {where[s]}")
    for s in ratios:
        say(f"throughput: built-in {rps['builtin']:,} rec/s, {s} {rps[s]:,} rec/s, ratio {ratios[s]:.2f}; "
            f"CPU per record (Spark + broker) {s}/built-in {cpu_ratios.get(s)}")
    return {"records": n, "input_topic": in_topic, "warmup_topic": warm_topic, "warmup_records": warm_n,
            "produce_s": round(produce_s, 2), "warmup": warm,
            "runs": runs, "median_wall_s": med, "records_per_s": rps, "ratio": ratios["ours"], "ratios": ratios,
            "cpu_us_per_record_median": cpu, "cpu_ratio": cpu_ratios.get("ours"), "cpu_ratios": cpu_ratios,
            "time_split_median_run": where}


BREAKDOWN_VARIANTS = ("builtin", "builtin+repartition", "arrow", "tx", "tx-onlyerror", "ours")


def phase_breakdown(bench: Bench, tee: StderrTee, in_topic: str, n: int) -> dict:
    """One run per variant over the same input: the exactly-once write path cut after each step
    (``benchmarks/sink_probes.py``), and the sink itself with its driver-side times."""
    out: dict[str, dict] = {}
    for v in BREAKDOWN_VARIANTS:
        say(f"breakdown: {v} on {n:,} records")
        topic = f"bench-out-probe-{bench.run_id}-{bench.n_ckpt + 1:03d}"
        bench.topics.create({topic: bench.args.parallelism})
        config = bench.config(in_topic, topic)
        stats: list[dict] = []
        before = tee.snapshot()
        if v.startswith("builtin"):
            dsw = bench.builtin_writer(config, repartition=v == "builtin+repartition")
            res = bench.run_available_now(dsw, n, v)
        elif v == "ours":
            timer = DriverTimer()
            dsw, _ = bench.ours_writer(config, timer)
            with timer:
                res = bench.run_available_now(dsw, n, v)
            res["driver_timing"] = timer.summary()
            say(f"    driver: {res['driver_timing']}")
        else:
            dsw = bench.probe_writer(config, v, stats)
            res = bench.run_available_now(dsw, n, v)
        res["refence_warnings"] = tee.snapshot()["refence"] - before["refence"]
        res["task_failures"] = tee.snapshot()["lost_task"] - before["lost_task"]
        res["time_split"] = time_split(res)
        say(f"    time split: {res['time_split']}")
        if v == "ours":
            au = audit(bench.bootstrap, topic, n)
            res["audit"] = au
            if au["records"] != n or au["distinct"] != n:
                raise RuntimeError(f"{v} wrote {au} for {n} input records")
        if stats:
            rows = sum(s["rows"] for s in stats)
            if rows != n:
                raise RuntimeError(f"probe {v}: slots saw {rows} rows, expected {n}")
            for k in ("t_recv", "t_convert", "t_produce", "t_commit"):
                res[f"{k}_s"] = round(sum(s[k] for s in stats), 2)  # summed over slot tasks
            res["python_workers"] = len({s["pid"] for s in stats})
        cu = res["cpu_us_per_record"]
        say(f"  {v}: {res['wall_s']:.2f}s = {res['records_per_s']:,} rec/s, CPU µs/record JVM {cu.get('jvm')} "
            f"Python {cu.get('python_workers')} driver {cu.get('driver')} broker {cu.get('broker')} "
            f"other {cu.get('other')}, median batch {res['batch_ms_median']} ms, "
            f"{res['refence_warnings']} re-fences, {res['task_failures']} failed tasks"
            + (f" (slot task seconds: recv {res['t_recv_s']}, convert {res['t_convert_s']}, "
               f"produce {res['t_produce_s']}, flush/commit {res['t_commit_s']})" if stats else ""))
        out[v] = res
    return out


def phase_latency(bench: Bench, tee: StderrTee) -> dict:
    a = bench.args
    res = {}
    sinks = ("builtin", "ours")
    for sink in sinks:
        before = tee.snapshot()
        say(f"latency: {sink} sink, {a.rate:,} rec/s for {a.latency_warmup:.0f}s warm-up + {a.seconds:.0f}s, "
            f"trigger {a.trigger_ms} ms")
        r = latency_run(bench, sink)
        after = tee.snapshot()
        r["refence_warnings"] = after["refence"] - before["refence"]
        r["task_failures"] = after["lost_task"] - before["lost_task"]
        res[sink] = r
        say(f"  {sink}: p50 {r.get('p50_ms')} ms, p99 {r.get('p99_ms')} ms, max {r.get('max_ms')} ms "
            f"({r['counted']:,} records counted, {r['missing_counted']} missing, {r['duplicates']} duplicates, "
            f"median batch {r['batch_ms_median']} ms)")
    b, o = res["builtin"], res["ours"]
    if b.get("p50_ms") and o.get("p50_ms"):
        res["ratio_p50"] = round(o["p50_ms"] / b["p50_ms"], 2)
        res["ratio_p99"] = round(o["p99_ms"] / b["p99_ms"], 2)
    return res


# ------------------------------------------------------------------ report
def machine_info(bench: Bench) -> dict:
    import confluent_kafka
    import pyarrow
    jars = os.environ.get("SPARK_JARS", "")
    kc = re.search(r"kafka-clients-([\d.]+)\.jar", jars)
    return {**report.machine_info(), "spark_jvm": bench.spark.version,
            "kafka_clients_jar": kc.group(1) if kc else "unknown",
            "confluent_kafka": getattr(confluent_kafka, "__version__", None) or str(confluent_kafka.version()),
            "pyarrow": pyarrow.__version__, "load_avg_start": bench.load_start, "load_avg_end": list(os.getloadavg())}


def settings(a) -> dict:
    return {"records": a.records, "repeats": a.repeats, "warmup_records": a.warmup_records,
            "parallelism": a.parallelism, "input_partitions": 4, "output_partitions": a.parallelism,
            "max_offsets_per_trigger": a.max_offsets, "trigger_ms": a.trigger_ms, "rate": a.rate,
            "seconds": a.seconds, "latency_warmup_s": a.latency_warmup, "record_bytes": KEY_BYTES + VALUE_BYTES,
            "spark_master": "?"}


def markdown(res: dict) -> str:
    m, s = res["machine"], res["settings"]
    lines = [f"# Sink benchmark {res['date']}", "",
             "Spark's built-in Kafka sink (`format(\"kafka\")`, at-least-once) against the exactly-once "
             "sink (`BatchWriter` via foreachBatch), same job (passthrough), same input, same SparkSession, "
             "same parallelism and maxOffsetsPerTrigger. Produced by `benchmarks/sink_throughput.py`.", "",
             f"Machine: {m['cores']} cores ({m['cpu']}), {m['ram_gb']} GB RAM, shared (load average "
             f"{m['load_avg_start'][0]:.1f} at start, {m['load_avg_end'][0]:.1f} at end); Python {m['python']}, "
             f"PySpark {m['pyspark']} (`{s['spark_master']}`), Kafka broker {m['kafka_broker']} (single node, "
             f"same machine), Spark's kafka-clients {m['kafka_clients_jar']}, confluent-kafka "
             f"{m['confluent_kafka']} (librdkafka {m['librdkafka']}), pyarrow {m['pyarrow']}.", "",
             f"Settings: {s['records']:,} records of ~{s['record_bytes']} bytes, {s['input_partitions']} input "
             f"partitions, parallelism {s['parallelism']} ({s['output_partitions']} output partitions / slots), "
             f"maxOffsetsPerTrigger {s['max_offsets_per_trigger']:,}, {s['repeats']} alternating repeats "
             f"(median) after a {s['warmup_records']:,}-record warm-up of each sink; latency at "
             f"{s['rate']:,} rec/s for {s['seconds']:.0f}s (after {s['latency_warmup_s']:.0f}s not counted), "
             f"processingTime trigger {s['trigger_ms']} ms, read_committed consumer.", "",
             "| measure | built-in (at-least-once) | exactly-once (ours) | ours / built-in |",
             "| --- | ---: | ---: | ---: |"]
    t = res.get("throughput")
    if t:
        lines.append(f"| throughput, records/s (median of {s['repeats']}) | {t['records_per_s']['builtin']:,} | "
                     f"{t['records_per_s']['ours']:,} | {t['ratio']:.2f} |")
        for sx in [k for k in t["records_per_s"] if k.startswith("ours+")]:
            lines.append(f"| throughput, records/s, {sx} (candidate fixes, median of {s['repeats']}) | "
                         f"{t['records_per_s']['builtin']:,} | {t['records_per_s'][sx]:,} | {t['ratios'][sx]:.2f} |")
        lines.append(f"| wall time for {t['records']:,} records, s | {t['median_wall_s']['builtin']:.2f} | "
                     f"{t['median_wall_s']['ours']:.2f} | {t['median_wall_s']['ours'] / t['median_wall_s']['builtin']:.2f} |")
        for sink in ("builtin", "ours"):
            t[f"_walls_{sink}"] = ", ".join(f"{r['wall_s']:.2f}" for r in t["runs"][sink])
        lines.append(f"| all runs, s | {t['_walls_builtin']} | {t['_walls_ours']} | |")
        for sx in [k for k in t["runs"] if k.startswith("ours+")]:
            walls = ", ".join(f"{r['wall_s']:.2f}" for r in t["runs"][sx])
            lines.append(f"| all runs, s, {sx} | | {walls} | |")
        cb, co = t.get("cpu_us_per_record_median", {}).get("builtin"), t.get("cpu_us_per_record_median", {}).get("ours")
        if cb and co:
            for k, label in (("spark+broker", "Spark (driver + JVM + Python workers) + broker"), ("jvm", "JVM"),
                             ("python_workers", "Python workers"), ("driver", "driver Python"),
                             ("broker", "Kafka broker"), ("other", "rest of the machine (noise)")):
                ratio = f"{co[k] / cb[k]:.2f}" if cb[k] > 0 and k in ("spark+broker", "jvm", "broker") else ""
                lines.append(f"| CPU µs per record: {label} | {cb[k]} | {co[k]} | {ratio} |")
        ws = t.get("time_split_median_run") or {}
        if ws.get("builtin") and ws.get("ours"):
            for k, label in (("batches_s", "micro-batches (sum of triggerExecution)"),
                             ("query_start_and_stop_s", "query start and stop"),
                             ("spark_jobs_s", "Spark jobs"),
                             ("batch_outside_jobs_s", "batch time outside Spark jobs (planning, offsets, commit log, "
                                                      "foreachBatch driver work)"),
                             ("map_stages_s", "shuffle-map stages (Kafka read + shuffle write)"),
                             ("result_stages_s", "result stages (built-in: read + write; ours: slot tasks)"),
                             ("result_task_run_s", "result tasks' run time, summed over tasks"),
                             ("result_task_jvm_cpu_s", "result tasks' JVM CPU, summed")):
                lines.append(f"| wall s, median run: {label} | {ws['builtin'].get(k, '-')} | {ws['ours'].get(k, '-')} | |")
        rf = {k: (sum(r.get("refence_warnings", 0) for r in t["runs"][k]),
                  sum(r.get("task_failures", 0) for r in t["runs"][k])) for k in ("builtin", "ours")}
        lines.append(f"| slot re-fences / failed tasks, all runs | {rf['builtin'][0]} / {rf['builtin'][1]} | "
                     f"{rf['ours'][0]} / {rf['ours'][1]} | |")
        for sink in ("builtin", "ours"):
            del t[f"_walls_{sink}"]
    lat = res.get("latency")
    if lat:
        b, o = lat["builtin"], lat["ours"]
        for q in ("p50", "p99"):
            if b.get(f"{q}_ms") and o.get(f"{q}_ms"):
                lines.append(f"| end-to-end latency {q}, ms | {b[f'{q}_ms']} | {o[f'{q}_ms']} | "
                             f"{o[f'{q}_ms'] / b[f'{q}_ms']:.2f} |")
        lines.append(f"| latency: median batch duration, ms | {b['batch_ms_median']} | {o['batch_ms_median']} | |")
        for sink in [k for k in lat if k.startswith("ours+")]:
            f = lat[sink]
            for q in ("p50", "p99"):
                if b.get(f"{q}_ms") and f.get(f"{q}_ms"):
                    lines.append(f"| end-to-end latency {q}, ms, {sink} (candidate fix) | {b[f'{q}_ms']} | "
                                 f"{f[f'{q}_ms']} | {f[f'{q}_ms'] / b[f'{q}_ms']:.2f} |")
            lines.append(f"| latency: median batch duration, ms, {sink} | {b['batch_ms_median']} | "
                         f"{f['batch_ms_median']} | |")
    bd = res.get("breakdown")
    if bd:
        n_bd = res["throughput"]["warmup_records"] if t else "?"
        lines += ["", f"Breakdown: one run per variant over the same {n_bd:,} records (the warm-up topic), same "
                  "settings. The probes (`benchmarks/sink_probes.py`) cut the exactly-once write path after each "
                  "step; `ours` is the sink itself (runs before 2026-11-24 also had `ours+...` variants: "
                  "candidate fixes applied in the benchmark only, since merged into the sink). Slot task "
                  "seconds are summed over the parallel slot tasks.", "",
                  "| variant | records/s | CPU µs/rec Spark+broker | of which JVM | Python workers | median batch ms "
                  "| re-fences | failed tasks | recv (shuffle + Arrow) s | convert s | produce loop s | flush/commit s |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for v, r in bd.items():
            cu = r.get("cpu_us_per_record") or {}
            sb = round(cu["spark"] + cu["broker"], 2) if cu else ""
            lines.append(f"| {v} | {r['records_per_s']:,} | {sb} | {cu.get('jvm', '')} | {cu.get('python_workers', '')} "
                         f"| {r['batch_ms_median']} | {r.get('refence_warnings', '')} | "
                         f"{r.get('task_failures', '')} | {r.get('t_recv_s', '')} | {r.get('t_convert_s', '')} | "
                         f"{r.get('t_produce_s', '')} | {r.get('t_commit_s', '')} |")
        dr = (bd.get("ours") or {}).get("driver_timing")
        if dr:
            lines += ["", f"Driver side of `ours`: {dr['foreach_batch_calls']} foreachBatch calls took "
                      f"{dr['foreach_batch_s']} s, of which {dr['batch_complete_write_s']} s batch-complete writes."]
    timed = {v: r for v, r in (bd or {}).items() if r.get("slot_timing")}
    if lat:
        timed.update({f"latency: {k}": v for k, v in lat.items() if isinstance(v, dict) and v.get("slot_timing")})
    if timed:
        lines += ["", "Slot task time split of the timed variants (a step timer of the runs before 2026-11-24; "
                  "seconds summed over slot tasks, "
                  "and the median task in ms):", "",
                  "| variant | tasks | task s | recv s | fence s | ledger read s | produce loop s | begin+ledger+commit s "
                  "| median task ms: fence / ledger read / produce / commit | driver foreachBatch s | "
                  "batch-complete write s |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |"]
        for v, r in timed.items():
            st, dr, med = r["slot_timing"], r.get("driver_timing", {}), r["slot_timing"]["per_task_ms_median"]
            lines.append(f"| {v} | {st['tasks']} | {st['task_s']} | {st['recv_s']} | {st['fence_s']} | "
                         f"{st['read_latest_s']} | {st['produce_loop_s']} | {st['tx_rest_s']} | "
                         f"{med['fence']} / {med['read_latest']} / {med['produce_loop']} / {med['tx_rest']} | "
                         f"{dr.get('foreach_batch_s', '')} | {dr.get('batch_complete_write_s', '')} |")
    return report.tail(lines, res)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000, help="records for the throughput phase")
    ap.add_argument("--repeats", type=int, default=3, help="measured runs per sink (alternating order)")
    ap.add_argument("--warmup-records", type=int, default=300_000, help="records of each sink's warm-up run")
    ap.add_argument("--max-offsets", type=int, default=100_000, help="maxOffsetsPerTrigger of both sinks")
    ap.add_argument("--parallelism", type=int, default=2, help="slots = output partitions (the session is local[*,4]: one task slot per core)")
    ap.add_argument("--rate", type=int, default=5000, help="latency phase: records/s")
    ap.add_argument("--seconds", type=float, default=30, help="latency phase: measured seconds per sink")
    ap.add_argument("--latency-warmup", type=float, default=5, help="latency phase: seconds not counted")
    ap.add_argument("--trigger-ms", type=int, default=500, help="processingTime trigger of the latency phase")
    ap.add_argument("--skip", action="append", default=[], choices=["throughput", "latency"],
                    help="skip a phase (repeatable)")
    ap.add_argument("--breakdown", action="store_true",
                    help="also profile: the write path cut step by step next to the sink itself "
                         "(throughput on the warm-up records)")
    ap.add_argument("--keep-topics", action="store_true", help="do not delete the benchmark's topics")
    report.add_results_args(ap, "sink")
    a = ap.parse_args(argv)
    if a.render:
        return report.render(a.render, a.findings, markdown)

    bootstrap, _ = stack_env()
    date = dt.date.today().isoformat()
    out_path = Path(a.out) if a.out else REPO / "benchmarks" / "results" / f"{date}-sink.md"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    bench = Bench(a, bootstrap)
    bench.load_start = list(os.getloadavg())
    tee = StderrTee(bench.work / "stderr.log")
    bench.tee = tee
    say(f"sink benchmark {bench.run_id}: Kafka at {bootstrap}, work dir {bench.work}")
    res: dict = {"date": date, "run_id": bench.run_id, "settings": settings(a)}
    try:
        say("starting the SparkSession")
        bench.session()
        res["machine"] = machine_info(bench)
        res["settings"]["spark_master"] = bench.spark.sparkContext.master
        if "throughput" not in a.skip:
            res["throughput"] = phase_throughput(bench, tee)
            if a.breakdown:
                t = res["throughput"]
                res["breakdown"] = phase_breakdown(bench, tee, t["warmup_topic"], t["warmup_records"])
        if "latency" not in a.skip:
            res["latency"] = phase_latency(bench, tee)
        res["machine"]["load_avg_end"] = list(os.getloadavg())
        res["stderr"] = {"counts": tee.snapshot(), "samples": tee.samples}
        report.add_findings(res, a.findings)
        text = markdown(res)
        out_path.write_text(text)
        say(f"results written to {out_path}")
        print()
        print("\n".join(line for line in text.split("## Raw results")[0].splitlines()))
        return 0
    finally:
        if bench.spark is not None:
            for q in bench.spark.streams.active:
                q.stop()
        if not a.keep_topics:
            say("deleting the benchmark's topics")
            bench.topics.delete_all()
        shutil.rmtree(bench.work / "checkpoints", ignore_errors=True)
        for d in bench.work.glob("run*"):
            shutil.rmtree(d, ignore_errors=True)
        say(f"stderr of the run (JVM, Python workers) kept in {bench.work / 'stderr.log'}")


if __name__ == "__main__":
    sys.exit(main())
