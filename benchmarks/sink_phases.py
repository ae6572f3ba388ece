"""The sink benchmark's throughput phase: per job shape, one table per producer setting.

For each shape (``sink_shapes``):

1. warm-up: a ``--warmup-records`` topic in the shape's format, run once by each sink under each producer
   setting (JIT, Python workers, the slot producers of each setting's stream);
2. input size: each measured run processes at least ``--records`` records or lasts at least
   ``--min-seconds``; the input holds ``--records``, unless the built-in sink (the faster), timed again on
   the warm-up topic (the rate of its batches), would pass ``--min-seconds`` with fewer: then that many ×
   ``SIZE_MARGIN`` (rounded up to 100,000). Every run says whether it met the bar (``qualifies``);
3. per producer setting, a table: ``--repeats`` runs of each sink over the whole input from a fresh
   checkpoint into a fresh output topic, alternating which sink goes first; each output read back
   read_committed (``shape.audit``; ours must be exactly once, the built-in sink must not lose anything)
   and then deleted; the load average before and after the table. Its summary (``sink_report.summarize``):
   the median and min–max of every figure and of the per-repeat ratio (repeat i of ours over repeat i of
   the built-in sink).
"""
from __future__ import annotations

import math
import os

from benchmarks.report import say
from benchmarks.sink_report import summarize
from benchmarks.sink_shapes import INPUT_PARTITIONS

SINKS = ("builtin", "ours")   # the default of --sinks; "jvm": ours with sink.writer jvm
SIZE_MARGIN = 1.2   # a long run's batches may go faster than a short run's (JIT, caches)


def phase_shape(bench, shape) -> dict:
    a = bench.args
    warm_topic = f"bench-warm-{shape.name}-{bench.run_id}"
    in_topic = f"bench-in-{shape.name}-{bench.run_id}"
    warm_n = min(a.records, a.warmup_records)
    bench.topics.create({warm_topic: INPUT_PARTITIONS, in_topic: INPUT_PARTITIONS})
    say(f"{shape.name}: {warm_n:,} warm-up records into {warm_topic}")
    shape.produce(bench.bootstrap, warm_topic, warm_n)
    warm: dict = {}
    for producer in a.producer:
        for sink in a.sinks:
            say(f"{shape.name}: warm-up of the {sink} sink ({producer} producers) on {warm_n:,} records")
            r = bench.throughput_run(shape, producer, sink, warm_topic, warm_n, f"warm-up {sink} {producer}")
            warm.setdefault(producer, {})[sink] = r
            say(f"  {r['records_per_s']:,} rec/s ({r['batches']} batches, median batch {r['batch_ms_median']} ms)")
            _drop_output(bench, r)
    n, sizing = input_size(bench, shape, warm_topic, warm_n)
    say(f"{shape.name}: producing {n:,} input records of ~{shape.record_bytes} bytes into {in_topic} (4 partitions)")
    produce_s = shape.produce(bench.bootstrap, in_topic, n)
    say(f"  done in {produce_s:.1f}s")
    est = sum(n / max(1, round(warm_n / max(w["trigger_ms_total"] / 1000, 1e-3)))
              for p in warm.values() for w in p.values()) * a.repeats
    say(f"{shape.name}: {len(a.producer)} tables × {a.repeats} repeats × 2 sinks of {n:,} records: about "
        f"{est / 60:.0f} min of runs at the warm-up rates, plus reading the outputs back")
    out = {"records": n, "sizing": sizing, "input_topic": in_topic, "produce_s": round(produce_s, 2),
           "warmup_records": warm_n, "warmup_topic": warm_topic, "warmup": warm, "tables": {}}
    for producer in a.producer:
        out["tables"][producer] = table(bench, shape, producer, in_topic, n)
    if not a.keep_topics:
        bench.topics.delete([in_topic] + ([] if a.breakdown and shape.name == "map" else [warm_topic]))
    return out


