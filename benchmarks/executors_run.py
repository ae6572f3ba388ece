"""One run of the executors benchmark: an ExactlyOnceStream through the operator, timed and checked.

``Bench.place`` prepares the benchmark's namespace for Pods on the real nodes (``tests/e2e/test_cluster_mode_e2e.py``
shows the same for the cluster-mode e2e): one node for every Pod, the API server as a Pod there reaches it, the
checkpoint bucket's keys, the job module. ``Bench.run`` applies the stream (``deployMode`` local or cluster), waits
for the checkpoint's commit log in the bucket to reach the input's end, reads the times from the checkpoint, the
Pods and the driver's log, deletes the stream and reads its output back exactly once. ``CpuMeter`` counts CPU
seconds by component meanwhile: driver Pod, executor Pods, the operator, this process, the broker, the API server,
the real nodes' own processes, the services forwarder, MinIO. ``executors.py`` (the entry point, its docstring
says what is measured) makes the namespace, follows the Pods' logs and starts the operator, and
``executors_report.py`` renders the runs.
"""
from __future__ import annotations

import os
import re
import statistics
import time
from pathlib import Path, PurePosixPath
from urllib.parse import urlparse

from pyarrow import fs as pafs

from benchmarks import procstat
from benchmarks.kafka_io import Topics, audit
from benchmarks.report import say
from eos_job import checkpoint
from eos_job.storage import Loc, S3Options
from eos_stack import cluster, node, node_dns, node_services
from eos_stack.cluster import Kubectl, wait_until
from eos_stack.common import Stack
from eos_stack.node_config import layouts

