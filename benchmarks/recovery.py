"""Recovery from a driver SIGKILL to the first new committed output, through the operator, in parts.

On the local stack (operator from this work tree, the real nodes, real runtime, real Kafka; the stream placed
on the nodes as the e2e tests place theirs, ``tests/e2e/on_nodes.py``: its checkpoint in the stack's bucket) one
colors stream runs with events arriving steadily, its restart strategy fixed-delay with a delay of 0 s. Each
round SIGKILLs every process of the running driver's container, found through its cgroup (t0; ``NodePods.kill9``),
and records when each step of the recovery became observable, all on this machine's one clock:

* **the API** (a watch of this process on the namespace's Pods): the old Pod ``Failed``, deleted and
  gone, the new Pod created, the new Pod ``Running``;
* **the operator's log** (its own timestamps, ms): the ``DriverFailed`` event it posts when it sees the
  failure, and ``resolution of NS/NAME in X ms`` (resolution's start is that line minus X);
* **the new driver's process** (``/proc`` of this machine, where the nodes' containers run; 10 ms ticks): when
  its Python spawned the JVM (spark-submit);
* **the new driver's log** (ms): ``driver epoch N stamped ... in X ms`` (the stamp follows the
  SparkSession's build, so the session was ready at that line minus X) and the first ``batch N
  committed: ... (X ms)`` (the first micro-batch ran from that line minus X);
* **the output** (a read_committed consumer tailing the sink topic in this process): the first record
  written after t0, its record timestamp and when the consumer received it (it is then committed).

The parts are the differences between consecutive marks; the total runs from t0 to that first new
committed record being received. Output is checked exactly once at the end.

``--variant KEY=VALUE`` (a job.sparkConf entry, repeatable) tries a setting in the same run: after the
default rounds the stream is upgraded to it and as many rounds follow.

    make bench-recovery          # or: python benchmarks/recovery.py --rounds 5
    python benchmarks/recovery.py --rounds 5 --variant 'spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1'
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for extra in (REPO / "operator", REPO / "jobs", REPO, REPO / "stack"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from confluent_kafka import OFFSET_END, TopicPartition  # noqa: E402

from eos_job.ledger import ledger_consumer  # noqa: E402
from benchmarks.report import add_findings, add_results_args, machine_info, render, say, tail  # noqa: E402
from eos_stack.cluster import wait_until  # noqa: E402
from benchmarks.upgrade_gap import NOT_UP, bench_namespace  # noqa: E402
from tests.e2e.on_nodes import NodeStreams  # noqa: E402
from tests.e2e.streams import NAME, finish_exact, rig  # noqa: E402

# (part, from mark, to mark, what it is), in the order they happen.
PARTS = [
    ("detection", "kill", "operator_failed", "SIGKILL to the operator's DriverFailed event (its log)"),
    ("restart_wait", "operator_failed", "resolution_start",
     "restart delay (0 s; milliseconds since d61f35b, the whole second before) and removal of the failed Pod"),
    ("resolution", "resolution_start", "resolution_end", "fencing and ledger reads (operator log, ms)"),
    ("submit", "resolution_end", "pod_created", "status write, run ConfigMap and Pod create"),
    ("pod_start", "pod_created", "pod_running",
     "the nodes' scheduler binds it, the kubelet mounts its volumes and containerd starts the container"),
    ("python_start", "pod_running", "jvm_spawned", "interpreter, imports, pre-flight, up to spark-submit"),
    ("jvm_session", "jvm_spawned", "session_ready", "launcher and driver JVMs, SparkContext, SparkSession"),
    ("to_first_batch", "session_ready", "first_batch_start", "epoch stamp, ledger history, query start"),
    ("first_batch", "first_batch_start", "output_seen",
     "the first micro-batch until a read_committed consumer has its first record"),
]
SUBMARKS = [("pod_failed", "kill", "pod_failed", "SIGKILL to the old Pod's phase Failed in the API"),
            ("delay_wait", "operator_failed", "old_pod_deleting",
             "the restart's not-before time (now + 0 s; to the millisecond since d61f35b), then the delete"),
            ("old_pod_removal", "old_pod_deleting", "old_pod_gone", "the failed Pod deleted to gone (API)"),
            ("to_resolution", "old_pod_gone", "resolution_start", "the Pod's absence seen, resolution started"),
            ("first_batch_whole", "first_batch_start", "first_batch_end",
             "the first micro-batch to its batch-complete log line (its slots commit before it)")]

LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
SPARK_TIME = re.compile(r"^(\d\d/\d\d/\d\d \d\d:\d\d:\d\d) ")


def log_lines(path: Path) -> list[tuple[float, str]]:
    """Lines of a Python log (``%(asctime)s`` local time, ms) with their time; continuation lines dropped."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        m = LOG_TIME.match(line)
        if m:
            out.append((datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp(), line))
    return out


