"""What the sink benchmark measures around a run: stderr, CPU by process, Spark's stage timings.

* ``StderrTee``: fd 2 (the JVM's and the Python workers' stderr too) to a log file and on to the terminal,
  with the lines that show slot producers fenced again or tasks lost counted.
* ``CpuMeter``: CPU seconds of the driver, the JVM, the Python workers and the broker (``procstat.CpuMeter``).
* ``EventLog``: per-query stage timings from Spark's event log.
* ``progress``, ``time_split``: a query's progress, and one run's wall time by part.
"""
from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from pathlib import Path

from benchmarks import procstat


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


class EventLog:
    """Per-query stage timings from Spark's event log (JSON lines, flushed at stage and job end).

    Each ``profile`` reads only what was appended since the previous one (a long benchmark's log grows to
    hundreds of MB): one query runs at a time and each is profiled once, after it ended.
    """

    def __init__(self, folder: Path):
        self.folder = folder
        self.read_to: dict[Path, int] = {}

    def _events(self):
        for f in sorted(p for p in self.folder.rglob("*") if p.is_file() and "events" in p.name):
            with open(f, "rb") as fh:
                fh.seek(self.read_to.get(f, 0))
                data = fh.read()
            end = data.rfind(b"\n") + 1   # a line being written is read next time
            self.read_to[f] = self.read_to.get(f, 0) + end
            for line in data[:end].splitlines():
                try:
                    yield json.loads(line)
                except ValueError:
                    continue

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


def progress(q) -> list[dict]:
    out = []
    for p in q.recentProgress:
        d = p if isinstance(p, dict) else json.loads(p.json)
        out.append(d)
    return out