SA = "spark-eos-driver"          # the job ServiceAccount the chart's job RBAC creates
GROUP = "streaming.eos.dev"
VERSION = "v1beta1"
KEYS_SECRET = "ckpt-keys"        # the checkpoint bucket's keys, for the operator and the Pods
JOBS_CONFIGMAP = "bench-jobs"    # the job module (benchmarks/passthrough.py): the image has no benchmarks/
JOBS_MOUNT = "/app/benchmarks"   # on the image's PYTHONPATH (/app): ``benchmarks.passthrough`` imports there
REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ CPU by component
class CpuMeter(procstat.CpuMeter):
    """CPU seconds by component, from /proc, sampled every ``interval`` seconds by a thread.

    Components: the benchmark namespace's Pods, found by their cgroup (``procstat.pod_uid``: the real nodes'
    containers are not this process's children), split into ``driver`` and ``executors`` by Pod name (the
    uid's name read through the API: ``pod_names``); ``operator`` (its pid and children); ``bench`` (this process
    and its other children); the stack's daemons by pid file: ``broker``, ``kube`` (API server, etcd,
    controller-manager), ``nodes`` (the real nodes' kubelets, containerd and its shims, kube-scheduler, CoreDNS),
    ``forwarder`` (the services address's relay, which carries the Pods' Kafka and S3 traffic) and ``s3`` (MinIO,
    the checkpoint's store); ``machine`` (busy time of all CPUs). A process's increments are summed between
    samples, so processes that come and go are counted, less their last interval. Other namespaces' Pods (other
    work on the shared stack) are not counted: they are part of ``other``.
    """
    GROUPS = ("driver", "executors", "pods_other", "operator", "bench", "broker", "kube", "nodes", "forwarder", "s3")
    DAEMONS = (("kafka", "broker"), ("kube-apiserver", "kube"), ("kube-etcd", "kube"),
               ("kube-controller-manager", "kube"), (node.SCHEDULER, "nodes"), (node_dns.DAEMON, "nodes"),
               (node_services.FORWARDER, "forwarder"), ("s3", "s3"))

    def __init__(self, operator_pid, pod_names, interval: float = 0.5):
        self.operator_pid = operator_pid          # a function: the operator may not run yet
        self.pod_names = pod_names                # a function: {Pod uid: name} of the benchmark's namespace
        self.stack = Stack()
        self.daemons = self.DAEMONS + tuple((f"{n.name}-{d}", "nodes") for n in layouts(self.stack.state, node.count())
                                            for d in ("kubelet", "containerd"))
        self.kind_of: dict[tuple[int, int], str] = {}   # (pid, start) -> a Pod uid, "shim" or "" (neither)
        self.names: dict[str, str] = {}
        self.names_read = 0.0
        self.counted: set[int] = set()            # the pids of the last sample's groups
        super().__init__(interval)

    def _kind(self, pid: int, start: int) -> str:
        key = (pid, start)
        if key not in self.kind_of:
            uid = procstat.pod_uid(pid)
            if uid is None and self._our_shim(pid):
                uid = "shim"
            self.kind_of[key] = uid or ""
        return self.kind_of[key]

    def _our_shim(self, pid: int) -> bool:
        """A containerd shim of this stack's nodes (it names their containerd's socket, under the state folder)."""
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False
        return b"containerd-shim" in cmd.split(b"\0", 1)[0] and str(self.stack.state / "node").encode() in cmd

    def _pod_name(self, uid: str) -> str | None:
        if uid not in self.names and time.monotonic() - self.names_read > 2:   # a new Pod: read the names again
            self.names_read = time.monotonic()
            try:
                self.names = self.pod_names()
            except Exception:  # noqa: BLE001 - the next sample asks again
                pass
        return self.names.get(uid)

    def classify(self, ps: dict[int, tuple], kids: dict[int, list[int]]) -> dict[int, str]:
        groups: dict[int, str] = {}
        for name, g in self.daemons:
            pid = self.stack.running_pid(name)
            if pid in ps:
                for p in procstat.tree(kids, pid):
                    groups[p] = g
        me = os.getpid()
        for p in procstat.tree(kids, me):
            groups[p] = "bench"
        op = self.operator_pid()
        if op in ps:
            for p in procstat.tree(kids, op):
                groups[p] = "operator"
        for pid, (*_rest, start) in ps.items():
            kind = self._kind(pid, start)
            if kind == "shim":
                groups[pid] = "nodes"
            elif kind:
                pod = self._pod_name(kind)
                if pod is not None:
                    groups[pid] = "executors" if "-exec-" in pod else "driver" if "-driver-" in pod else "pods_other"
        self.counted = set(groups)
        return groups

    def forget(self, key: tuple[int, int]) -> None:
        self.kind_of.pop(key, None)

    @staticmethod
    def delta(a: dict, b: dict) -> dict[str, float]:
        d = procstat.CpuMeter.difference(a, b)
        d["spark"] = round(d["driver"] + d["executors"] + d["pods_other"], 2)
        ours = d["spark"] + sum(d[g] for g in ("operator", "bench", "broker", "kube", "nodes", "forwarder", "s3"))
        d["other"] = round(d.pop("machine") - ours, 2)
        return d


def foreign_processes(mine: set[int]) -> list[str]:
    """java and pytest processes that are neither ``mine`` nor the stack's broker: other work on the machine."""
    return procstat.foreign_processes(mine | {Stack().running_pid("kafka")})


