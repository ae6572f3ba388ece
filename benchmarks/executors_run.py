"""One run of the executors benchmark: an ExactlyOnceStream through the operator, timed and checked.

``Bench.run`` applies the stream (``deployMode`` local or cluster) to the
benchmark's namespace, waits for the checkpoint's commit log to reach the
input's end, reads the times from the checkpoint, the Pods and the driver's
log, deletes the stream and reads its output back exactly once. ``CpuMeter``
counts CPU seconds by component meanwhile: driver Pod, executor Pods, the
operator, this process, the broker, the API server. ``executors.py`` (the
entry point, its docstring says what is measured) makes the namespace,
the kubelet and the operator, and ``executors_report.py`` renders the runs.
"""
from __future__ import annotations

import os
import re
import shutil
import statistics
import time
from pathlib import Path

from benchmarks import procstat
from benchmarks.kafka_io import Topics, audit
from benchmarks.report import say
from eos_job import checkpoint
from eos_stack import cluster
from eos_stack.cluster import Kubectl, wait_until
from eos_stack.common import Stack

SA = "spark-eos-driver"          # the job ServiceAccount the chart's job RBAC creates
GROUP = "streaming.eos.dev"
VERSION = "v1beta1"


# ------------------------------------------------------------------ CPU by component
class CpuMeter(procstat.CpuMeter):
    """CPU seconds by component, from /proc, sampled every ``interval`` seconds by a thread.

    Components: the Pods the process kubelet runs (its children whose environment names a Pod: ``HOSTNAME`` and
    ``EOS_TERMINATION_MESSAGE_PATH``), split into ``driver`` and ``executors`` by Pod name, with all their
    descendants (JVMs, Python workers); ``operator`` (its pid); ``bench`` (this process and its other children);
    ``broker`` and ``kube`` (the stack's daemons, by pid file); ``machine`` (busy time of all CPUs). A process's
    increments are summed between samples, so processes that come and go are counted, less their last interval.
    """
    GROUPS = ("driver", "executors", "pods_other", "operator", "bench", "broker", "kube")
    DAEMONS = (("kafka", "broker"), ("kube-apiserver", "kube"), ("kube-etcd", "kube"),
               ("kube-controller-manager", "kube"))

    def __init__(self, operator_pid, interval: float = 0.5):
        self.operator_pid = operator_pid          # a function: the operator may not run yet
        self.stack = Stack()
        self.pod_of: dict[tuple[int, int], str] = {}
        super().__init__(interval)

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

    def _component(self, pid: int, start: int) -> str:
        if pid == self.operator_pid():
            return "operator"
        key = (pid, start)
        if key not in self.pod_of:
            self.pod_of[key] = self.pod_name(pid) or ""
        pod = self.pod_of[key]
        if not pod:
            return "bench"
        return "executors" if "-exec-" in pod else "driver" if "-driver-" in pod else "pods_other"

    def classify(self, ps: dict[int, tuple], kids: dict[int, list[int]]) -> dict[int, str]:
        me = os.getpid()
        groups: dict[int, str] = {me: "bench"}
        for child in kids.get(me, []):
            g = self._component(child, ps[child][3])
            for p in procstat.tree(kids, child):
                groups[p] = g
        for name, g in self.DAEMONS:
            pid = self.stack.running_pid(name)
            if pid in ps:
                for p in procstat.tree(kids, pid):
                    groups[p] = g
        return groups

    def forget(self, key: tuple[int, int]) -> None:
        self.pod_of.pop(key, None)

    @staticmethod
    def delta(a: dict, b: dict) -> dict[str, float]:
        d = procstat.CpuMeter.difference(a, b)
        d["spark"] = round(d["driver"] + d["executors"] + d["pods_other"], 2)
        ours = d["spark"] + d["operator"] + d["bench"] + d["broker"] + d["kube"]
        d["other"] = round(d.pop("machine") - ours, 2)
        return d


def foreign_processes(mine: set[int]) -> list[str]:
    """java and pytest processes that are neither ``mine`` nor the stack's broker: other work on the machine."""
    return procstat.foreign_processes(mine | {Stack().running_pid("kafka")})


# ------------------------------------------------------------------ a run
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
        mine = procstat.my_tree()
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
        res["foreign_after"] = foreign_processes(procstat.my_tree())
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
        res["audit"] = au = audit(self.bootstrap, out, n, timestamps=True)
        if au["first_record_ts"]:
            res["timeline_s"]["first_output_record"] = round(au["first_record_ts"] - t_apply, 2)
            res["timeline_s"]["last_output_record"] = round(au["last_record_ts"] - t_apply, 2)
        if au["records"] != n or au["distinct"] != n or au["unexpected"]:
            raise AssertionError(f"{label}: not exactly once: {au} for {n} input records")
        shutil.rmtree(ckpt, ignore_errors=True)
        return res

