#!/usr/bin/env python3
"""A/B: a test-sized driver's CPU with the JVM's default JIT against C1 only (``-XX:TieredStopAtLevel=1``).

Why: ``make test`` is bound by its two cores, and most of its CPU is Spark driver JVMs that live seconds to
minutes and run batches of a few hundred records. ``tests/conftest.py`` starts the tests' drivers with C1 only
(``SPARK_SUBMIT_OPTS``); this benchmark is the measurement behind that choice (docs/testing.md).

Each round runs one driver of the unique-id job (``examples.colors.ids``, two slots, the stack's broker) per
variant, alternating: 1,000 ids backlog, start, two committed batches (``startup``: CPU seconds of the driver's
process tree: the Python driver, its JVM, PySpark's workers), then a trickle of 50 ids a second for
``--seconds`` (``steady``: CPU seconds per committed batch and cores used). Reported: medians with min-max per
variant and the C1/default ratio of the medians.

Run: ``.venv/bin/python benchmarks/driver_jit.py --rounds 3 --out benchmarks/results/<date>-driver-jit.md``
(the stack must be up: ``make stack-up``).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for _p in (REPO / "stack", REPO / "jobs", REPO):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from benchmarks import procstat  # noqa: E402
from benchmarks.report import machine_info, say, write_results  # noqa: E402

VARIANTS = {"default": "", "c1-only": "-XX:TieredStopAtLevel=1"}


def tree_cpu(root: int) -> float:
    ps = procstat.procs()
    return sum(ps[p][2] for p in procstat.tree(procstat.children(ps), root) if p in ps)


def one_driver(bootstrap: str, opts: str, seconds: float, workdir: Path) -> dict:
    from examples.colors.local_run import ColorsRun
    from tests.e2e.streams import IdFeed
    os.environ["SPARK_SUBMIT_OPTS"] = opts
    run = ColorsRun(bootstrap=bootstrap, workdir=workdir, module="examples.colors.ids", trigger_interval_ms=2000,
                    max_offsets_per_trigger=600)
    run.setup()
    feed = IdFeed(run.bootstrap, run.events, chunk=50, pause=1.0)
    feed.send(1000, -1, 1_000_000)
    t0 = time.monotonic()
    run.start()
    try:
        run.wait_for_batches(2, timeout=300)
        startup_cpu, startup_s = tree_cpu(run.proc.pid), time.monotonic() - t0
        feed.start()
        b0, c0, m0 = run.committed_batches(), tree_cpu(run.proc.pid), time.monotonic()
        time.sleep(seconds)
        b1, c1, m1 = run.committed_batches(), tree_cpu(run.proc.pid), time.monotonic()
    finally:
        feed.stop_flag.set()
        run.kill9()
    return {"startup_cpu_s": round(startup_cpu, 2), "startup_wall_s": round(startup_s, 2),
            "steady_batches": b1 - b0, "steady_cpu_per_batch_s": round((c1 - c0) / max(b1 - b0, 1), 3),
            "steady_cores": round((c1 - c0) / (m1 - m0), 3), "load": os.getloadavg()}


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def markdown(res: dict) -> str:
    rows = (("driver start to two committed batches, CPU-s", "startup_cpu_s"),
            ("driver start to two committed batches, wall s", "startup_wall_s"),
            ("a trickle batch (about 100 records), CPU-s", "steady_cpu_per_batch_s"),
            ("cores used under the trickle", "steady_cores"))
    out = [f"# A test-sized driver's CPU: default JIT against C1 only, {res['date']}", "",
           f"`{res['command']}` on the local stack: {res['rounds']} rounds, variants alternating. "
           f"Machine: {res['machine']['cores']} cores ({res['machine']['cpu']}), shared with other work "
           "(load averages in the raw results). Medians (min-max).", "",
           "| measure | default | C1 only | C1 / default |", "|---|---|---|---|"]
    for title, key in rows:
        d = [r[key] for r in res["runs"]["default"]]
        c = [r[key] for r in res["runs"]["c1-only"]]
        out.append(f"| {title} | {med(d)} | {med(c)} | {statistics.median(c) / statistics.median(d):.2f} |")
    out += ["", "## Raw results", "", "```json", json.dumps(res, indent=1), "```", ""]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=30, help="the trickle's measured window per driver")
    ap.add_argument("--out", help="results file (default benchmarks/results/<date>-driver-jit.md)")
    a = ap.parse_args(argv)
    from eos_stack.common import Stack
    env = Stack().read_env()
    if not env.get("KAFKA_BOOTSTRAP"):
        raise SystemExit("the stack is not up: run `make stack-up` first")
    os.environ.update(env)
    res = {"date": dt.date.today().isoformat(), "command": "python benchmarks/driver_jit.py " + " ".join(argv or sys.argv[1:]),
           "rounds": a.rounds, "machine": machine_info(), "runs": {v: [] for v in VARIANTS}}
    base = Path(tempfile.mkdtemp(prefix="driver-jit-", dir=os.environ.get("EOS_STATE", REPO / ".stack")))
    for r in range(a.rounds):
        for name, opts in VARIANTS.items():
            say(f"round {r + 1}/{a.rounds}: {name}")
            m = one_driver(env["KAFKA_BOOTSTRAP"], opts, a.seconds, base / f"{name}-{r}")
            res["runs"][name].append(m)
            say(f"  {m}")
    write_results(res, "driver-jit", markdown, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
