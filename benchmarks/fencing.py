#!/usr/bin/env python3
"""Fencing benchmark: resolution's time for a stream of 16, 256 and 1,024 slots, fencing one id at a time vs in parallel.

Resolution (``eos_job.resolution.resolve``) fences 2 x P transactional ids for P
slots, then reads each slot's latest ledger record. Each slot count is one
stream restarting on the local broker: generation 1 after 0 (both in the
ledger's history), batch 0 committed in the checkpoint and in the ledger (P + 1
partitions), no transaction open; a warm-up resolution (not counted) creates
the ids, so every fence bumps an epoch. Modes: **sequential** (pool of 1,
librdkafka's sparse connections: the baseline), **pool-8** (the fencing before
this change), **parallel** (pool of 64, sparse: clusters of more than
``fencing.DENSE_MAX_BROKERS`` brokers), **parallel-dense** (pool of 64,
``enable.sparse.connections=false``: resolution's choice on this one-broker
cluster). ``--repeats`` runs per mode and slot count, in rotating order; the
sequential baseline up to ``--sequential-max-slots`` (256: at 1,024 it would
take minutes a run), estimated above from its time per id, and marked so.

Per run: resolution's wall time, of which the fencing (``fence_all``), the
ledger reads (``read_latest_many``) and the rest; CPU seconds of this process and
of the broker (/proc); peak threads and ``rdk:*`` threads before and after
(equal when every client was closed). Resolution's timeout is ``--timeout``
(900 s) so that the baseline can finish. Results:
``benchmarks/results/<date>-fencing.md`` (or ``--out``) with the command, the
machine, the tables, every run and the JSON.

Run: ``make bench-fencing``, or
``EOS_STATE=.stack PYTHONPATH=stack:.:jobs .venv/bin/python benchmarks/fencing.py --slots 16,256 --repeats 1``.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for _p in (REPO / "jobs", REPO, REPO / "stack"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

from benchmarks import procstat, report  # noqa: E402
from benchmarks.kafka_io import Topics  # noqa: E402
from benchmarks.report import say  # noqa: E402
from eos_job import fencing, protocol, resolution  # noqa: E402
from eos_job.ledger_topic import Durability, ensure_ledger_topic  # noqa: E402
from eos_job.spec import ExactlyOnceStreamSpec, RunConfig, StreamIdentity  # noqa: E402
from eos_stack.common import Stack  # noqa: E402

MODES = {
    "sequential": {"pool": 1, "dense": False, "what": "one id at a time, sparse connections (the baseline)"},
    "pool-8": {"pool": 8, "dense": False, "what": "8 at a time, sparse connections (before this change)"},
    "parallel": {"pool": 64, "dense": False, "what": "64 at a time, sparse connections (clusters of > 3 brokers)"},
    "parallel-dense": {"pool": 64, "dense": True,
                       "what": "64 at a time, dense connections (resolution's choice on this 1-broker cluster)"},
}
TARGETS = {256: 2.0, 1024: 5.0}   # the issue's: resolution of 256 slots within 2 s, of 1,024 within 5 s
SINK_PARTITIONS = 4


# ------------------------------------------------------------------ measuring
class Threads:
    """The process's peak thread count while it runs (sampled every 20 ms from /proc/self/status)."""

    def __init__(self):
        self.peak, self._stop = count_threads(), threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True, name="thread-meter")
        self._t.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, count_threads())

    def stop(self) -> int:
        self._stop.set()
        self._t.join()
        return self.peak


def count_threads() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def librdkafka_threads() -> int:
    n = 0
    for task in os.listdir("/proc/self/task"):
        try:
            n += Path(f"/proc/self/task/{task}/comm").read_text().startswith("rdk:")
        except OSError:
            pass
    return n


def broker_cpu(pid: int | None) -> float:
    return procstat.procs().get(pid, (0, "", 0.0, 0))[2] if pid else 0.0


class Timed:
    """``resolution.<name>`` with the wall time of its calls summed (since ``reset``): the fencing
    (``fence_all``) and the ledger reads (``read_latest_many``) of a resolution."""

    def __init__(self, name: str):
        self.real, self.seconds, self.calls = getattr(resolution, name), 0.0, 0
        setattr(resolution, name, self)

    def reset(self) -> None:
        self.seconds, self.calls = 0.0, 0

    def __call__(self, *args, **kwargs):
        t0 = time.monotonic()
        try:
            return self.real(*args, **kwargs)
        finally:
            self.seconds += time.monotonic() - t0
            self.calls += 1