def minus_ms(t: float, line: str, pattern: str) -> float | None:
    m = re.search(pattern, line)
    return t - float(m.group(1)) / 1000 if m else None


def operator_marks(log: Path, ns: str, after: float) -> dict[str, float]:
    marks: dict[str, float] = {}
    for t, line in log_lines(log):
        if t < after - 1:
            continue
        if "operator_failed" not in marks and f"{ns}/{NAME} DriverFailed:" in line:
            marks["operator_failed"] = t
        elif "operator_failed" in marks and "resolution_end" not in marks and \
                f"resolution of {ns}/{NAME} in " in line:
            marks["resolution_end"] = t
            marks["resolution_start"] = minus_ms(t, line, r" in (\d+) ms")
    return marks


def driver_marks(log: Path) -> dict[str, Any]:
    marks: dict[str, Any] = {}
    text = log.read_text(errors="replace")
    spark = [SPARK_TIME.match(line) for line in text.splitlines()]
    first_spark = next((m.group(1) for m in spark if m), None)
    if first_spark:   # seconds only: context, not a mark
        marks["jvm_first_log_s"] = datetime.strptime(first_spark, "%y/%m/%d %H:%M:%S").timestamp()
    for t, line in log_lines(log):
        if "session_ready" not in marks and "driver epoch" in line and " stamped " in line:
            marks["session_ready"] = minus_ms(t, line, r" in (\d+) ms")
        elif "first_batch_end" not in marks and re.search(r"eos_job: batch \d+ committed", line):
            marks["first_batch_end"] = t
            marks["first_batch_start"] = minus_ms(t, line, r"\((\d+) ms\)\s*$")
            marks["first_batch_line"] = line.split("eos_job: ", 1)[1]
        elif "query_started" not in marks and re.search(r"eos_job: stream \S+ started", line):
            marks["query_started"] = t
        elif "replayed" not in marks and "eos_job.replay: re-ran" in line:
            marks["replayed"] = line.split("eos_job.replay: ", 1)[1]
    return marks


def first_batch_kind(marks: dict[str, Any]) -> str:
    """What the new driver's first batch was: a re-run of the batch the killed driver had logged (by a
    one-trigger query before the stream's own) or the stream's next batch; and whether it wrote output."""
    line = marks.get("first_batch_line") or ""
    m = re.match(r"batch (\d+) committed: (\d+) records, (\d+)/(\d+) slots skipped", line)
    if not m:
        return "?"
    batch, records, skipped, slots = m.groups()
    kind = "re-run" if marks.get("replayed") else "next"
    return f"{kind} of batch {batch}, {records} records" + (f", {skipped}/{slots} slots skipped" if skipped != "0"
                                                             else "")


def batch_ms(log: Path) -> list[float]:
    """Durations of the batches a driver committed, in order (its log)."""
    return [float(m.group(1)) for _, line in log_lines(log)
            if (m := re.search(r"eos_job: batch \d+ committed.*\((\d+) ms\)\s*$", line))]


def process_marks(ns: str, pod: str) -> dict[str, Any]:
    """Start times of the driver's Python process and of the JVM it spawned, from /proc (10 ms ticks), and the
    JVM's -XX options (what a variant changed)."""
    tick = os.sysconf("SC_CLK_TCK")
    now_wall, now_boot = time.time(), time.clock_gettime(time.CLOCK_BOOTTIME)
    found: dict[str, Any] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = (proc / "environ").read_bytes()
            if f"EOS_DRIVER_POD={pod}".encode() not in env or ns.encode() not in env:
                continue
            cmd = (proc / "cmdline").read_bytes()
            start = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[19]) / tick
        except (OSError, IndexError, ValueError):
            continue
        kind = "jvm_spawned" if b"org.apache.spark.deploy.SparkSubmit" in cmd else \
            "python_started" if b"eos_job" in cmd else None
        if kind:
            at = now_wall - (now_boot - start)
            found[kind] = min(found.get(kind, at), at)
            if kind == "jvm_spawned":
                found["jvm_xx_options"] = sorted({a for a in cmd.decode(errors="replace").split("\0")
                                                  if a.startswith("-XX:")})
    return found


