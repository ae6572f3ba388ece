#!/usr/bin/env python3
"""Scale benchmark (issue 14): one operator and N streams, for N = 50, 200 and 500, one run each.

Everything is real but Spark and the node: the operator (``python -m eos_operator run``, the CLI's default
intervals, ``--leader-election`` with two replicas, ``--metrics-port``), the API server, Kafka and resolution.
The drivers: their Pods go to a fake Node of KWOK (``eos_stack.kwok``, built into the cache on first use), which
makes them ``Running`` and removes them when deleted through the real API server; simulator processes
(``tests/harness/kwok_drivers.py``, ``--streams-per-simulator`` each) play every Running driver in a thread: the
driver's own start, epoch stamp and exactly-once batches through the sink's write path (``driver_play``), one
batch every ``--batch-seconds``. (Until 2026-11-29 ``--nodes standin`` could run a stand-in process per driver on
the process kubelet instead, about 25 MiB each; both are retired.)

Per N, in a namespace of its own:

1. the node (KWOK and its simulators) and the two operator replicas start; a
   ``--baseline-seconds`` window with no stream measures the fixed API traffic (Lease renewals, watches);
2. N streams are created (each its own sink and ledger topic, one shared empty source topic); the time until
   all are ``Running`` with a committed batch is the start-up;
3. a ``--steady-seconds`` window: the API server's ``apiserver_request_total`` and, if the operator exports
   it, its own ``eos_operator_kube_requests_total``, the leader's CPU, peak RSS and Kafka connections
   (ESTABLISHED sockets to the broker, from /proc), and what playing the drivers costs (the simulators' memory);
4. first action: ``--sample`` streams spread over the N get ``spec.restartNonce`` bumped one at a time;
   from the patch to the operator's first observable action (a status write that observed the new
   generation, or the driver Pod's deletion), both seen through watches;
5. crash to restart: ``--crashes`` drivers are killed (the Pod's status written ``Failed`` with exit code 137
   through the API, as a node reports a SIGKILL, and its driver thread stopped);
   from the kill to the next driver Pod's creation (restart delay 0);
6. takeover: the leader is SIGKILLed and a stream's restartNonce bumped at once; from the kill to the
   standby holding the Lease, and to its first action on that stream.

Results: ``benchmarks/results/<date>-scale.md`` and ``<date>-scale.png`` (``scale_report.py``).
Run: ``make bench-scale`` or ``EOS_STATE=.stack PYTHONPATH=stack:.:jobs:operator .venv/bin/python
benchmarks/scale.py --streams 50``.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for _p in (REPO / "operator", REPO / "jobs", REPO, REPO / "stack"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from kubernetes import client, config  # noqa: E402

from benchmarks import report, scale_report  # noqa: E402
from benchmarks.kafka_io import Topics  # noqa: E402
from benchmarks.report import say  # noqa: E402
from benchmarks import procstat  # noqa: E402
from benchmarks import scale_watch  # noqa: E402
from benchmarks.scale_watch import Recorder, fetch, kafka_connections, private_kb, rss_kb, scrape  # noqa: E402
from eos_operator.cli import _parser as operator_parser  # noqa: E402
from eos_stack import cluster, kwok  # noqa: E402
from eos_stack.cluster import wait_until  # noqa: E402
from eos_stack.common import Stack, free_port  # noqa: E402
from examples.colors.manifest import colors_manifest  # noqa: E402
from tests.harness.kwok_drivers import fail_pod  # noqa: E402

NO_INFORMERS = "no informers"

GROUP, VERSION, PLURAL = "streaming.eos.dev", "v1beta1", "exactlyoncestreams"
IMAGE = "eos-kwok-driver:bench"   # KWOK runs nothing: no node pulls it
LEASE = "spark-eos-operator"


class Run:
    """One N: its namespace, topics, KWOK node and simulators, two operator replicas and measurements."""

    def __init__(self, a, env: dict[str, str], n: int, work: Path, variant: str = ""):
        self.a, self.env, self.n, self.variant = a, env, n, variant
        self.rid = uuid.uuid4().hex[:6]
        self.ns = f"eos-scale-{n}-{self.rid}"
        self.work = work / self.ns
        self.work.mkdir(parents=True)
        api = config.new_client_from_config(config_file=env["KUBECONFIG"])
        self.api, self.core = api, client.CoreV1Api(api)
        self.custom, self.coord = client.CustomObjectsApi(api), client.CoordinationV1Api(api)
        self.topics = Topics(env["KAFKA_BOOTSTRAP"])
        self.names = [f"s{i:03d}" for i in range(n)]
        self.ops: list[cluster.OperatorProcess] = []
        self.kwok: kwok.KwokNodes | None = None
        self.simulators: list[subprocess.Popen] = []
        self.rec: Recorder | None = None
        self.res: dict = {"streams": n, **({"variant": variant} if variant else {})}

    # -------------------------------------------------------------- set-up
    def start(self) -> None:
        self.core.create_namespace({"metadata": {"name": self.ns}})
        self.source = f"scale-src-{self.rid}"
        self.topics.create({self.source: 1, **{self.sink(s): 1 for s in self.names}})
        self.rec = Recorder(self.api, self.ns)
        self.start_kwok()
        d = operator_parser().parse_args(["run"])   # the operator's own defaults, as in production
        for i in range(2):
            op = cluster.OperatorProcess(self.env["KUBECONFIG"], self.ns, self.work / f"operator-{i}.log",
                                         interval=d.interval, resolution_timeout=d.resolution_timeout,
                                         progress_interval=d.progress_interval, horizon_interval=d.horizon_interval,
                                         metrics_port=free_port(), leader_election=True,
                                         extra_args=("--no-informers",) if self.variant == NO_INFORMERS else ())
            self.ops.append(op.start())
            if i == 0:
                wait_until(lambda: self.leader() is op, "the first replica to take the Lease", 60)
        self.res["settings"] = {"interval_s": d.interval, "progress_interval_s": d.progress_interval,
                                "horizon_interval_s": d.horizon_interval, "lease_duration_s": d.lease_duration}

    def start_kwok(self) -> None:
        """A fake Node of this run and the simulator processes that play its driver Pods, a shard each (a process
        holds about 1,000 Kafka clients at most: ``kwok_drivers``)."""
        self.kwok = kwok.KwokNodes(self.env["KUBECONFIG"], self.rid, self.work / "kwok.log").start()
        shards = -(-self.n // self.a.streams_per_simulator)
        for i in range(shards):
            with open(self.work / f"drivers-{i}.log", "ab") as out:
                self.simulators.append(subprocess.Popen(
                    [sys.executable, "-m", "tests.harness.kwok_drivers", "--kubeconfig", self.env["KUBECONFIG"],
                     "--namespace", self.ns, "--run", self.rid, "--batch-seconds", f"{self.a.batch_seconds:g}",
                     "--concurrency", str(max(1, self.a.concurrency // shards)), "--shard", f"{i}/{shards}"],
                    env={**os.environ, "PYTHONPATH": cluster.PYTHONPATH}, stdout=out, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL))

    def sink(self, name: str) -> str:
        return f"scale-sink-{self.rid}-{name}"

    def leader(self) -> cluster.OperatorProcess | None:
        try:
            holder = self.coord.read_namespaced_lease(LEASE, self.ns).spec.holder_identity
        except client.ApiException:
            return None
        return next((op for op in self.ops if op.alive() and op.identity == holder), None)

    def manifest(self, name: str) -> dict:
        job: dict = {"image": IMAGE, "podTemplate": kwok.pod_template(self.rid)}
        m = colors_manifest(name, self.env["KAFKA_BOOTSTRAP"], self.source, self.sink(name),
                            self.work / "ckpt" / name, parallelism=self.a.parallelism, job=job,
                            restartStrategy={"type": "fixed-delay",
                                             "fixedDelay": {"attempts": 1000, "delaySeconds": 0}})
        m["spec"]["job"].pop("sparkConf")
        return m

    # -------------------------------------------------------------- measuring
    def api_requests(self) -> dict[str, float]:
        """Counters of the API server (all clients) and of the leader (its own counter, if it has one)."""
        resp = self.api.call_api("GET", self.api.configuration.host + "/metrics")
        resp.read()
        text = resp.data.decode()
        out = {"apiserver": sum(v for labels, v in scrape(text, "apiserver_request_total")
                                if labels.get("verb") != "WATCH")}
        leader = self.leader()
        if leader is not None:
            own = scrape(fetch(f"http://127.0.0.1:{leader.metrics_port}/metrics"), "eos_operator_kube_requests_total")
            if own:
                out["operator"] = sum(v for _labels, v in own)
                for labels, v in own:   # what costs it: each verb and resource on its own
                    out[f"operator {labels.get('verb')} {labels.get('resource')}"] = v
        return out

    def window(self, seconds: float, what: str) -> dict:
        """A quiet window: request counters, the leader's CPU and peak RSS, its Kafka connections."""
        op = self.leader()
        pid = op.proc.pid
        bootstrap_port = int(self.env["KAFKA_BOOTSTRAP"].rsplit(":", 1)[1])
        say(f"  {what}: {seconds:.0f}s window")
        a, cpu0, t0 = self.api_requests(), cpu_seconds(pid), time.monotonic()
        peak, conns = 0, []
        while time.monotonic() - t0 < seconds:
            peak = max(peak, rss_kb(pid))
            conns.append(kafka_connections(pid, bootstrap_port))
            time.sleep(2)
        b, cpu1, elapsed = self.api_requests(), cpu_seconds(pid), time.monotonic() - t0
        mine = procstat.my_tree() | {Stack().running_pid("kafka")}
        out = {"foreign_processes": procstat.foreign_processes(mine), "load_avg": list(os.getloadavg()),
               "seconds": round(elapsed, 1), "cpu_s": round(cpu1 - cpu0, 2),
               "cpu_pct": round(100 * (cpu1 - cpu0) / elapsed, 1), "rss_peak_mib": round(peak / 1024, 1),
               "kafka_connections_max": max(conns), "kafka_connections_median": sorted(conns)[len(conns) // 2]}
        for k in a:
            if k in b and not k.startswith("operator "):
                out[f"{k}_requests_per_s"] = round((b[k] - a[k]) / elapsed, 3)
        out["operator_requests_per_s_by_call"] = {k[len("operator "):]: round((b[k] - a.get(k, 0.0)) / elapsed, 3)
                                                  for k in b if k.startswith("operator ") and b[k] > a.get(k, 0.0)}
        return out

    def create_streams(self) -> None:
        say(f"  creating {self.n} streams")
        t0 = time.monotonic()
        for name in self.names:
            self.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, self.manifest(name))
        created = time.monotonic()
        running = lambda: sum(1 for s in self.names if self.rec.stream(s).get("lifecycleState") == "Running" and  # noqa: E731
                              (self.rec.stream(s).get("lastCommittedBatch") or -1) >= 0)
        last = [0, time.monotonic()]

        def all_running() -> bool:
            k = running()
            if k != last[0] or time.monotonic() - last[1] > 30:
                say(f"    {k}/{self.n} running with a committed batch")
                last[:] = [k, time.monotonic()]
            return k == self.n
        wait_until(all_running, f"all {self.n} streams Running", self.a.start_timeout, interval=2)
        self.res["startup"] = {"create_s": round(created - t0, 1), "all_running_s": round(time.monotonic() - t0, 1)}
        say(f"  all running after {self.res['startup']['all_running_s']}s")

    def first_actions(self) -> list[dict]:
        k = min(self.a.sample, self.n)
        picks = [self.names[round(i * (self.n - 1) / max(1, k - 1))] for i in range(k)]
        say(f"  first action: restartNonce of {k} streams, one every {self.a.sample_gap:g}s")
        out = []
        for name in picks:
            out.append(self.bump_and_watch(name))
            time.sleep(self.a.sample_gap)
        return out

    def bump_and_watch(self, name: str, *, timeout: float = 120) -> dict:
        pod = self.rec.stream(name).get("driverPod")
        t0 = time.time()
        obj = self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name,
                                                         {"spec": {"restartNonce": int(t0)}})
        gen = obj["metadata"]["generation"]
        action = wait_until(lambda: self.rec.first_action(name, pod, gen, t0), f"{name}: the operator's action",
                            timeout, interval=0.05)
        return {"stream": name, "first_action_s": round(action[0] - t0, 3), "what": action[1]}

    def crashes(self) -> list[dict]:
        picks = [s for s in self.names[1::max(1, self.n // max(1, self.a.crashes))]][:self.a.crashes]
        say(f"  crash to restart: SIGKILL of {len(picks)} drivers")
        out = []
        for name in picks:
            pod = self.rec.stream(name).get("driverPod")
            t0 = time.time()
            fail_pod(self.core, self.ns, pod)
            new = wait_until(lambda: self.rec.pod_created_after(name, pod, t0), f"{name}: a new driver Pod", 180,
                             interval=0.05)
            out.append({"stream": name, "restart_pod_s": round(new - t0, 3)})
            time.sleep(self.a.sample_gap)
        return out

    def takeover(self) -> dict:
        leader = self.leader()
        standby = next(op for op in self.ops if op is not leader)
        name = self.names[self.n // 2]
        pod = self.rec.stream(name).get("driverPod")
        say("  takeover: SIGKILL of the leader, restartNonce bumped at once")
        t0 = time.time()
        leader.kill9()
        obj = self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name,
                                                         {"spec": {"restartNonce": int(t0) + 1}})
        gen = obj["metadata"]["generation"]
        wait_until(lambda: self.leader() is standby, "the standby to take the Lease", 120, interval=0.1)
        lease_s = time.time() - t0
        action = wait_until(lambda: self.rec.first_action(name, pod, gen, t0), f"{name}: the new leader's action",
                            300, interval=0.05)
        return {"stream": name, "lease_s": round(lease_s, 2), "first_action_s": round(action[0] - t0, 2),
                "what": action[1]}

    def profile(self) -> subprocess.Popen | None:
        """py-spy (``--profile-seconds``) sampling the leader's stacks on CPU from the steady window on, through
        the first actions: where the operator's time goes."""
        exe = Path(sys.executable).with_name("py-spy")
        if self.a.profile_seconds <= 0 or not exe.exists():
            return None
        return subprocess.Popen([str(exe), "record", "--pid", str(self.leader().proc.pid), "--duration",
                                 f"{self.a.profile_seconds:.0f}", "--rate", "50", "--format", "raw", "--nonblocking",
                                 "--output", str(self.work / "profile.txt")],
                                stdout=subprocess.DEVNULL, stderr=open(self.work / "py-spy.log", "ab"))

    def profile_summary(self, proc: subprocess.Popen) -> dict:
        try:
            proc.wait(self.a.profile_seconds + 60)
            return scale_watch.collapsed_summary((self.work / "profile.txt").read_text(), self.a.profile_seconds)
        except (OSError, subprocess.TimeoutExpired) as exc:   # the run's figures stand without it
            return {"error": f"{exc}; {(self.work / 'py-spy.log').read_text(errors='replace')[-500:]}"}

    def drivers_cost(self) -> dict:
        """What playing the drivers costs: KWOK's controller and the simulators."""
        sims, ctl = [p.pid for p in self.simulators], self.kwok.proc.pid
        private = sum(private_kb(p) for p in sims)
        return {"nodes": "kwok", "simulators": len(sims), "simulator_private_mib": round(private / 1024, 1),
                "simulator_rss_mib": round(sum(rss_kb(p) for p in sims) / 1024, 1),
                "simulator_cpu_s": round(sum(cpu_seconds(p) for p in sims), 1),
                "simulator_threads": sum(len(os.listdir(f"/proc/{p}/task")) for p in sims),
                "private_mib_mean": round(private / 1024 / self.n, 2),
                "kwok_rss_mib": round(rss_kb(ctl) / 1024, 1), "kwok_cpu_s": round(cpu_seconds(ctl), 1)}

    # -------------------------------------------------------------- the whole run
    def measure(self) -> dict:
        self.start()
        self.res["baseline"] = self.window(self.a.baseline_seconds, "baseline, no stream")
        self.create_streams()
        time.sleep(self.a.settle_seconds)
        profiler = self.profile()
        self.res["steady"] = self.window(self.a.steady_seconds, f"steady state, {self.n} streams")
        self.res["standins"] = self.drivers_cost()   # the key the results (and scale_report) have always had
        self.res["memory_available_gib"] = round(mem_available_kb() / 1024 / 1024, 1)
        self.res["first_action"] = self.first_actions()
        if profiler is not None:
            self.res["profile"] = self.profile_summary(profiler)
        self.res["crash_restart"] = self.crashes()
        self.res["takeover"] = self.takeover()
        self.res["operator_log_errors"] = sum(op.tail(10**6).count(" ERROR ") for op in self.ops)
        return self.res

    def stop(self) -> None:
        say("  cleaning up")
        for op in self.ops:
            op.stop()
        for sim in self.simulators:
            sim.terminate()
        for sim in self.simulators:
            try:
                sim.wait(40)
            except subprocess.TimeoutExpired:
                sim.kill()
        if self.kwok is not None:
            self.kwok.stop()
        if self.rec is not None:
            self.rec.stop()
        for s in self.names:
            try:
                self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, s,
                                                           {"metadata": {"finalizers": None}})
            except client.ApiException:
                pass
        try:
            self.core.delete_namespace(self.ns)
        except client.ApiException:
            pass
        ledgers = [t for t in self.topics.admin.list_topics(timeout=30).topics if t.startswith(f"scale-sink-{self.rid}-")]
        for t in ledgers:
            self.topics.track(t)
        self.topics.delete_all()
        self.topics.close()
        shutil.rmtree(self.work / "ckpt", ignore_errors=True)


def cpu_seconds(pid: int) -> float:
    return procstat.procs().get(pid, (0, "", 0.0, 0))[2]


def mem_available_kb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", default="50,200,500", help="stream counts, comma-separated, one run each")
    ap.add_argument("--parallelism", type=int, default=1, help="slots per stream")
    ap.add_argument("--batch-seconds", type=float, default=30.0, help="a driver's batch interval")
    ap.add_argument("--streams-per-simulator", type=int, default=250,
                    help="KWOK: drivers per simulator process (a process holds about 1,000 Kafka clients at most)")
    ap.add_argument("--concurrency", type=int, default=8, help="KWOK: drivers the simulator starts or runs a "
                                                              "batch of at once")
    ap.add_argument("--baseline-seconds", type=float, default=30.0)
    ap.add_argument("--settle-seconds", type=float, default=20.0, help="after all are running, before measuring")
    ap.add_argument("--steady-seconds", type=float, default=60.0)
    ap.add_argument("--sample", type=int, default=20, help="streams whose restartNonce is bumped")
    ap.add_argument("--sample-gap", type=float, default=1.0, help="seconds between two bumps, and two crashes")
    ap.add_argument("--crashes", type=int, default=5)
    ap.add_argument("--start-timeout", type=float, default=1800.0)
    ap.add_argument("--profile-seconds", type=float, default=120.0,
                    help="py-spy on the leader from the steady window on (0: none); needs py-spy in the venv")
    ap.add_argument("--baseline-no-informers", action="store_true",
                    help="first, the smallest count once more with the operator's --no-informers (a LIST/GET per "
                         "reconcile pass, as before the watches): the baseline of the same run")
    report.add_results_args(ap, "scale")
    a = ap.parse_args(argv)
    if a.render:
        return report.render(a.render, a.findings, scale_report.markdown, scale_report.summarize)
    env = Stack().read_env()
    if not env.get("KUBECONFIG"):
        print("the local stack is not up: run `make stack-up` first", file=sys.stderr)
        return 2
    os.environ.update(env)
    cluster.Kubectl(env).apply_crds()
    date = dt.date.today().isoformat()
    out = Path(a.out) if a.out else REPO / "benchmarks" / "results" / f"{date}-scale.md"
    argv_shown = argv if argv is not None else sys.argv[1:]
    res: dict = {"date": date, "machine": report.machine_info(), "load_avg_start": list(os.getloadavg()),
                 "command": " ".join(["python", "benchmarks/scale.py", *map(shlex.quote, argv_shown)]),
                 # nodes: how the drivers were played (scale_report reads results without it as the retired
                 # process kubelet's stand-ins).
                 "settings": {**{k: v for k, v in vars(a).items() if k not in ("out", "findings", "render")},
                              "nodes": "kwok"},
                 "runs": []}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="bench-scale-", dir=Stack().state) as tmp:
        counts = [int(x) for x in a.streams.split(",") if x]
        plan = ([(counts[0], NO_INFORMERS)] if a.baseline_no_informers else []) + [(n, "") for n in counts]
        for n, variant in plan:
            say(f"{n} streams" + (f" ({variant})" if variant else ""))
            run = Run(a, env, n, Path(tmp), variant)
            try:
                res["runs"].append(run.measure())
            except Exception as exc:  # noqa: BLE001 - what stopped this N is a result too
                say(f"  {n} streams failed: {exc}")
                res["runs"].append({**run.res, "error": f"{type(exc).__name__}: {str(exc)[:3000]}"})
            finally:
                run.stop()
                logs = REPO / ".stack" / "bench-scale-logs" / run.ns
                logs.mkdir(parents=True, exist_ok=True)
                for f in run.work.glob("*.log"):   # the operators', and KWOK's and its simulator's
                    shutil.copy(f, logs / f.name)
            res["load_avg_end"] = list(os.getloadavg())
            scale_report.summarize(res)
            report.add_findings(res, a.findings)
            out.write_text(scale_report.markdown(res))
            scale_report.plot(res, out.with_suffix(".png"))
            say(f"results written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