# ------------------------------------------------------------------ one stream per slot count
def make_stream(bootstrap: str, slots: int, run_id: str, work: Path, topics: Topics) -> RunConfig:
    """A stream of ``slots`` slots restarting under generation 1: sink topic, ledger with each slot's record of
    batch 0 and the batch-complete record, generation history 0 and 1, checkpoint with batch 0 committed."""
    name = f"bench-fence-{slots}-{run_id}"
    sink = f"{name}-out"
    topics.create({sink: SINK_PARTITIONS})
    spec = ExactlyOnceStreamSpec.model_validate({
        "job": {"module": "m", "parallelism": slots},
        "source": {"bootstrapServers": bootstrap, "topics": ["unused"]},
        "sink": {"bootstrapServers": bootstrap, "topic": sink, "ledgerTopic": f"{name}-ledger"},
        "checkpoint": {"store": "local", "path": str(work / name)}})
    uid = uuid.uuid4().hex
    config = RunConfig(stream=StreamIdentity(name=name, namespace="bench", uid=uid, generation=1), spec=spec,
                       checkpoint_dir=str(work / name / "live"))
    ledger = config.ledger_topic()
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        ensure_ledger_topic(admin, ledger, slots, Durability(1, 1))
    topics.track(ledger)
    ckpt_id = str(uuid.uuid4())
    live = Path(config.checkpoint_dir)
    for sub in ("offsets", "commits"):
        (live / sub).mkdir(parents=True)
        (live / sub / "0").write_text("v1\n{}\n")
    (live / "metadata").write_text(json.dumps({"id": ckpt_id}) + "\n")
    history = protocol.GenerationHistory().with_generation(0, slots, 0).with_generation(1, slots, 0)
    records = [(protocol.BATCH_PARTITION, protocol.generations_key(uid), history.encode()),
               (protocol.BATCH_PARTITION, protocol.batch_key(uid, ckpt_id, 1),
                protocol.BatchCompleteRecord(batch=0, slots=slots, count=slots, skipped_slots=0).encode())]
    records += [(protocol.ledger_partition(s), protocol.slot_key(uid, ckpt_id, 1, s),
                 protocol.SlotLedgerRecord(batch=0, count=1, digest=s).encode()) for s in range(slots)]
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5})
    errors: list = []
    for part, key, value in records:
        p.produce(ledger, key=key.encode(), value=value, partition=part,
                  on_delivery=lambda err, _m: errors.append(err) if err else None)
    if p.flush(60) or errors:
        raise RuntimeError(f"could not write the ledger {ledger}: {errors[:1] or 'timed out'}")
    p.close()
    return config


def run_once(config: RunConfig, mode: str, timers: dict[str, Timed], timeout_s: float,
             broker_pid: int | None) -> dict:
    m = MODES[mode]
    for t in timers.values():
        t.reset()
    load, rdk0, threads0 = os.getloadavg(), librdkafka_threads(), count_threads()
    meter, b0, c0 = Threads(), broker_cpu(broker_pid), time.process_time()
    t0 = time.monotonic()
    r = resolution.resolve(config, timeout_s=timeout_s, fence_pool=m["pool"], dense_fences=m["dense"])
    total = time.monotonic() - t0
    cpu_self, cpu_broker, peak = time.process_time() - c0, broker_cpu(broker_pid) - b0, meter.stop()
    slots = config.spec.job.parallelism
    if r.fenced_transactional_ids != 2 * slots or len(r.last_committed_batch_per_slot) != slots:
        raise RuntimeError(f"{mode}: resolution fenced {r.fenced_transactional_ids} ids and read "
                           f"{len(r.last_committed_batch_per_slot)} slots, not {2 * slots} and {slots}: {r.summary}")
    return {"slots": slots, "ids": r.fenced_transactional_ids, "mode": mode, "pool": m["pool"], "dense": m["dense"],
            "total_s": round(total, 3), "fence_s": round(timers["fence"].seconds, 3),
            "ledger_reads_s": round(timers["ledger"].seconds, 3), "ledger_reads": timers["ledger"].calls,
            "rest_s": round(total - timers["fence"].seconds - timers["ledger"].seconds, 3),
            "cpu_self_s": round(cpu_self, 2), "cpu_broker_s": round(cpu_broker, 2), "threads_peak": peak,
            "threads_before_after": [threads0, count_threads()], "rdk_threads_before_after": [rdk0, librdkafka_threads()],
            "load_before": round(load[0], 2), "load_after": round(os.getloadavg()[0], 2)}