class Timeline:
    """Times (this machine's clock) of what this process saw: Pod phases through a watch, output records
    through a read_committed consumer."""

    def __init__(self, kubeconfig: str, ns: str):
        from kubernetes import client, config
        self.core = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
        self.ns = ns
        self.pods: dict[str, dict[str, float]] = {}     # pod -> {"created"|phase: first time seen}
        self.output: list[tuple[float, float]] = []      # (received, record timestamp)
        self.lock, self.halt = threading.Lock(), threading.Event()
        self.threads = [threading.Thread(target=self._watch_pods, daemon=True)]

    def start_output(self, bootstrap: str, topic: str) -> None:
        t = threading.Thread(target=self._tail, args=(bootstrap, topic), daemon=True)
        self.threads.append(t)
        t.start()

    def start(self) -> "Timeline":
        self.threads[0].start()
        return self

    def stop(self) -> None:
        self.halt.set()
        for t in self.threads:
            t.join(15)

    def _watch_pods(self) -> None:
        from kubernetes import watch
        rv = None
        while not self.halt.is_set():
            try:
                for ev in watch.Watch().stream(self.core.list_namespaced_pod, self.ns, resource_version=rv,
                                               timeout_seconds=5, allow_watch_bookmarks=False):
                    now, pod = time.time(), ev["object"]
                    rv = pod.metadata.resource_version
                    with self.lock:
                        seen = self.pods.setdefault(pod.metadata.name, {"created": now})
                        seen.setdefault(pod.status.phase or "Pending", now)
                        if pod.metadata.deletion_timestamp is not None:
                            seen.setdefault("Deleting", now)
                        if ev["type"] == "DELETED":
                            seen.setdefault("Deleted", now)
            except Exception:  # noqa: BLE001 - a broken watch is listed again
                rv = None
                time.sleep(0.2)

    def _tail(self, bootstrap: str, topic: str) -> None:
        c = ledger_consumer(bootstrap)
        try:
            parts = c.list_topics(topic, timeout=30).topics[topic].partitions
            c.assign([TopicPartition(topic, p, OFFSET_END) for p in parts])
            while not self.halt.is_set():
                for m in c.consume(100, 0.2):
                    if m.error() is None:
                        with self.lock:
                            self.output.append((time.time(), m.timestamp()[1] / 1000.0))
        finally:
            c.close()

    def pod(self, name: str) -> dict[str, float]:
        with self.lock:
            return dict(self.pods.get(name, {}))

    def first_output_after(self, t0: float) -> tuple[float, float] | None:
        with self.lock:
            new = [o for o in self.output if o[1] > t0]
        return min(new) if new else None


def parts_of(marks: dict[str, Any]) -> dict[str, float | None]:
    def diff(a: str, b: str) -> float | None:
        return None if marks.get(a) is None or marks.get(b) is None else round(marks[b] - marks[a], 3)
    out = {name: diff(a, b) for name, a, b, _ in PARTS + SUBMARKS}
    out["total"] = diff("kill", "output_seen")
    out["total_to_record_timestamp"] = diff("kill", "output_record")
    return out


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def one_round(r, timeline: Timeline, i: int, setting: str) -> dict[str, Any]:
    ns = r.ns
    old = r.status()["driverPod"]
    load_before = loadavg()
    t0 = time.time()
    if not r.kubelet.kill9(ns, old):
        raise RuntimeError(f"{old} has no running process to kill")
    s = r.wait_status(lambda s: s.get("driverPod") not in (None, old) and s.get("lifecycleState") == "Running",
                      f"round {i}: a new driver running", 300)
    new = s["driverPod"]
    wait_until(lambda: timeline.first_output_after(t0), f"round {i}: new committed output", 300, r.diag, 0.2)
    wait_until(lambda: "first_batch_end" in driver_marks(r.kubelet.log_path(ns, new)),
               f"round {i}: the first batch in the driver's log", 60, r.diag, 0.5)
    old_pod, new_pod = timeline.pod(old), timeline.pod(new)
    marks: dict[str, Any] = {"kill": t0, "pod_failed": old_pod.get("Failed"),
                             "old_pod_deleting": old_pod.get("Deleting"), "old_pod_gone": old_pod.get("Deleted"),
                             "pod_created": new_pod.get("created"), "pod_running": new_pod.get("Running")}
    marks.update(operator_marks(r.operator.log_path, ns, t0))
    marks.update(process_marks(ns, new))
    marks.update(driver_marks(r.kubelet.log_path(ns, new)))
    marks["output_seen"], marks["output_record"] = timeline.first_output_after(t0)
    parts = parts_of(marks)
    say(f"round {i} ({setting}): {old} -> {new}, total {parts['total']} s; " +
        ", ".join(f"{k} {v}" for k, v in parts.items() if k != "total"))
    return {"round": i, "setting": setting, "old_pod": old, "new_pod": new, "t0": t0,
            "marks_after_kill_s": {k: round(v - t0, 3) if isinstance(v, float) and k != "kill" else v
                                   for k, v in marks.items()},
            "parts_s": parts, "first_batch": first_batch_kind(marks), "restart_count": s.get("restartCount"),
            "resolution": (s.get("resolution") or {}).get("summary"),
            # The killed driver's batches after its first: the steady state the setting runs at.
            "old_driver_batch_ms": batch_ms(r.kubelet.log_path(ns, old))[1:],
            "load_before": load_before, "load_after": loadavg()}