def mtimes(folder: Loc) -> dict[str, float]:
    """The files of a checkpoint folder in the bucket and their times, from a listing (MinIO's to the millisecond;
    a single object's HEAD has whole seconds only)."""
    infos = folder.fs.get_file_info(pafs.FileSelector(folder.path, allow_not_found=True))
    return {PurePosixPath(i.path).name: i.mtime.timestamp() for i in infos if i.mtime is not None}


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
        self.kubelet = None            # tests/harness/node_pods.py's NodePods: the Pods' logs, followed
        # The checkpoints in the stack's bucket, read from this machine with the server's keys.
        self.s3 = S3Options(endpoint=env["S3_ENDPOINT"], path_style=True, access_key=env["S3_ACCESS_KEY"],
                            secret_key=env["S3_SECRET_KEY"])
        self.pod_env = node_services.pod_env(Stack())    # where Pods reach Kafka and MinIO: the services address
        self.node: str | None = None
        self.templates: tuple[dict, dict] = ({}, {})
        self.cpu = CpuMeter(lambda: self.operator.proc.pid if self.operator and self.operator.proc else None,
                            self.pod_names)

    def pod_names(self) -> dict[str, str]:
        return {p.metadata.uid: p.metadata.name for p in self.pods()}

    def place(self, nodes: list[str]) -> str:
        """The namespace made ready for the runs' Pods on one real node (the one whose Pods ask for the least CPU;
        a driver and its executors must share one: Pods of two nodes do not reach each other here): the bucket's
        keys, the API server's CA and its headless Service (the driver's Spark creates the executor Pods), the job
        module as a ConfigMap. Returns the node's name."""
        from tests.e2e.test_cluster_mode_e2e import api_server_service, pod_templates, roomiest
        from tests.harness.real_nodes import keys_secret, root_ca_config_map
        self.kubectl.apply(keys_secret(self.env, KEYS_SECRET), self.ns)
        self.kubectl.apply(root_ca_config_map(Stack()), self.ns)
        api_port = urlparse(self.pod_env["POD_KUBE_APISERVER"]).port
        for doc in api_server_service(self.pod_env["EOS_SERVICES_IP"], api_port):
            self.kubectl.apply(doc, self.ns)
        self.kubectl.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": JOBS_CONFIGMAP},
                            "data": {"passthrough.py": (REPO / "benchmarks" / "passthrough.py").read_text()}}, self.ns)
        self.node = roomiest(self.kubectl, nodes)
        jobs = {"volumes": [{"name": "bench-jobs", "configMap": {"name": JOBS_CONFIGMAP}}],
                "volumeMounts": [{"name": "bench-jobs", "mountPath": JOBS_MOUNT, "readOnly": True}]}
        self.templates = pod_templates(self.node, api_port, jobs)
        return self.node

    def diag(self) -> str:
        from tests.e2e.streams import Diagnostics
        return Diagnostics(self.kubectl, self.ns, self.operator, self.kubelet)()

    def checkpoint_path(self, label: str) -> str:
        return f"/bench/{self.ns}/{label}"

    def manifest(self, name: str, mode: str, in_topic: str, out_topic: str) -> dict:
        """The stream, its Pods on ``self.node``: both modes' Pods together ask for the same CPU (the node's 2 by
        default: a local-mode driver of ``--driver-cpu``; a cluster-mode driver and its executors)."""
        from tests.harness.real_nodes import node_image
        a = self.args
        driver_template, executor_template = self.templates
        job = {"module": "benchmarks.passthrough", "parallelism": a.parallelism, "serviceAccountName": SA,
               "image": node_image(), "podTemplate": driver_template,
               "driver": {"cpu": a.driver_cpu if mode == "local" else a.cluster_driver_cpu,
                          "memory": a.driver_memory}}
        if mode == "cluster":
            job.update({"deployMode": "cluster",
                        "executor": {"instances": a.executors, "cpu": a.executor_cpu, "memory": a.executor_memory,
                                     "startTimeoutSeconds": 180, "podTemplate": executor_template}})
        bootstrap = self.pod_env["POD_KAFKA_BOOTSTRAP"]
        return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ExactlyOnceStream", "metadata": {"name": name},
                "spec": {"job": job,
                         "source": {"bootstrapServers": bootstrap, "topics": [in_topic],
                                    "maxOffsetsPerTrigger": a.max_offsets},
                         "sink": {"bootstrapServers": bootstrap, "topic": out_topic},
                         "checkpoint": {"store": "s3", "path": self.checkpoint_path(name), "s3": {
                             "bucket": self.env["S3_BUCKET"], "endpoint": self.pod_env["POD_S3_ENDPOINT"],
                             "pathStyleAccess": True, "accessKeyId": {"name": KEYS_SECRET, "key": "id"},
                             "secretAccessKey": {"name": KEYS_SECRET, "key": "secret"}}},
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
        ckpt = Loc.of(f"s3a://{self.env['S3_BUCKET']}{self.checkpoint_path(label)}", self.s3)
        live = ckpt / "live"
        doc = self.manifest(label, mode, in_topic, out)
        res: dict = {"mode": mode, "label": label, "output_topic": out, "load_before": list(os.getloadavg()),
                     "foreign_before": foreign_processes(procstat.my_tree() | self.cpu.counted)}
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
            # The commit log in the bucket (one listing a poll; [] before the first commit).
            for b in checkpoint.committed_batches(live):
                if b in seen_commits:
                    continue
                seen_commits.add(b)
                if checkpoint.kafka_offsets(live, b).get(in_topic) == ends:
                    done_batch = b
            time.sleep(0.5)
        t_last = mtimes(live / "commits")[str(done_batch)]
        t_first = mtimes(live / "offsets")["0"]
        c1 = self.cpu.snapshot()
        res["load_after"] = list(os.getloadavg())
        res["foreign_after"] = foreign_processes(procstat.my_tree() | self.cpu.counted)
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
        tl["first_batch_started"] = t_first - t_apply
        tl["last_batch_committed"] = t_last - t_apply
        total, processing = t_last - t_apply, t_last - t_first
        cpu = CpuMeter.delta(c0, c1)
        if driver_first and st.get("driverPod") != driver_first:
            raise AssertionError(f"{label}: the driver was restarted ({driver_first} -> {st.get('driverPod')})")
        if mode == "cluster" and len(execs) != a.executors:
            say(f"  note: {len(execs)} executor Pods (asked for {a.executors}): Spark replaced some")
        # The stream goes (driver stopped, executors collected with it) before the output is read; the driver's
        # log is then whole (followed from the node: NodePods).
        self.kubectl.run("delete", "exactlyoncestream", label, "-n", self.ns, "--timeout=180s", timeout=240)
        wait_until(lambda: not self.pods(), f"the Pods of {label} to go", 180, self.diag, 1)
        driver_pod = st.get("driverPod") or f"{label}-driver-0"
        self.kubelet.wait_log(self.ns, driver_pod)
        dlog = driver_log(self.kubelet.log_path(self.ns, driver_pod))
        for k in ("session_ready", "executors_registered", "query_started"):
            if k in dlog:
                tl[k] = dlog[k] - t_apply
        res.update({
            "timeline_s": {k: round(v, 2) for k, v in tl.items()},
            "end_to_end_s": round(total, 2), "startup_s": round(t_first - t_apply, 2),
            "processing_s": round(processing, 2),
            "records_per_s_end_to_end": round(n / total), "records_per_s_processing": round(n / processing),
            "batches": done_batch + 1, "batch_ms": dlog["batch_ms"],
            "batch_ms_median": statistics.median(dlog["batch_ms"]) if dlog["batch_ms"] else None,
            "driver_pod": st.get("driverPod"), "first_driver_pod": driver_first, "node": self.node,
            "pods": sorted(p.metadata.name for p in pods), "executor_pods": len(execs),
            "cpu_s": cpu, "cpu_us_per_record": {k: round(v / n * 1e6, 2) for k, v in cpu.items()},
        })
        res["audit"] = au = audit(self.bootstrap, out, n, timestamps=True)
        if au["first_record_ts"]:
            res["timeline_s"]["first_output_record"] = round(au["first_record_ts"] - t_apply, 2)
            res["timeline_s"]["last_output_record"] = round(au["last_record_ts"] - t_apply, 2)
        if au["records"] != n or au["distinct"] != n or au["unexpected"]:
            raise AssertionError(f"{label}: not exactly once: {au} for {n} input records")
        ckpt.rmtree()
        return res