# ------------------------------------------------------------------ summary and results file
def med(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "n": len(values)}


def summarize(res: dict) -> None:
    runs = [r for r in res["runs"] if not r.get("warmup")]
    out: dict = {}
    for slots in res["settings"]["slots"]:
        row: dict = {}
        for mode in res["settings"]["modes"]:
            rs = [r for r in runs if r["slots"] == slots and r["mode"] == mode]
            if rs:
                row[mode] = {k: med([r[k] for r in rs]) for k in ("total_s", "fence_s", "ledger_reads_s", "rest_s",
                                                                   "cpu_self_s", "cpu_broker_s", "threads_peak")}
        out[str(slots)] = row
    # The sequential baseline where it did not run: its fencing time per id at the largest slot count it ran.
    seq = [int(s) for s, row in out.items() if "sequential" in row]
    if seq and "sequential" in res["settings"]["modes"]:
        ran = max(seq)
        per_id = out[str(ran)]["sequential"]["fence_s"]["median"] / (2 * ran)
        for s, row in out.items():
            if "sequential" not in row and row:
                other = row[next(iter(row))]
                est = round(per_id * 2 * int(s) + other["ledger_reads_s"]["median"] + other["rest_s"]["median"], 1)
                row["sequential"] = {"estimated_from_slots": ran, "total_s": {"median": est, "min": est, "max": est,
                                                                             "n": 0},
                                     "fence_s": {"median": round(per_id * 2 * int(s), 1)}}
    res["summary"] = out


def cell(stat: dict) -> str:
    if stat.get("n") == 0:
        return f"~{stat['median']:.0f} (est.)"
    if stat["min"] == stat["max"]:
        return f"{stat['median']:.2f}"
    return f"{stat['median']:.2f} ({stat['min']:.2f}–{stat['max']:.2f})"