def input_size(bench, shape, warm_topic: str, warm_n: int) -> tuple[int, dict]:
    """Records per measured run: ``--records``, or fewer when the faster sink passes ``--min-seconds`` on them."""
    a = bench.args
    if a.min_seconds <= 0 or a.records <= warm_n:
        return a.records, {"rule": "records"}
    rates = {}
    for producer in a.producer:
        r = bench.throughput_run(shape, producer, "builtin", warm_topic, warm_n, f"timing builtin {producer}")
        _drop_output(bench, r)
        # its batches' rate: a long run spends a smaller share of its time starting and stopping the query
        rates[producer] = round(warm_n / max(r["trigger_ms_total"] / 1000, 1e-3))
    fastest = max(rates.values())
    timed = math.ceil(a.min_seconds * fastest * SIZE_MARGIN / 100_000) * 100_000
    n = min(a.records, timed)
    say(f"{shape.name}: the built-in sink ran {rates} rec/s on the warm-up topic: {a.min_seconds:.0f} s × "
        f"{SIZE_MARGIN} is {timed:,} records; measured runs process {n:,}")
    return n, {"rule": "records" if n == a.records else "min_seconds", "builtin_warm_rates": rates,
               "margin": SIZE_MARGIN, "records_for_min_seconds": timed}


def table(bench, shape, producer: str, in_topic: str, n: int) -> dict:
    a = bench.args
    say(f"== {shape.title}, {producer} producers: {a.repeats} repeats of each sink over {n:,} records")
    load_before = list(os.getloadavg())
    sinks = tuple(a.sinks)
    runs: dict[str, list[dict]] = {s: [] for s in sinks}
    order = []
    for rep in range(a.repeats):
        for sink in (sinks if rep % 2 == 0 else sinks[::-1]):
            order.append(sink)
            label = f"{shape.name} {producer} {sink} #{rep + 1}"
            say(f"repeat {rep + 1}/{a.repeats}: {shape.name}, {producer} producers, {sink} sink, {n:,} records")
            res = bench.throughput_run(shape, producer, sink, in_topic, n, label)
            res["load_avg_1m"] = os.getloadavg()[0]
            res["qualifies"] = n >= a.records or res["wall_s"] >= a.min_seconds
            cu = res["cpu_us_per_record"]
            say(f"  {sink}: {res['wall_s']:.2f}s = {res['records_per_s']:,} rec/s, CPU µs/record: "
                f"JVM {cu.get('jvm')}, Python workers {cu.get('python_workers')}, driver {cu.get('driver')}, "
                f"broker {cu.get('broker')}, rest of machine {cu.get('other')} ({res['batches']} batches, "
                f"median batch {res['batch_ms_median']} ms, {res['refence_warnings']} re-fences, "
                f"{res['task_failures']} failed tasks); reading the output back")
            res["audit"] = au = shape.audit(bench.bootstrap, res["output_topic"], n)
            say(f"  {sink} output (read_committed): {shape.summary(au)}")
            problem = shape.problem(sink, au)
            if problem:
                raise RuntimeError(f"{label}: the {sink} sink's output is wrong: {problem}")
            _drop_output(bench, res)
            runs[sink].append(res)
    summary = summarize(runs)
    th = summary["records_per_s"]
    say(f"== {shape.name}, {producer}: built-in {th['builtin']['median']:,.0f} rec/s, ours "
        f"{th['ours']['median']:,.0f} rec/s; ratio median {th['ratio']['median']:.3f} "
        f"(min {th['ratio']['min']:.3f}, max {th['ratio']['max']:.3f})")
    if "jvm" in runs:
        tj = summarize({"builtin": runs["builtin"], "ours": runs["jvm"]})["records_per_s"]
        say(f"== {shape.name}, {producer}: jvm writer {tj['ours']['median']:,.0f} rec/s; ratio to built-in median "
            f"{tj['ratio']['median']:.3f} (min {tj['ratio']['min']:.3f}, max {tj['ratio']['max']:.3f})")
    return {"producer": producer, "records": n, "order": order, "load_avg_before": load_before,
            "load_avg_after": list(os.getloadavg()), "runs": runs, "summary": summary}


def _drop_output(bench, res: dict) -> None:
    """A run's output topic (and its stream's ledger, if any) deleted: ten million records a run add up."""
    if not bench.args.keep_topics:
        out = res["output_topic"]
        bench.topics.delete([out] + [t for t in bench.topics.created if t.startswith(f"{out}.eos-ledger.")])
