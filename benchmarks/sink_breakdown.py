"""The sink benchmark's ``--breakdown``: the exactly-once write path cut after each step, next to the sink.

One run per variant over the same input (the map-only shape's warm-up topic, the first producer setting):
the built-in sink, the built-in sink after ``repartition(P, key)``, the probes of
``benchmarks/sink_probes.py`` (shuffle and Arrow to Python, a transaction per slot, ...) and the
exactly-once sink itself with its driver-side times (``DriverTimer``).
"""
from __future__ import annotations

import time

from benchmarks.report import say
from benchmarks.sink_meters import time_split


class DriverTimer:
    """Times the foreachBatch call on the driver and, inside it, the batch-complete write."""

    def __init__(self):
        self.calls: list[float] = []
        self.batch_complete: list[float] = []

    def wrap(self, writer):
        def each_batch(df, batch_id):
            t0 = time.perf_counter()
            try:
                writer(df, batch_id)
            finally:
                self.calls.append(time.perf_counter() - t0)
        return each_batch

    def __enter__(self):
        from eos_job import runtime
        self.orig = runtime.produce_sync

        def produce_sync(*a, **kw):
            t0 = time.perf_counter()
            try:
                return self.orig(*a, **kw)
            finally:
                self.batch_complete.append(time.perf_counter() - t0)
        runtime.produce_sync = produce_sync
        return self

    def __exit__(self, *exc):
        from eos_job import runtime
        runtime.produce_sync = self.orig
        return False

    def summary(self) -> dict:
        return {"foreach_batch_calls": len(self.calls), "foreach_batch_s": round(sum(self.calls), 2),
                "batch_complete_write_s": round(sum(self.batch_complete), 3)}


def probe_writer(bench, config, mode: str, stats: list):
    from eos_job.runtime import prepare_output

    from benchmarks.sink_probes import PROBE_SCHEMA, probe_task
    slots = config.spec.job.parallelism
    fn = probe_task(mode, bench.bootstrap, config.spec.sink.topic, f"bench-probe-{bench.run_id}")

    def each_batch(df, batch_id):
        rows = df.repartition(slots, "key").mapInArrow(fn, PROBE_SCHEMA).collect()
        stats.extend(r.asDict() for r in rows)

    df = prepare_output(bench.source_df(config))
    return (df.writeStream.foreachBatch(each_batch).outputMode("update")
            .option("checkpointLocation", config.checkpoint_dir).queryName(f"probe-{mode}-{bench.n_ckpt}"))


BREAKDOWN_VARIANTS = ("builtin", "builtin+repartition", "arrow", "tx", "tx-onlyerror", "ours")


def phase_breakdown(bench, shape, producer: str, in_topic: str, n: int) -> dict:
    """One run per variant over the same input: the exactly-once write path cut after each step
    (``benchmarks/sink_probes.py``), and the sink itself with its driver-side times."""
    tee = bench.tee
    kept = int(shape.kept(n).sum())
    out: dict[str, dict] = {}
    for v in BREAKDOWN_VARIANTS:
        say(f"breakdown: {v} on {n:,} records")
        topic = f"bench-out-probe-{bench.run_id}-{bench.n_ckpt + 1:03d}"
        bench.topics.create({topic: bench.args.parallelism})
        config = bench.config(shape, producer, in_topic, topic)
        stats: list[dict] = []
        before = tee.snapshot()
        if v.startswith("builtin"):
            dsw = bench.builtin_writer(config, producer, repartition=v == "builtin+repartition")
            res = bench.run_available_now(dsw, n, v)
        elif v == "ours":
            timer = DriverTimer()
            dsw, _ = bench.ours_writer(config, timer)
            with timer:
                res = bench.run_available_now(dsw, n, v)
            res["driver_timing"] = timer.summary()
            say(f"    driver: {res['driver_timing']}")
        else:
            dsw = probe_writer(bench, config, v, stats)
            res = bench.run_available_now(dsw, n, v)
        res["refence_warnings"] = tee.snapshot()["refence"] - before["refence"]
        res["task_failures"] = tee.snapshot()["lost_task"] - before["lost_task"]
        res["time_split"] = time_split(res)
        say(f"    time split: {res['time_split']}")
        if v == "ours":
            res["audit"] = au = shape.audit(bench.bootstrap, topic, n)
            if shape.problem("ours", au):
                raise RuntimeError(f"{v} wrote {au} for {n} input records: {shape.problem('ours', au)}")
        if stats:
            rows = sum(s["rows"] for s in stats)
            if rows != kept:
                raise RuntimeError(f"probe {v}: slots saw {rows} rows, expected {kept}")
            for k in ("t_recv", "t_convert", "t_produce", "t_commit"):
                res[f"{k}_s"] = round(sum(s[k] for s in stats), 2)  # summed over slot tasks
            res["python_workers"] = len({s["pid"] for s in stats})
        cu = res["cpu_us_per_record"]
        say(f"  {v}: {res['wall_s']:.2f}s = {res['records_per_s']:,} rec/s, CPU µs/record JVM {cu.get('jvm')} "
            f"Python {cu.get('python_workers')} driver {cu.get('driver')} broker {cu.get('broker')} "
            f"other {cu.get('other')}, median batch {res['batch_ms_median']} ms, "
            f"{res['refence_warnings']} re-fences, {res['task_failures']} failed tasks"
            + (f" (slot task seconds: recv {res['t_recv_s']}, convert {res['t_convert_s']}, "
               f"produce {res['t_produce_s']}, flush/commit {res['t_commit_s']})" if stats else ""))
        out[v] = res
    return out

