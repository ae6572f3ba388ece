#!/usr/bin/env python3
"""Executors benchmark: the exactly-once sink job in Spark local mode against cluster mode with executor Pods.

The sink benchmark's exactly-once run (``benchmarks/sink_throughput.py``: the
passthrough job of ``benchmarks/passthrough.py``, ~100-byte keyed records,
parallelism 2, maxOffsetsPerTrigger 100,000) here runs the production path:
an ExactlyOnceStream applied to the local stack's API server, the operator
(a local process for one namespace of our own, labelled for the restricted Pod
Security level) and the process kubelet (``tests/harness/kubelet.py``), which
runs the driver Pod and Spark's executor Pods as local processes. Two modes,
same input, same spec but for the deploy mode:

* **local**: ``deployMode: local`` (the default), Spark local mode
  (``local[*,4]``) inside the one driver Pod;
* **cluster**: ``deployMode: cluster``, the driver Pod runs Spark's Kubernetes
  scheduler, which creates ``--executors`` executor Pods (1 core and
  ``--executor-memory`` each) under the job's ServiceAccount (its RBAC
  rendered from the chart by helm, as in ``tests/e2e/test_cluster_mode_e2e.py``);
  the shuffle to the output slots goes between executor JVMs.

N records are produced once into a 4-partition topic. Each run is a new stream
with a fresh checkpoint (``store: local``, under the stack's state folder) and
a fresh output topic; modes alternate over ``--repeats`` (local first in odd
repeats, cluster first in even ones). A run ends when the checkpoint's commit
log holds the batch whose offsets reach the input's end: the slot
transactions are committed before Spark writes that entry, so every record is
then visible read_committed. The stream is then deleted (its driver and
executor Pods go), and the output is read back read_committed: every key
exactly once, set equality with the input's keys.

Times per run (epoch seconds; Kubernetes timestamps have 1 s resolution):

* **end-to-end**: from ``kubectl apply`` to the commit-log entry of the last
  batch. Includes the operator's resolution, the driver Pod's start, the
  driver's JVM and SparkSession, in cluster mode the executor Pods' start and
  registration (the driver starts its query once one executor registered),
  and all batches;
* **processing**: from the offset-log entry of batch 0 (written when the first
  batch starts) to the commit-log entry of the last batch: the batches alone;
* **startup**: the difference: apply to the first batch.

CPU seconds by component over each run's end-to-end interval (from /proc,
sampled twice a second): driver Pod (its JVM and, in local mode, the Python
workers), executor Pods (JVMs and their Python workers), the operator, this
process (with the kubelet's threads), the broker, the API server with etcd and
the controller-manager, and the rest of the machine (other work: the noise).
Load average and other engineers' java/pytest processes are recorded before
and after each run.

Results: ``benchmarks/results/<date>-executors.md`` (or ``--out``) with the
settings, the machine, a table and the JSON of every measurement;
``--render FILE --findings NOTES.md`` adds notes to a results file.

Run: ``make bench-executors``, or
``EOS_STATE=.stack PYTHONPATH=stack:. .venv/bin/python benchmarks/executors.py --records 200000 --repeats 1``.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for _p in (REPO / "operator", REPO / "jobs", REPO, REPO / "stack"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import numpy as np  # noqa: E402
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition  # noqa: E402

from benchmarks.sink_throughput import KEY_BYTES, VALUE_BYTES, Topics, produce_records  # noqa: E402
from eos_job import checkpoint  # noqa: E402
from eos_stack import cluster  # noqa: E402
from eos_stack.cluster import RESTRICTED, Kubectl, wait_until  # noqa: E402
from eos_stack.common import Stack  # noqa: E402

T0 = time.monotonic()
SA = "spark-eos-driver"          # the job ServiceAccount the chart's job RBAC creates
MODES = ("local", "cluster")
GROUP = "streaming.eos.dev"
VERSION = "v1alpha1"


def say(msg: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {msg}", flush=True)


# ------------------------------------------------------------------ CPU by component
class CpuMeter:
    """CPU seconds by component, from /proc, sampled every ``interval`` seconds by a thread.

    Components: the Pods the process kubelet runs (its children whose environment names a Pod: ``HOSTNAME`` and
    ``EOS_TERMINATION_MESSAGE_PATH``), split into ``driver`` and ``executors`` by Pod name, with all their
    descendants (JVMs, Python workers); ``operator`` (its pid); ``bench`` (this process and its other children);
    ``broker`` and ``kube`` (the stack's daemons, by pid file); ``machine`` (busy time of all CPUs). A process's
    increments are summed between samples, so processes that come and go are counted, less their last interval.
    """
    CLK = os.sysconf("SC_CLK_TCK")
    GROUPS = ("driver", "executors", "pods_other", "operator", "bench", "broker", "kube")

    def __init__(self, operator_pid, interval: float = 0.5):
        self.operator_pid = operator_pid          # a function: the operator may not run yet
        self.stack = Stack()
        self.totals = {g: 0.0 for g in self.GROUPS}
        self.last: dict[tuple[int, int], float] = {}
        self.pod_of: dict[tuple[int, int], str] = {}
        self.lock = threading.Lock()
        self._sample(baseline=True)
        threading.Thread(target=self._loop, args=(interval,), daemon=True, name="cpu-meter").start()

    @classmethod
    def procs(cls) -> dict[int, tuple[int, str, float, int]]:
        """pid -> (ppid, comm, CPU seconds of the process's threads, start time)."""
        out = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            rp = stat.rindex(")")
            fields = stat[rp + 2:].split()
            out[int(d)] = (int(fields[1]), stat[stat.index("(") + 1:rp],
                           (int(fields[11]) + int(fields[12])) / cls.CLK, int(fields[19]))
        return out

    @classmethod
    def machine_busy(cls) -> float:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return (sum(v) - v[3] - (v[4] if len(v) > 4 else 0)) / cls.CLK   # all but idle and iowait

    @staticmethod
    def pod_name(pid: int) -> str | None:
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            return None
        if not any(e.startswith(b"EOS_TERMINATION_MESSAGE_PATH=") for e in env):
            return None
        host = [e for e in env if e.startswith(b"HOSTNAME=")]
        return host[-1].split(b"=", 1)[1].decode() if host else None

    def _classify(self, pid: int, start: int, procs) -> str:
        if pid == self.operator_pid():
            return "operator"
        key = (pid, start)
        if key not in self.pod_of:
            self.pod_of[key] = self.pod_name(pid) or ""
        pod = self.pod_of[key]
        if not pod:
            return "bench"
        return "executors" if "-exec-" in pod else "driver" if "-driver-" in pod else "pods_other"

    def _sample(self, baseline: bool = False) -> None:
        procs = self.procs()
        kids: dict[int, list[int]] = {}
        for pid, (ppid, *_rest) in procs.items():
            kids.setdefault(ppid, []).append(pid)
        groups: dict[int, str] = {}
        me = os.getpid()
        groups[me] = "bench"
        for child in kids.get(me, []):
            g = self._classify(child, procs[child][3], procs)
            todo = [child]
            while todo:
                p = todo.pop()
                groups[p] = g
                todo.extend(kids.get(p, []))
        for name, g in (("kafka", "broker"), ("kube-apiserver", "kube"), ("kube-etcd", "kube"),
                        ("kube-controller-manager", "kube")):
            pid = self.stack.running_pid(name)
            todo = [pid] if pid in procs else []
            while todo:
                p = todo.pop()
                groups[p] = g
                todo.extend(kids.get(p, []))
        with self.lock:
            seen = set()
            for pid, g in groups.items():
                key = (pid, procs[pid][3])
                seen.add(key)
                cur = procs[pid][2]
                prev = self.last.get(key)
                if prev is None:
                    prev = cur if baseline else 0.0   # born since the last sample: all of it is new
                self.totals[g] += max(0.0, cur - prev)
                self.last[key] = cur
            for key in [k for k in self.last if k not in seen]:
                del self.last[key]
                self.pod_of.pop(key, None)

    def _loop(self, interval: float) -> None:
        while True:
            time.sleep(interval)
            try:
                self._sample()
            except Exception:  # noqa: BLE001 - a process vanished mid-read: the next sample
                pass

    def snapshot(self) -> dict[str, float]:
        self._sample()
        with self.lock:
            snap = dict(self.totals)
        snap["machine"] = self.machine_busy()
        return snap

    @staticmethod
    def delta(a: dict, b: dict) -> dict[str, float]:
        d = {k: round(b[k] - a[k], 2) for k in a}
        d["spark"] = round(d["driver"] + d["executors"] + d["pods_other"], 2)
        ours = d["spark"] + d["operator"] + d["bench"] + d["broker"] + d["kube"]
        d["other"] = round(d.pop("machine") - ours, 2)
        return d


def foreign_processes(mine: set[int]) -> list[str]:
    """java and pytest processes on the machine that are not this benchmark's nor the stack's broker: other
    engineers' tests, whose CPU disturbs the measurement."""
    stack = Stack()
    skip = set(mine) | {stack.running_pid("kafka")}
    out = []
    for pid, (_ppid, comm, _cpu, _st) in CpuMeter.procs().items():
        if pid in skip:
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if comm == "java" or "pytest" in cmd:
            out.append(f"{pid} {comm} {cmd[:80]}")
    return out


def my_tree() -> set[int]:
    procs = CpuMeter.procs()
    kids: dict[int, list[int]] = {}
    for pid, (ppid, *_r) in procs.items():
        kids.setdefault(ppid, []).append(pid)
    out, todo = set(), [os.getpid()]
    while todo:
        p = todo.pop()
        out.add(p)
        todo.extend(kids.get(p, []))
    return out


# ------------------------------------------------------------------ Kafka
def input_ends(bootstrap: str, topic: str) -> dict[str, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-ends-{uuid.uuid4().hex[:6]}"})
    try:
        parts = c.list_topics(topic, timeout=15).topics[topic].partitions
        return {str(p): c.get_watermark_offsets(TopicPartition(topic, p), timeout=15)[1] for p in parts}
    finally:
        c.close()


def audit(bootstrap: str, topic: str, n: int) -> dict:
    """Read ``topic`` read_committed: every key 0..n-1 counted, and the first and last record timestamps."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-audit-{uuid.uuid4().hex[:8]}",
                  "isolation.level": "read_committed", "enable.partition.eof": True,
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        parts = list(c.list_topics(topic, timeout=15).topics[topic].partitions)
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        seen = np.zeros(n, dtype=np.uint32)
        eof: set[int] = set()
        total = other = 0
        first_ms, last_ms = None, None
        deadline = time.monotonic() + 300
        while len(eof) < len(parts):
            if time.monotonic() > deadline:
                raise TimeoutError(f"audit of {topic}: no end of partitions after 300s")
            for m in c.consume(10_000, 1.0):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        eof.add(m.partition())
                        continue
                    raise RuntimeError(f"audit of {topic}: {err}")
                total += 1
                ts = m.timestamp()[1]
                first_ms = ts if first_ms is None else min(first_ms, ts)
                last_ms = ts if last_ms is None else max(last_ms, ts)
                k = int(m.key())
                if 0 <= k < n:
                    seen[k] += 1
                else:
                    other += 1
        distinct = int(np.count_nonzero(seen))
        return {"records": total, "distinct": distinct, "duplicates": total - distinct - other,
                "missing": n - distinct, "unexpected": other,
                "first_record_ts": first_ms / 1000 if first_ms else None,
                "last_record_ts": last_ms / 1000 if last_ms else None}
    finally:
        c.close()


# ------------------------------------------------------------------ the benchmark
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) INFO eos_job[.a-z]*: (.*)$")
BATCH = re.compile(r"^batch (\d+) committed: (\d+) records.*\((\d+) ms\)$")


def driver_log(path: Path) -> dict:
    """From the driver's log (the runtime's own lines, local time to the millisecond): when its executors
    registered (cluster mode), when the SparkSession was ready (the driver epoch is claimed right after), when
    the query started, and each batch's foreachBatch duration (the sink's write, with the Spark jobs it runs) as
    the runtime logs it at commit."""
    out: dict = {"batch_ms": []}
    if not path.exists():
        return out
    for line in path.read_text(errors="replace").splitlines():
        m = LOG_LINE.match(line)
        if not m:
            continue
        t = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000
        msg = m.group(3)
        if "executor(s) registered" in msg:
            out.setdefault("executors_registered", t)
        elif msg.startswith("driver epoch"):
            out.setdefault("session_ready", t)
        elif msg.startswith("stream ") and " started (" in msg:
            out.setdefault("query_started", t)
        elif BATCH.match(msg):
            b = BATCH.match(msg)
            out["batch_ms"].append(int(b.group(3)))
    return out


class Bench:
    def __init__(self, args, env: dict[str, str], kubectl: Kubectl, namespace: str, work: Path):
        from kubernetes import client, config
        self.args, self.env, self.kubectl, self.ns, self.work = args, env, kubectl, namespace, work
        self.bootstrap = env["KAFKA_BOOTSTRAP"]
        self.run_id = namespace.rsplit("-", 1)[1]
        self.topics = Topics(self.bootstrap)
        api = config.new_client_from_config(config_file=env["KUBECONFIG"])
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.operator: cluster.OperatorProcess | None = None
        self.kubelet = None
        self.cpu = CpuMeter(lambda: self.operator.proc.pid if self.operator and self.operator.proc else None)

    def diag(self) -> str:
        from tests.e2e.streams import Diagnostics
        return Diagnostics(self.kubectl, self.ns, self.operator, self.kubelet)()

    def manifest(self, name: str, mode: str, in_topic: str, out_topic: str, ckpt: Path) -> dict:
        a = self.args
        job = {"module": "benchmarks.passthrough", "parallelism": a.parallelism, "serviceAccountName": SA}
        if mode == "cluster":
            job.update({"deployMode": "cluster",
                        "executor": {"instances": a.executors, "cpu": "1", "memory": a.executor_memory,
                                     "startTimeoutSeconds": 180}})
        return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ExactlyOnceStream", "metadata": {"name": name},
                "spec": {"job": job,
                         "source": {"bootstrapServers": self.bootstrap, "topics": [in_topic],
                                    "maxOffsetsPerTrigger": a.max_offsets},
                         "sink": {"bootstrapServers": self.bootstrap, "topic": out_topic},
                         "checkpoint": {"store": "local", "path": str(ckpt)},
                         "triggerIntervalMs": a.trigger_ms,
                         # A failure ends the run (Failed) instead of a restart hidden in the timing.
                         "restartStrategy": {"type": "fixed-delay", "fixedDelay": {"attempts": 0, "delaySeconds": 1}}}}

    def status(self, name: str) -> dict:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, "exactlyoncestreams",
                                                        name).get("status") or {}

    def pods(self) -> list:
        return self.core.list_namespaced_pod(self.ns).items

    def run(self, mode: str, label: str, in_topic: str, n: int, ends: dict[str, int]) -> dict:
        a = self.args
        out = f"bench-exec-out-{self.run_id}-{label}"
        self.topics.create({out: a.parallelism})
        self.topics.track(f"{out}.eos-ledger.{self.ns}.{label}")
        ckpt = self.work / label
        live = ckpt / "live"
        doc = self.manifest(label, mode, in_topic, out, ckpt)
        mine = my_tree()
        res: dict = {"mode": mode, "label": label, "output_topic": out, "load_before": list(os.getloadavg()),
                     "foreign_before": foreign_processes(mine)}
        c0 = self.cpu.snapshot()
        t_apply = time.time()
        self.kubectl.apply(doc, self.ns)
        done_batch, seen_commits, last_status = None, set(), 0.0
        driver_first = None
        while done_batch is None:
            now = time.time()
            if now - t_apply > a.run_timeout:
                raise AssertionError(f"{label}: not done within {a.run_timeout}s\n{self.diag()}")
            if now - last_status > 2:
                last_status = now
                st = self.status(label)
                if st.get("lifecycleState") == "Failed":
                    raise AssertionError(f"{label} failed: {st.get('lastError')}\n{self.diag()}")
                driver_first = driver_first or st.get("driverPod")
            if (live / "commits").is_dir():
                for b in checkpoint.committed_batches(live):
                    if b in seen_commits:
                        continue
                    seen_commits.add(b)
                    if checkpoint.kafka_offsets(live, b).get(in_topic) == ends:
                        done_batch = b
            time.sleep(0.25)
        t_last = (live / "commits" / str(done_batch)).stat().st_mtime
        t_first = (live / "offsets" / "0").stat().st_mtime
        c1 = self.cpu.snapshot()
        res["load_after"] = list(os.getloadavg())
        res["foreign_after"] = foreign_processes(my_tree())
        st = self.status(label)
        pods = self.pods()
        drivers = [p for p in pods if (p.metadata.labels or {}).get("spark-role") != "executor"]
        execs = [p for p in pods if (p.metadata.labels or {}).get("spark-role") == "executor"]

        def started(p) -> float | None:
            cs = (p.status.container_statuses or [None])[0]
            run = cs and cs.state and cs.state.running
            return run.started_at.timestamp() if run and run.started_at else None

        tl = {"apply": 0.0}
        if drivers:
            d = sorted(drivers, key=lambda p: p.metadata.creation_timestamp)[0]
            tl["driver_pod_created"] = d.metadata.creation_timestamp.timestamp() - t_apply
            s = started(d)
            if s:
                tl["driver_pod_running"] = s - t_apply
        if execs:
            tl["executor_pods_created"] = min(p.metadata.creation_timestamp.timestamp() for p in execs) - t_apply
            ss = [started(p) for p in execs]
            if all(ss):
                tl["executor_pods_running_all"] = max(ss) - t_apply
        dlog = driver_log(self.kubelet.log_path(self.ns, st.get("driverPod") or f"{label}-driver-0"))
        for k in ("session_ready", "executors_registered", "query_started"):
            if k in dlog:
                tl[k] = dlog[k] - t_apply
        tl["first_batch_started"] = t_first - t_apply
        tl["last_batch_committed"] = t_last - t_apply
        total, processing = t_last - t_apply, t_last - t_first
        cpu = CpuMeter.delta(c0, c1)
        res.update({
            "timeline_s": {k: round(v, 2) for k, v in tl.items()},
            "end_to_end_s": round(total, 2), "startup_s": round(t_first - t_apply, 2),
            "processing_s": round(processing, 2),
            "records_per_s_end_to_end": round(n / total), "records_per_s_processing": round(n / processing),
            "batches": done_batch + 1, "batch_ms": dlog["batch_ms"],
            "batch_ms_median": statistics.median(dlog["batch_ms"]) if dlog["batch_ms"] else None,
            "driver_pod": st.get("driverPod"), "first_driver_pod": driver_first,
            "pods": sorted(p.metadata.name for p in pods), "executor_pods": len(execs),
            "cpu_s": cpu, "cpu_us_per_record": {k: round(v / n * 1e6, 2) for k, v in cpu.items()},
        })
        if driver_first and st.get("driverPod") != driver_first:
            raise AssertionError(f"{label}: the driver was restarted ({driver_first} -> {st.get('driverPod')})")
        if mode == "cluster" and len(execs) != a.executors:
            say(f"  note: {len(execs)} executor Pods (asked for {a.executors}): Spark replaced some")
        # The stream goes (driver stopped, executors collected with it) before the output is read.
        self.kubectl.run("delete", "exactlyoncestream", label, "-n", self.ns, "--timeout=180s", timeout=240)
        wait_until(lambda: not self.pods(), f"the Pods of {label} to go", 180, self.diag, 1)
        res["audit"] = au = audit(self.bootstrap, out, n)
        if au["first_record_ts"]:
            res["timeline_s"]["first_output_record"] = round(au["first_record_ts"] - t_apply, 2)
            res["timeline_s"]["last_output_record"] = round(au["last_record_ts"] - t_apply, 2)
        if au["records"] != n or au["distinct"] != n or au["unexpected"]:
            raise AssertionError(f"{label}: not exactly once: {au} for {n} input records")
        shutil.rmtree(ckpt, ignore_errors=True)
        return res


def spread(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "all": [round(v, 3) for v in values]}


def summarize(runs: list[dict], n: int) -> dict:
    by = {m: [r for r in runs if r["mode"] == m and not r.get("warmup")] for m in MODES}
    out: dict = {}
    for key in ("end_to_end_s", "processing_s", "startup_s"):
        out[key] = {m: spread([r[key] for r in by[m]]) for m in MODES}
        med = {m: statistics.median(r[key] for r in by[m]) for m in MODES}
        pairs = [c[key] / lo[key] for lo, c in zip(by["local"], by["cluster"])]
        out[key]["ratio_of_medians"] = round(med["cluster"] / med["local"], 2)
        out[key]["pair_ratios"] = spread(pairs)
    # Batch 0 pays the first Python workers, Kafka consumers and connections of each JVM; the later ones run warm.
    for key, pick in (("batch0_s", lambda r: r["batch_ms"][0] / 1000),
                      ("later_batches_s", lambda r: sum(r["batch_ms"][1:]) / 1000)):
        vals = {m: [pick(r) for r in by[m] if r.get("batch_ms")] for m in MODES}
        if all(vals.values()) and all(min(v) > 0 for v in vals.values()):
            out[key] = {m: spread(vals[m]) for m in MODES}
            med = {m: statistics.median(vals[m]) for m in MODES}
            out[key]["ratio_of_medians"] = round(med["cluster"] / med["local"], 2)
            out[key]["pair_ratios"] = spread([c / lo for lo, c in zip(vals["local"], vals["cluster"])])
    out["records_per_s"] = {f"{m}_{k}": round(n / statistics.median(r[f"{k}_s"] for r in by[m]))
                            for m in MODES for k in ("end_to_end", "processing")}
    cpu: dict = {}
    for m in MODES:
        keys = by[m][0]["cpu_us_per_record"].keys()
        cpu[m] = {k: round(statistics.median(r["cpu_us_per_record"][k] for r in by[m]), 2) for k in keys}
    out["cpu_us_per_record_median"] = cpu
    out["cpu_ratio_spark"] = round(cpu["cluster"]["spark"] / cpu["local"]["spark"], 2)
    return out


def machine_info() -> dict:
    import confluent_kafka
    import pyspark
    mem_kb, cpu = 0, "unknown"
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kb = int(line.split()[1])
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    try:
        from eos_stack import kafka as stack_kafka
        kafka_version = stack_kafka.VERSION
    except Exception:  # noqa: BLE001
        kafka_version = "unknown"
    return {"cores": os.cpu_count(), "cpu": cpu, "ram_gb": round(mem_kb / 1024 / 1024, 1),
            "os": platform.platform(), "python": platform.python_version(), "pyspark": pyspark.__version__,
            "kafka_broker": kafka_version, "librdkafka": confluent_kafka.libversion()[0]}


def fmt_spread(s: dict, unit: str = "") -> str:
    return f"{s['median']:.1f}{unit} ({s['min']:.1f}–{s['max']:.1f})"


def markdown(res: dict) -> str:
    m, s, sm = res["machine"], res["settings"], res["summary"]
    lines = [
        f"# Executors benchmark {res['date']}: local mode against {s['executors']} executor Pods", "",
        "The exactly-once sink job of the sink benchmark (`benchmarks/passthrough.py`, the `BatchWriter` sink) "
        "run as an ExactlyOnceStream through the operator and the process kubelet on the local stack, in Spark "
        f"local mode in one driver Pod (`deployMode: local`, `local[*,4]`) and with `deployMode: cluster` and "
        f"{s['executors']} executor Pods. Same input, same spec but for the deploy mode; each run a fresh "
        "stream, checkpoint and output topic; modes alternate. Produced by `benchmarks/executors.py`.", "",
        f"Machine: **{m['cores']} cores** ({m['cpu']}), {m['ram_gb']} GB RAM, shared (load average "
        f"{res['load_avg_start'][0]:.1f} at start, {res['load_avg_end'][0]:.1f} at end); Python {m['python']}, "
        f"PySpark {m['pyspark']}, Kafka broker {m['kafka_broker']} (single node, same machine), librdkafka "
        f"{m['librdkafka']}. With {m['cores']} cores, {s['executors']} executor JVMs and a driver JVM cannot "
        "be faster than one local-mode JVM using both cores: the ratio measures the overhead of executor Pods "
        "and of the shuffle between JVMs, not a speed-up.", "",
        f"Settings: {s['records']:,} records of ~{s['record_bytes']} bytes in a {s['input_partitions']}-partition "
        f"topic, parallelism {s['parallelism']} (output partitions / slots), maxOffsetsPerTrigger "
        f"{s['max_offsets_per_trigger']:,}, triggerIntervalMs {s['trigger_ms']} (batches back to back), "
        f"checkpoint `store: local`; cluster mode: {s['executors']} executors of 1 core and "
        f"{s['executor_memory']} each (driver: Spark's default 1g; local mode: `spark.driver.memory=1g`); "
        f"{s['repeats']} repeats, alternating order, median (min–max).", "",
        "What the times include. **End-to-end**: `kubectl apply` of the stream until the commit-log entry of "
        "the batch that reached the input's end (the slot transactions commit before it, so all N records are "
        "then visible read_committed): the operator's resolution, the driver Pod's start, JVM and SparkSession, "
        "in cluster mode the executor Pods' start and registration, and every batch. **Processing**: the offset-"
        "log entry of batch 0 to that commit-log entry, the batches alone. **Startup**: apply to batch 0.", "",
        "| measure | local mode | cluster, executors | cluster / local |", "| --- | ---: | ---: | ---: |"]
    for key, label in (("end_to_end_s", "end-to-end, s"), ("processing_s", "processing, s"),
                       ("startup_s", "startup (apply to first batch), s"),
                       ("batch0_s", "… of which batch 0's foreachBatch (the sink; the runtime's log), s"),
                       ("later_batches_s", "… of which the later batches' foreachBatch, summed, s")):
        if key not in sm:
            continue
        d = sm[key]
        lines.append(f"| {label} | {fmt_spread(d['local'])} | {fmt_spread(d['cluster'])} | "
                     f"**{d['ratio_of_medians']:.2f}** (pairs {d['pair_ratios']['min']:.2f}–"
                     f"{d['pair_ratios']['max']:.2f}) |")
    rps = sm["records_per_s"]
    for k, label in (("processing", "records/s, processing"), ("end_to_end", "records/s, end-to-end")):
        lines.append(f"| {label} (median) | {rps[f'local_{k}']:,} | {rps[f'cluster_{k}']:,} | "
                     f"{rps[f'cluster_{k}'] / rps[f'local_{k}']:.2f} |")
    cl, cc = sm["cpu_us_per_record_median"]["local"], sm["cpu_us_per_record_median"]["cluster"]
    for k, label in (("spark", "CPU µs/record, Spark (driver + executor Pods)"), ("driver", "… of which driver Pod"),
                     ("executors", "… of which executor Pods"), ("operator", "CPU µs/record, operator"),
                     ("kube", "CPU µs/record, API server + etcd + controller-manager"),
                     ("broker", "CPU µs/record, Kafka broker"), ("bench", "CPU µs/record, this process (kubelet)"),
                     ("other", "CPU µs/record, rest of the machine (noise)")):
        ratio = f"{cc[k] / cl[k]:.2f}" if k in ("spark", "broker") and cl[k] else ""
        lines.append(f"| {label} | {cl[k]} | {cc[k]} | {ratio} |")
    steps = (("driver_pod_running", "driver Pod running (API timestamp: whole seconds, truncated)"),
             ("executor_pods_created", "executor Pods created (whole seconds)"),
             ("executor_pods_running_all", "executor Pods running, all (whole seconds)"),
             ("executors_registered", "first executor registered (the query waits for one)"),
             ("session_ready", "driver epoch claimed: SparkSession up (cluster mode: after an executor registered)"),
             ("query_started", "query started"), ("first_batch_started", "batch 0 started (offset log)"),
             ("first_output_record", "first output record (its timestamp)"),
             ("last_output_record", "last output record (its timestamp)"),
             ("last_batch_committed", "last batch committed (commit log): end"))
    med = {}
    for mode in ("local", "cluster"):
        rs = sorted((r for r in res["runs"] if r["mode"] == mode and not r.get("warmup")),
                    key=lambda r: r["end_to_end_s"])
        med[mode] = rs[len(rs) // 2] if rs else {"timeline_s": {}}
    lines += ["", "Where the end-to-end time goes, seconds after the apply, in the median run of each mode "
              f"({med['local'].get('label')}, {med['cluster'].get('label')}):", "",
              "| step | local mode | cluster |", "| --- | ---: | ---: |"]
    for k, label in steps:
        vals = [med[m]["timeline_s"].get(k) for m in ("local", "cluster")]
        if any(v is not None for v in vals):
            lines.append(f"| {label} | " + " | ".join("-" if v is None else f"{v:.1f}" for v in vals) + " |")
    lines.append("| median foreachBatch duration of a batch, ms (the runtime's log) | "
                 + " | ".join(str(med[m].get("batch_ms_median", "-")) for m in ("local", "cluster")) + " |")
    lines += ["", "Every run, in order (times in s from the apply; load average 1 min before → after, of which "
              "the benchmark's own JVMs make 2 to 5 on these cores; `other` = CPU seconds of the rest of the machine "
              "during the run and `foreign` = other java/pytest processes before / after it: the disturbance "
              "by other work):", "",
              "| run | mode | end-to-end | startup | processing | batches | median foreachBatch ms | driver running "
              "| executors running | CPU s Spark | other CPU s | load | foreign java/pytest | exactly once |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- |"]
    for r in res["runs"]:
        tl, au = r["timeline_s"], r["audit"]
        name = r["label"] + (" (warm-up)" if r.get("warmup") else "")
        drv = f"{tl['driver_pod_running']:.1f}" if "driver_pod_running" in tl else "-"
        exe = f"{tl['executor_pods_running_all']:.1f}" if "executor_pods_running_all" in tl else "-"
        ok = "yes" if not (au["duplicates"] or au["missing"] or au["unexpected"]) else "NO"
        lines.append(f"| {name} | {r['mode']} | {r['end_to_end_s']:.1f} | {r['startup_s']:.1f} | "
                     f"{r['processing_s']:.1f} | {r['batches']} | {r.get('batch_ms_median') or '-'} | {drv} | {exe} | "
                     f"{r['cpu_s']['spark']:.0f} | {r['cpu_s']['other']:.0f} | "
                     f"{r['load_before'][0]:.1f} → {r['load_after'][0]:.1f} | "
                     f"{len(r['foreign_before'])} / {len(r['foreign_after'])} | "
                     f"{ok} ({au['records']:,} records, {au['distinct']:,} keys) |")
    if res.get("findings"):
        lines += ["", "## Findings", "", res["findings"].strip()]
    lines += ["", "## Raw results", "", "```json", json.dumps(res, indent=1, sort_keys=True, default=str), "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000, help="input records (produced once)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per mode (alternating order)")
    ap.add_argument("--warmup-records", type=int, default=100_000,
                    help="first run each mode once on this many records, not counted (0: none)")
    ap.add_argument("--executors", type=int, default=2, help="executor Pods in cluster mode")
    ap.add_argument("--executor-memory", default="1Gi", help="memory of each executor Pod")
    ap.add_argument("--parallelism", type=int, default=2, help="slots = output partitions")
    ap.add_argument("--max-offsets", type=int, default=100_000, help="maxOffsetsPerTrigger")
    ap.add_argument("--trigger-ms", type=int, default=100, help="triggerIntervalMs (100: the smallest)")
    ap.add_argument("--run-timeout", type=float, default=600, help="seconds a run may take")
    ap.add_argument("--out", help="results file (default benchmarks/results/<date>-executors.md)")
    ap.add_argument("--findings", help="a markdown file whose text goes in the results' Findings section")
    ap.add_argument("--render", metavar="RESULTS_MD",
                    help="only re-render a results file from its raw JSON (e.g. to add --findings), then exit")
    a = ap.parse_args(argv)
    if a.render:
        path = Path(a.render)
        res = json.loads(path.read_text().split("```json", 1)[1].split("```", 1)[0])
        res["summary"] = summarize(res["runs"], res["settings"]["records"])
        if a.findings:
            res["findings"] = Path(a.findings).read_text()
        path.write_text(markdown(res))
        print(f"re-rendered {path}")
        return 0

    stack = Stack()
    env = stack.read_env()
    if not env.get("KUBECONFIG") or not env.get("KAFKA_BOOTSTRAP"):
        print("the local stack is not up: run `make stack-up` first", file=sys.stderr)
        return 2
    os.environ.update(env)
    date = dt.date.today().isoformat()
    out_path = Path(a.out) if a.out else REPO / "benchmarks" / "results" / f"{date}-executors.md"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    from tests.e2e.test_cluster_mode_e2e import job_rbac
    from tests.harness.kubelet import ProcessKubelet

    kubectl = Kubectl(env)
    kubectl.apply_crds()
    namespace = f"bench-exec-{uuid.uuid4().hex[:6]}"
    # Under the stack's state folder: the process kubelet keeps it writable for Pods (their root is read-only).
    work = stack.state / namespace
    work.mkdir(parents=True)
    n = a.records
    res: dict = {"date": date, "namespace": namespace, "machine": machine_info(),
                 "load_avg_start": list(os.getloadavg()),
                 "settings": {"records": n, "repeats": a.repeats, "warmup_records": a.warmup_records,
                              "executors": a.executors, "executor_memory": a.executor_memory,
                              "parallelism": a.parallelism, "input_partitions": 4,
                              "max_offsets_per_trigger": a.max_offsets, "trigger_ms": a.trigger_ms,
                              "record_bytes": KEY_BYTES + VALUE_BYTES, "checkpoint_store": "local"}}
    runs: list[dict] = []
    bench: Bench | None = None
    say(f"executors benchmark in namespace {namespace}, work dir {work}")
    kubectl.run("create", "namespace", namespace)
    try:
        kubectl.run("label", "namespace", namespace, *RESTRICTED)
        job_rbac(env, kubectl, namespace)
        bench = Bench(a, env, kubectl, namespace, work)
        with ProcessKubelet(env["KUBECONFIG"], namespace=namespace, log_dir=work / "kubelet",
                            extra_env={"PYTHONPATH": cluster.PYTHONPATH}) as kubelet:
            bench.kubelet = kubelet
            bench.operator = cluster.OperatorProcess(env["KUBECONFIG"], namespace, work / "operator.log").start()
            try:
                in_topic = f"bench-exec-in-{bench.run_id}"
                bench.topics.create({in_topic: 4})
                say(f"producing {n:,} records of ~{KEY_BYTES + VALUE_BYTES} bytes into {in_topic} (4 partitions)")
                res["produce_s"] = round(produce_records(bench.bootstrap, in_topic, n), 1)
                ends = input_ends(bench.bootstrap, in_topic)
                if a.warmup_records:
                    warm_topic = f"bench-exec-warm-{bench.run_id}"
                    bench.topics.create({warm_topic: 4})
                    produce_records(bench.bootstrap, warm_topic, a.warmup_records)
                    warm_ends = input_ends(bench.bootstrap, warm_topic)
                    for mode in MODES:
                        say(f"warm-up: {mode} on {a.warmup_records:,} records")
                        r = bench.run(mode, f"warm-{mode}", warm_topic, a.warmup_records, warm_ends)
                        r["warmup"] = True
                        runs.append(r)
                        say(f"  {mode}: end-to-end {r['end_to_end_s']:.1f}s, processing {r['processing_s']:.1f}s")
                for rep in range(1, a.repeats + 1):
                    for mode in (MODES if rep % 2 else MODES[::-1]):
                        label = f"{mode}-{rep}"
                        say(f"repeat {rep}/{a.repeats}: {mode}, {n:,} records (load {os.getloadavg()[0]:.1f})")
                        r = bench.run(mode, label, in_topic, n, ends)
                        r["repeat"] = rep
                        runs.append(r)
                        cu = r["cpu_us_per_record"]
                        say(f"  {mode}: end-to-end {r['end_to_end_s']:.1f}s (startup {r['startup_s']:.1f}s, processing "
                            f"{r['processing_s']:.1f}s = {r['records_per_s_processing']:,} rec/s, {r['batches']} "
                            f"batches); CPU µs/record driver {cu['driver']} executors {cu['executors']} operator "
                            f"{cu['operator']} broker {cu['broker']} other {cu['other']}; timeline {r['timeline_s']}; "
                            f"load {r['load_before'][0]:.1f} -> {r['load_after'][0]:.1f}, foreign processes "
                            f"{len(r['foreign_before'])} -> {len(r['foreign_after'])}; output exactly once "
                            f"({r['audit']['records']:,} records, {r['audit']['distinct']:,} keys)")
                res["runs"] = runs
                res["summary"] = summarize(runs, n)
                res["load_avg_end"] = list(os.getloadavg())
                if a.findings:
                    res["findings"] = Path(a.findings).read_text()
                text = markdown(res)
                out_path.write_text(text)
                say(f"results written to {out_path}")
                print("\n" + text.split("## Raw results")[0])
            finally:
                # While the kubelet still runs: the operator stops the drivers, their executors go with them.
                kubectl.run("delete", "exactlyoncestream", "--all", "-n", namespace, "--timeout=120s",
                            check=False, timeout=180)
                bench.operator.stop()
    finally:
        if runs and "summary" not in res:
            (work / "partial.json").write_text(json.dumps(runs, indent=1, default=str))
            say(f"partial results in {work / 'partial.json'}")
        for s in kubectl.json("get", "exactlyoncestreams", "-n", namespace)["items"]:
            kubectl.run("patch", "exactlyoncestream", s["metadata"]["name"], "-n", namespace, "--type=merge",
                        "-p", '{"metadata":{"finalizers":null}}', check=False)
        kubectl.run("delete", "namespace", namespace, "--wait=false", check=False)
        if bench is not None:
            say("deleting the benchmark's topics")
            bench.topics.delete_all()
        for d in work.iterdir():
            if d.is_dir() and d.name != "kubelet":
                shutil.rmtree(d, ignore_errors=True)
        say(f"logs (operator, driver and executor Pods) kept in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
