#!/usr/bin/env python3
"""Sink benchmark: Spark's built-in Kafka sink (at-least-once) against the exactly-once sink, fairly (issue 15).

Both sinks run the same job over the same input, in ONE process and ONE SparkSession (warm JVM, same
Python workers), with the same parallelism and the same ``maxOffsetsPerTrigger``, for two job shapes
(``--shapes``, ``sink_shapes``): map-only (filter + project, ``benchmarks/map_only.py``) and stateful
(the colors count, ``examples/colors/job.py``), and two producer settings (``--producer``): ``tuned``,
the same linger.ms, batch size, compression and acks for Spark's kafka-clients producer and our
librdkafka producers, and ``default``, neither set. Ratios, not absolute numbers, are the result: the
machine is small and shared.

Phases:

1. Throughput (``sink_phases``), per shape: warm-ups, the input sized so that every measured run
   processes at least ``--records`` records or lasts at least ``--min-seconds``, then per producer
   setting ``--repeats`` runs of each sink with ``trigger(availableNow=True)`` from a fresh checkpoint
   into a fresh output topic, alternating which sink goes first; every output read back read_committed.
   The median and min–max of every figure (records/s, wall time, CPU µs per record by process, where the
   time goes) and of the per-repeat ratio; the load average before and after each table.
2. Breakdown (only with ``--breakdown``, ``sink_breakdown``): the exactly-once write path cut after
   each step, on the map-only warm-up topic.
3. Latency (``sink_latency``), per shape and each of ``--rates``: produce to read_committed visibility
   with a processingTime trigger of ``--trigger-ms``; p50/p99/max per sink and whether p99 is within
   the trigger + 1 s.

Besides wall time, each run records the CPU time of the driver, the JVM, the Python workers and the
broker (from /proc, ``sink_meters``), Spark's stage timings (from the event log) and the failed tasks and
re-fences seen on stderr.

Results (``sink_report``): markdown with the settings, the machine and the producer settings, a table per
producer setting and shape, the latency table, and the JSON of every measurement, in
``benchmarks/results/<date>-sink-fair.md`` (or ``--out``); ``--render FILE --findings NOTES.md`` adds notes
to a results file.

Run: ``make bench`` (the full measurement; ``BENCH_ARGS`` adds options), or ``--quick`` for a smoke run:
``.venv/bin/python benchmarks/sink_throughput.py --quick --out /tmp/sink-quick.md``.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for _p in (REPO / "stack", REPO / "jobs", REPO):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))
# Python workers inherit this: they import eos_job (the slot task), the job modules and benchmarks.sink_probes.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(REPO), str(REPO / "jobs"), str(REPO / "stack")] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))

from benchmarks import report  # noqa: E402
from benchmarks.report import say  # noqa: E402
from benchmarks.sink_report import markdown  # noqa: E402
from benchmarks.sink_shapes import DEFAULTS, INPUT_PARTITIONS, SHAPES, producers  # noqa: E402

QUICK = {"records": 100_000, "min_seconds": 0.0, "repeats": 1, "seconds": 5.0, "latency_warmup": 2.0,
         "warmup_records": 50_000}


def _csv(kind, choices=None):
    def parse(text: str) -> list:
        items = [kind(x.strip()) for x in text.split(",") if x.strip()]
        bad = [x for x in items if choices and x not in choices]
        if not items or bad:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {sorted(choices or [])}")
        return list(dict.fromkeys(items))
    return parse


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", type=_csv(str, SHAPES), default=list(SHAPES), help="job shapes: map,stateful")
    ap.add_argument("--producer", type=_csv(str, ("tuned", "default")), default=["tuned", "default"],
                    help="producer settings, one throughput table each: tuned,default (latency: the first)")
    ap.add_argument("--records", type=int, default=10_000_000,
                    help="a measured run processes at least this many records ... (default 10,000,000)")
    ap.add_argument("--min-seconds", type=float, default=60,
                    help="... or lasts at least this long (the input is sized for the faster sink; 0: always "
                         "--records)")
    ap.add_argument("--repeats", type=int, default=5, help="measured runs per sink and table (alternating order)")
    ap.add_argument("--warmup-records", type=int, default=300_000, help="records of each warm-up run")
    ap.add_argument("--max-offsets", type=int, default=100_000, help="maxOffsetsPerTrigger of both sinks")
    ap.add_argument("--parallelism", type=int, default=2,
                    help="slots = output partitions = shuffle partitions (the session is local[*,4])")
    ap.add_argument("--linger-ms", type=int, default=5, help="tuned producers: linger.ms of both sinks")
    ap.add_argument("--batch-bytes", type=int, default=262_144, help="tuned producers: batch.size of both sinks")
    ap.add_argument("--compression", default="lz4", choices=["none", "gzip", "snappy", "lz4", "zstd"],
                    help="tuned producers: compression.type of both sinks")
    ap.add_argument("--rates", type=_csv(int), default=[5000, 50000], help="latency phase: records/s, each")
    ap.add_argument("--seconds", type=float, default=30, help="latency phase: measured seconds per sink and rate")
    ap.add_argument("--latency-warmup", type=float, default=5, help="latency phase: seconds not counted")
    ap.add_argument("--trigger-ms", type=int, default=500, help="processingTime trigger of the latency phase")
    ap.add_argument("--skip", action="append", default=[], choices=["throughput", "latency"],
                    help="skip a phase (repeatable)")
    ap.add_argument("--breakdown", action="store_true",
                    help="also profile the map-only write path step by step (on its warm-up records)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 100,000 records, 1 repeat, 5 s latency (explicit options still win)")
    ap.add_argument("--keep-topics", action="store_true", help="do not delete the benchmark's topics")
    ap.add_argument("--map-slots", choices=["sourcePartitions", "key"], default="sourcePartitions",
                    help="the map-only job's job.slotsFrom (the stateful job's is always key): sourcePartitions, one "
                         "slot per input partition and no shuffle (what a map-only stream sets), or key")
    ap.add_argument("--no-audit-headers", action="store_true",
                    help="the exactly-once sink without its per-record audit headers (sink.auditHeaders: false)")
    ap.add_argument("--sinks", type=_csv(str, ("builtin", "ours", "jvm")), default=["builtin", "ours"],
                    help="sinks measured, alternating: builtin,ours[,jvm] (jvm: ours with sink.writer jvm, the JVM "
                         "slot writer; it takes no producerConfig, so only with --producer default)")
    report.add_results_args(ap, "sink-fair")
    a = ap.parse_args(argv)
    if "jvm" in a.sinks and "tuned" in a.producer:
        ap.error("--sinks jvm needs --producer default: sink.writer jvm takes no sink.producerConfig")
    if a.sinks[:2] != ["builtin", "ours"]:
        ap.error("--sinks starts with builtin,ours (the ratios are to the built-in sink)")
    if a.quick:
        given = {x.split("=")[0].lstrip("-").replace("-", "_") for x in (argv if argv is not None else sys.argv[1:])}
        for k, v in QUICK.items():
            if k not in given:
                setattr(a, k, v)
    return a


def settings(a, prods: dict) -> dict:
    return {"records": a.records, "min_seconds": a.min_seconds, "repeats": a.repeats,
            "warmup_records": a.warmup_records, "parallelism": a.parallelism, "input_partitions": INPUT_PARTITIONS,
            "output_partitions": a.parallelism, "max_offsets_per_trigger": a.max_offsets,
            "trigger_ms": a.trigger_ms, "rates": a.rates, "seconds": a.seconds, "latency_warmup_s": a.latency_warmup,
            "linger_ms": a.linger_ms, "batch_bytes": a.batch_bytes, "compression": a.compression,
            "producers": {p: prods[p] for p in a.producer}, "producer_defaults": DEFAULTS, "quick": a.quick,
            "audit_headers": not a.no_audit_headers, "map_slots": a.map_slots, "sinks": a.sinks,
            "shapes": {n: {"title": SHAPES[n].title, "describe": SHAPES[n].describe,
                           "record_bytes": SHAPES[n].record_bytes} for n in a.shapes},
            "spark_master": "?"}


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.render:
        return report.render(a.render, a.findings, markdown)

    from benchmarks.sink_bench import Bench, machine_info, stack_env
    from benchmarks.sink_breakdown import phase_breakdown
    from benchmarks.sink_latency import phase_latency
    from benchmarks.sink_meters import StderrTee
    from benchmarks.sink_phases import phase_shape

    bootstrap, _ = stack_env()
    date = dt.date.today().isoformat()
    default_out = (Path(tempfile.gettempdir()) / f"{date}-sink-fair-quick.md" if a.quick
                   else REPO / "benchmarks" / "results" / f"{date}-sink-fair.md")
    out_path = Path(a.out) if a.out else default_out
    out_path.parent.mkdir(parents=True, exist_ok=True)
    prods = producers(a.linger_ms, a.batch_bytes, a.compression)
    bench = Bench(a, bootstrap, prods)
    bench.load_start = list(os.getloadavg())
    tee = bench.tee = StderrTee(bench.work / "stderr.log")
    shapes = [SHAPES[n] for n in a.shapes]
    say(f"sink benchmark {bench.run_id}: Kafka at {bootstrap}, work dir {bench.work}; shapes {a.shapes}, "
        f"producers {a.producer}")
    res: dict = {"format": 2, "date": date, "run_id": bench.run_id, "settings": settings(a, prods),
                 "command": "benchmarks/sink_throughput.py" + "".join(
                     f" {shlex.quote(x)}" for x in (argv if argv is not None else sys.argv[1:]))}
    try:
        say("starting the SparkSession")
        bench.session(shapes[0], a.producer[0])
        res["machine"] = machine_info(bench)
        res["settings"]["spark_master"] = bench.spark.sparkContext.master
        if "throughput" not in a.skip:
            res["throughput"] = {}
            for shape in shapes:
                res["throughput"][shape.name] = phase_shape(bench, shape)
            if a.breakdown and "map" in res["throughput"]:
                t = res["throughput"]["map"]
                res["breakdown"] = phase_breakdown(bench, SHAPES["map"], a.producer[0], t["warmup_topic"],
                                                   t["warmup_records"])
        if "latency" not in a.skip:
            res["latency"] = phase_latency(bench, shapes, a.producer[0])
        res["machine"]["load_avg_end"] = list(os.getloadavg())
        res["stderr"] = {"counts": tee.snapshot(), "samples": tee.samples}
        report.add_findings(res, a.findings)
        text = markdown(res)
        out_path.write_text(text)
        say(f"results written to {out_path}")
        print()
        print(text.split("## Raw results")[0])
        return 0
    finally:
        if bench.spark is not None:
            for q in bench.spark.streams.active:
                q.stop()
        if not a.keep_topics:
            say("deleting the benchmark's topics")
            bench.topics.delete_all()
        bench.topics.close()
        for d in bench.work.glob("run*"):
            shutil.rmtree(d, ignore_errors=True)
        say(f"stderr of the run (JVM, Python workers) kept in {bench.work / 'stderr.log'}")


if __name__ == "__main__":
    sys.exit(main())