def markdown(res: dict) -> str:
    m, s, summ = res["machine"], res["settings"], res["summary"]
    lines = [f"# Fencing benchmark {res['date']}: resolution of 16 to 1,024 slots, sequential vs parallel fencing", "",
             "Resolution (`eos_job.resolution.resolve`) of one stream restarting on the local stack's broker, for "
             "each slot count P: 2 x P transactional ids fenced (generations 0 and 1, ids that exist already), then "
             "the ledger's latest record read for each of the P slots (one record each) and the batch-complete "
             "record; no transaction open. Produced by `benchmarks/fencing.py`:", "",
             f"    {res['command']}", "",
             f"Machine: **{m['cores']} cores** ({m['cpu']}), {m['ram_gb']} GB RAM, shared (load average "
             f"{res['load_avg_start'][0]:.1f} at start, {res['load_avg_end'][0]:.1f} at end); Python {m['python']}, "
             f"Kafka broker {m['kafka_broker']} (single node, KRaft, same machine, `transaction.state.log."
             f"num.partitions=4`), librdkafka {m['librdkafka']}.", "",
             f"Settings: slots {', '.join(map(str, s['slots']))}; {s['repeats']} repeats per mode in rotating order "
             f"after one warm-up resolution per slot count (not counted); resolution timeout {s['timeout_s']:g} s; "
             f"sequential baseline run up to {s['sequential_max_slots']} slots. Times in seconds, median "
             "(min–max).", "",
             "Modes: " + "; ".join(f"**{k}**: {MODES[k]['what']}" for k in s["modes"]) + ".", "",
             "| slots | ids | mode | resolution s | of which fencing s | ledger reads s | rest s | vs sequential | "
             "vs pool-8 | CPU s this process | CPU s broker | peak threads |",
             "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for slots in s["slots"]:
        row = summ.get(str(slots), {})
        base = row.get("sequential", {}).get("total_s", {}).get("median")
        old = row.get("pool-8", {}).get("total_s", {}).get("median")
        for mode in s["modes"]:
            r = row.get(mode)
            if r is None:
                continue
            t = r["total_s"]["median"]
            if r["total_s"].get("n") == 0:
                lines.append(f"| {slots:,} | {2 * slots:,} | {mode} | {cell(r['total_s'])} | "
                             f"~{r['fence_s']['median']:.0f} (est.) | | | 1.0x | | | | |")
                continue
            vs_seq = f"{base / t:.1f}x" if base else ""
            vs_old = f"{old / t:.1f}x" if old else ""
            lines.append(f"| {slots:,} | {2 * slots:,} | {mode} | {cell(r['total_s'])} | {cell(r['fence_s'])} | "
                         f"{cell(r['ledger_reads_s'])} | {cell(r['rest_s'])} | {vs_seq} | {vs_old} | {r['cpu_self_s']['median']:.2f} | "
                         f"{r['cpu_broker_s']['median']:.2f} | {r['threads_peak']['median']:.0f} |")
    lines += ["", "The fencing alone (what the pool changes), median s, and how many times faster than the sequential "
              "baseline and than pool-8:", "",
              "| slots | " + " | ".join(s["modes"]) + " | parallel-dense vs sequential | vs pool-8 |",
              "| ---: | " + " | ".join("---:" for _ in s["modes"]) + " | ---: | ---: |"]
    for slots in s["slots"]:
        row = summ.get(str(slots), {})
        fence = {k: v["fence_s"]["median"] for k, v in row.items()}
        est = {k for k, v in row.items() if v["total_s"].get("n") == 0}
        dense = fence.get("parallel-dense")
        ratios = [f"{fence[k] / dense:.0f}x{' (est.)' if k in est else ''}" if dense and k in fence else ""
                  for k in ("sequential", "pool-8")]
        lines.append(f"| {slots:,} | " + " | ".join(
            (f"~{fence[k]:.0f} (est.)" if k in est else f"{fence[k]:.2f}") if k in fence else "-"
            for k in s["modes"]) + f" | {ratios[0]} | {ratios[1]} |")
    lines += ["", "`vs sequential`, `vs pool-8`: how many times faster than that mode's median resolution. "
              "`ledger reads`: the P + 1 latest-record reads (every slot and the batch partition in one pass, "
              "`read_latest_many`); `rest`: the "
              "remainder (metadata, generation history, end offsets before and after the fences).", "",
              "Targets of the issue (resolution, the mode resolution uses here: parallel-dense; parallel: the same "
              "on a cluster of more than 3 brokers):", "", "| slots | target s | parallel-dense s | met | "
              "parallel s | met |", "| ---: | ---: | ---: | --- | ---: | --- |"]
    for slots, target in TARGETS.items():
        row = summ.get(str(slots), {})
        cells = []
        for mode in ("parallel-dense", "parallel"):
            r = row.get(mode)
            if r is None:
                cells += ["-", "not run"]
                continue
            t, worst = r["total_s"]["median"], r["total_s"]["max"]
            verdict = ("yes" if worst <= target else "median yes, slowest no" if t <= target else
                       f"no, {t - target:.1f} s over (x{t / target:.1f})")
            cells += [cell(r["total_s"]), verdict]
        lines.append(f"| {slots:,} | {target:g} | " + " | ".join(cells) + " |")
    lines += ["", "Every run, in order:", "",
              "| slots | mode | resolution s | fencing s | ledger reads s | rest s | CPU s self / broker | "
              "peak threads | rdk threads before → after | load before → after |",
              "| ---: | --- | ---: | ---: | ---: | ---: | --- | ---: | --- | --- |"]
    for r in res["runs"]:
        tag = " (warm-up)" if r.get("warmup") else ""
        lines.append(f"| {r['slots']:,} | {r['mode']}{tag} | {r['total_s']:.2f} | {r['fence_s']:.2f} | "
                     f"{r['ledger_reads_s']:.2f} | {r['rest_s']:.2f} | {r['cpu_self_s']} / {r['cpu_broker_s']} | {r['threads_peak']} | "
                     f"{r['rdk_threads_before_after'][0]} → {r['rdk_threads_before_after'][1]} | "
                     f"{r['load_before']} → {r['load_after']} |")
    return report.tail(lines, res)


# ------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slots", default="16,256,1024", help="slot counts, comma-separated")
    ap.add_argument("--repeats", type=int, default=3, help="measured runs per mode and slot count")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--sequential-max-slots", type=int, default=256,
                    help="run the sequential baseline up to this many slots; estimate it above")
    ap.add_argument("--timeout", type=float, default=900.0, help="resolution's timeout_s, seconds")
    ap.add_argument("--keep-topics", action="store_true", help="do not delete the benchmark's topics")
    report.add_results_args(ap, "fencing")
    a = ap.parse_args(argv)
    if a.render:
        return report.render(a.render, a.findings, markdown, summarize)
    modes = [m for m in a.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        ap.error(f"unknown modes {unknown}")
    stack = Stack()
    env = stack.read_env()
    if not env.get("KAFKA_BOOTSTRAP"):
        print("the local stack is not up: run `make stack-up` first", file=sys.stderr)
        return 2
    os.environ.update(env)
    bootstrap = env["KAFKA_BOOTSTRAP"]
    date = dt.date.today().isoformat()
    out_path = Path(a.out) if a.out else REPO / "benchmarks" / "results" / f"{date}-fencing.md"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    slot_counts = [int(x) for x in a.slots.split(",") if x]
    run_id = uuid.uuid4().hex[:6]
    argv_shown = argv if argv is not None else sys.argv[1:]
    res: dict = {"date": date, "machine": report.machine_info(), "load_avg_start": list(os.getloadavg()),
                 "command": " ".join(["python", "benchmarks/fencing.py", *map(shlex.quote, argv_shown)]),
                 "settings": {"slots": slot_counts, "repeats": a.repeats, "modes": modes,
                              "sequential_max_slots": a.sequential_max_slots, "timeout_s": a.timeout,
                              "pool_default": fencing.DEFAULT_POOL, "dense_max_brokers": fencing.DENSE_MAX_BROKERS}}
    runs: list[dict] = res.setdefault("runs", [])
    topics = Topics(bootstrap)
    timers = {"fence": Timed("fence_all"), "ledger": Timed("read_latest_many")}
    broker_pid = stack.running_pid("kafka")
    try:
        with tempfile.TemporaryDirectory(prefix="bench-fencing-") as tmp:
            for slots in slot_counts:
                say(f"{slots} slots: creating the stream's topics, ledger and checkpoint")
                config = make_stream(bootstrap, slots, run_id, Path(tmp), topics)
                r = run_once(config, "parallel-dense", timers, a.timeout, broker_pid)
                r["warmup"] = True
                runs.append(r)
                say(f"  warm-up: {r['total_s']:.2f}s")
                todo = [m for m in modes if m != "sequential" or slots <= a.sequential_max_slots]
                for rep in range(a.repeats):
                    for mode in todo[rep % len(todo):] + todo[:rep % len(todo)]:
                        r = run_once(config, mode, timers, a.timeout, broker_pid)
                        r["repeat"] = rep + 1
                        runs.append(r)
                        say(f"  {mode} #{rep + 1}: resolution {r['total_s']:.2f}s (fencing {r['fence_s']:.2f}s, "
                            f"ledger reads {r['ledger_reads_s']:.2f}s, rest {r['rest_s']:.2f}s), CPU {r['cpu_self_s']}s + broker {r['cpu_broker_s']}s, "
                            f"peak threads {r['threads_peak']}, rdk threads {r['rdk_threads_before_after']}, "
                            f"load {r['load_before']}")
        res["load_avg_end"] = list(os.getloadavg())
        summarize(res)
        report.add_findings(res, a.findings)
        text = markdown(res)
        out_path.write_text(text)
        say(f"results written to {out_path}")
        print("\n" + text.split("Every run, in order")[0])
    finally:
        if "summary" not in res and runs:
            partial = Path(tempfile.gettempdir()) / f"bench-fencing-{run_id}.json"
            partial.write_text(json.dumps(res, indent=1, default=str))
            say(f"partial results in {partial}")
        if not a.keep_topics:
            say("deleting the benchmark's topics")
            topics.delete_all()
        topics.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