def spread(vals: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(vals), 3), "min": min(vals), "max": max(vals), "n": len(vals)}


def summarise(rounds: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    names = [p[0] for p in PARTS + SUBMARKS] + ["total", "total_to_record_timestamp"]
    out = {}
    for name in names:
        vals = [x["parts_s"][name] for x in rounds if x["parts_s"].get(name) is not None]
        if vals:
            out[name] = spread(vals)
    steady = [ms / 1000 for x in rounds for ms in x.get("old_driver_batch_ms", [])]
    if steady:
        out["steady_batch"] = spread(steady)
    return out


def recompute(res: dict[str, Any]) -> None:
    """The parts and the summaries again from each round's marks (``--render`` after a change of PARTS)."""
    for x in res["rounds"]:
        x["parts_s"] = parts_of({**x["marks_after_kill_s"], "kill": 0.0})
    settings = dict.fromkeys(x.get("setting", "default") for x in res["rounds"])
    res["summary"] = {k: summarise([x for x in res["rounds"] if x.get("setting", "default") == k])
                      for k in settings}


def work_tree() -> dict[str, str]:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()
    import eos_operator
    return {"head": git("rev-parse", "--short", "HEAD"), "operator_module": str(Path(eos_operator.__file__).parent),
            "uncommitted_in_operator": git("status", "--short", "operator/").replace("\n", "; ")}


def cell(v: dict[str, float] | None) -> str:
    return "–" if v is None else f"{v['median']:.2f} ({v['min']:.2f}–{v['max']:.2f})"


def markdown(res: dict[str, Any]) -> str:
    settings = list(res["summary"])
    base = res["summary"]["default"]
    desc = {p[0]: (p[1], p[2], p[3]) for p in PARTS + SUBMARKS}
    largest = max((p[0] for p in PARTS if p[0] in base), key=lambda n: base[n]["median"])
    head = "| part | from → to | what | " + " | ".join(f"{k}: median (min–max), s" for k in settings) + " |"
    rule = "|---|---|---|" + "---|" * len(settings)

    def row(name: str, bold: bool = False) -> str:
        a, b, what = desc.get(name, ("", "", ""))
        cells = " | ".join(cell(res["summary"][k].get(name)) for k in settings)
        return f"| {'**' + name + '**' if bold else name} | {a} → {b} | {what} | {cells} |"
    total = base.get("total", {})
    variant = res.get("variant") or {}
    lines = [
        f"# Recovery from a driver SIGKILL, in parts ({res['when']})", "",
        f"`{res['command']}` on the local stack: operator from the work tree ({res['work_tree']['head']}"
        f"{', with uncommitted changes in operator/' if res['work_tree']['uncommitted_in_operator'] else ''}),"
        " the real nodes, real runtime (Spark local mode), real Kafka. One colors stream, events arriving"
        " steadily (10 every 0.25 s), trigger 500 ms, restart strategy fixed-delay 0 s"
        + (f"; after the `default` rounds the stream's job.sparkConf is changed to {json.dumps(variant)}"
           " (a snapshot upgrade) and the `variant` rounds follow" if variant else "") +
        f". Machine: {res['machine']['cores']} cores ({res['machine']['cpu']}), {res['machine']['ram_gb']} GB,"
        f" shared. Load average (1, 5, 15 min) before: {res['load_before']}, after: {res['load_after']}. "
        f"{res['rounds_done']} rounds; output checked exactly once at the end: {res['exactly_once']}.", "",
        f"**Total (default), SIGKILL to the first new record received by a read_committed consumer: median "
        f"{total.get('median', float('nan')):.2f} s (min–max {total.get('min', float('nan')):.2f}–"
        f"{total.get('max', float('nan')):.2f}).** Largest part: **{largest}** "
        f"({base[largest]['median']:.2f} s median).", "",
        head, rule, *[row(p[0]) for p in PARTS if p[0] in base], row("total", bold=True), "",
        "Details (they overlap the parts above, not summed); `steady_batch`: the killed drivers' batches after"
        " their first, for what a setting costs in the steady state:", "",
        head, rule, *[row(n) for n in [p[0] for p in SUBMARKS] + ["total_to_record_timestamp", "steady_batch"]
                      if n in base], "",
        "Where each mark comes from: `pod_failed`, `pod_created`, `pod_running`: a Pod watch of the benchmark"
        " (time received); `operator_failed`: the operator log's `DriverFailed` event line;"
        " `resolution_start/end`: the operator log's `resolution of ... in X ms` (end, and end − X);"
        " `jvm_spawned`: /proc start time of the driver's spark-submit JVM; `session_ready`: the driver log's"
        " `driver epoch N stamped ... in X ms` minus X; `first_batch_start/end`: the driver log's first"
        " `batch N committed ... (X ms)`, end − X and end; `output_seen`: a read_committed consumer of the"
        " sink topic receiving the first record whose timestamp is after the kill.", "",
        "Per round (each part's duration, s):", "",
        "| round | setting | " + " | ".join(p[0] for p in PARTS) + " | total | the first batch |",
        "|---|---|" + "---|" * (len(PARTS) + 2),
        *[f"| {x['round']} | {x.get('setting', 'default')} | " + " | ".join(f"{x['parts_s'][p[0]]}" for p in PARTS)
          + f" | {x['parts_s']['total']} | {x.get('first_batch', '')} |" for x in res["rounds"]],
    ]
    return tail(lines, res)


def settings_arg(pairs: list[str]) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in pairs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="driver kills (per setting)")
    ap.add_argument("--settle", type=float, default=8.0, help="seconds of steady output before each kill")
    ap.add_argument("--variant", action="append", default=[], metavar="KEY=VALUE",
                    help="a job.sparkConf entry (repeatable): after the default rounds, the stream is upgraded to it "
                         "and as many rounds follow")
    add_results_args(ap, "recovery")
    args = ap.parse_args(argv)
    out = Path(args.out or REPO / "benchmarks" / "results" / f"{time.strftime('%Y-%m-%d')}-recovery.md")
    if args.render:
        return render(args.render, args.findings, markdown, recompute)
    bench = bench_namespace()
    if bench is None:
        print(NOT_UP, file=sys.stderr)
        return 2
    env, kubectl, namespace, workdir = bench
    variant = settings_arg(args.variant)
    res: dict[str, Any] = {"when": time.strftime("%Y-%m-%d %H:%M"), "machine": machine_info(),
                           "command": f"python benchmarks/recovery.py --rounds {args.rounds}"
                                      + "".join(f" --variant '{kv}'" for kv in args.variant),
                           "work_tree": work_tree(), "variant": variant, "load_before": loadavg(), "rounds": []}
    timeline = Timeline(env["KUBECONFIG"], namespace).start()
    try:
        with rig(env, kubectl, namespace, workdir, on_nodes=NodeStreams(env, kubectl, namespace).setup()) as r:
            strategy = {"type": "fixed-delay", "fixedDelay": {"attempts": 1000, "delaySeconds": 0}}
            trickle = r.run_stream(r.stream(restartStrategy=strategy, upgradePreFlight=False), seed=31)
            timeline.start_output(r.bootstrap, r.topics.counts)
            try:
                for setting in ("default", "variant") if variant else ("default",):
                    if setting == "variant":
                        before = r.status()["driverPod"]
                        kubectl.patch_spec(namespace, NAME, {"job": {"sparkConf": variant}})
                        r.wait_status(lambda s: s.get("driverPod") != before and s.get("lifecycleState") == "Running"
                                      and "upgrade" not in s, "the upgrade to the variant", 300)
                    for _ in range(args.rounds):
                        time.sleep(args.settle)
                        res["rounds"].append(one_round(r, timeline, len(res["rounds"]) + 1, setting))
                finish_exact(r, trickle)
                res["exactly_once"] = "yes (finish_exact)"
            finally:
                # The upgrade's snapshot carries the operator's finalizer: deleted while the operator runs, or
                # the namespace would never finish terminating.
                kubectl.run("delete", "exactlyoncesnapshots", "--all", "-n", namespace, "--timeout=120s",
                            check=False)
    finally:
        timeline.stop()
        kubectl.run("delete", "namespace", namespace, "--wait=false", check=False)
    res["load_after"] = loadavg()
    res["rounds_done"] = len(res["rounds"])
    recompute(res)
    add_findings(res, args.findings)
    out.write_text(markdown(res))
    say(f"results in {out}")
    print(json.dumps(res["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
