"""The sink benchmark's summaries and results file (markdown, from the dict of measurements).

``summarize``: per figure of a table's runs, the median and min–max of each sink and of the per-repeat
ratio ours / built-in (repeat i with repeat i). ``markdown``: settings and machine, the producer settings,
a throughput table per producer setting and shape, the latency table, the breakdown if any, findings and
the raw JSON (``report.tail``). Results files of the one-shape benchmark (before 2026-11-25) are rendered by
``sink_report_v1``.
"""
from __future__ import annotations

import statistics

from benchmarks import report


def _cpu(k: str):
    def get(r):
        cu = r.get("cpu_us_per_record") or {}
        if k == "spark+broker":
            return round(cu["spark"] + cu["broker"], 2) if "spark" in cu else None
        return cu.get(k)
    return get


def _split(k: str, stage: str | None = None):
    def get(r):
        st = r.get("stages") or {}
        if k == "batches_s":
            return round(r["trigger_ms_total"] / 1000, 2)
        if k == "spark_jobs_s":
            return st.get("jobs_wall_s")
        if k == "batch_outside_jobs_s":
            return round(r["trigger_ms_total"] / 1000 - st["jobs_wall_s"], 2) if "jobs_wall_s" in st else None
        return (st.get(stage) or {}).get(k)
    return get


# key, label, value of a run, whether the ratio ours / built-in means something
FIGURES = (
    ("records_per_s", "throughput, records/s", lambda r: r["records_per_s"], True),
    ("wall_s", "wall time, s", lambda r: r["wall_s"], True),
    ("cpu_spark_broker", "CPU µs per record: Spark (driver + JVM + Python workers) + broker", _cpu("spark+broker"),
     True),
    ("cpu_jvm", "CPU µs per record: JVM", _cpu("jvm"), True),
    ("cpu_python_workers", "CPU µs per record: Python workers", _cpu("python_workers"), False),
    ("cpu_driver", "CPU µs per record: driver Python", _cpu("driver"), False),
    ("cpu_broker", "CPU µs per record: Kafka broker", _cpu("broker"), True),
    ("cpu_other", "CPU µs per record: rest of the machine (noise)", _cpu("other"), False),
    ("batch_ms_median", "median micro-batch, ms", lambda r: r.get("batch_ms_median"), True),
    ("batches_s", "wall s: micro-batches (sum of triggerExecution)", _split("batches_s"), True),
    ("spark_jobs_s", "wall s: Spark jobs", _split("spark_jobs_s"), True),
    ("batch_outside_jobs_s", "wall s: batch time outside Spark jobs (planning, offsets, state and commit logs, "
                             "foreachBatch driver work)", _split("batch_outside_jobs_s"), True),
    ("map_stages_s", "wall s: shuffle-map stages", _split("wall_s", "map"), False),
    ("result_stages_s", "wall s: result stages (built-in: write; ours: slot tasks)", _split("wall_s", "result"), True),
    ("result_task_run_s", "s: result tasks' run time, summed over tasks", _split("task_run_s", "result"), True),
)


def spread(xs: list) -> dict | None:
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3)}


def summarize(runs: dict[str, list[dict]]) -> dict:
    out = {}
    for key, _label, get, with_ratio in FIGURES:
        b, o = [get(r) for r in runs["builtin"]], [get(r) for r in runs["ours"]]
        ratios = [y / x for x, y in zip(b, o) if x and y is not None] if with_ratio else []
        out[key] = {"builtin": spread(b), "ours": spread(o), "ratio": spread(ratios)}
    return out


def _fmt(v: float) -> str:
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.2f}"


def _cell(s: dict | None, ratio: bool = False) -> str:
    if not s:
        return "-"
    f = (lambda v: f"{v:.2f}") if ratio else _fmt
    if s["min"] == s["max"]:
        return f(s["median"])
    return f"{f(s['median'])} ({f(s['min'])}–{f(s['max'])})"


def _load(before: list, after: list) -> str:
    return (f"load average (1, 5, 15 min) before {', '.join(f'{x:.1f}' for x in before)}; "
            f"after {', '.join(f'{x:.1f}' for x in after)}")


def _throughput_table(s: dict, shape: dict, t: dict) -> list[str]:
    runs = t["runs"]
    n_rep = len(runs["ours"])
    qual = sum(1 for k in runs for r in runs[k] if r.get("qualifies", True))
    lines = [f"### {shape['title']}", "",
             f"{t['records']:,} records per run, {n_rep} repeats of each sink, alternating which runs first "
             f"(order: {', '.join({'builtin': 'b', 'jvm': 'j'}.get(x, 'o') for x in t['order'])}); {qual} of "
             f"{len(runs) * n_rep} runs "
             f"met ≥ {s['records']:,} records or ≥ {s['min_seconds']:.0f} s; "
             f"{_load(t['load_avg_before'], t['load_avg_after'])}.", "",
             "| measure: median (min–max) | built-in (at-least-once) | exactly-once (ours) "
             "| ours / built-in, per repeat |", "| --- | ---: | ---: | ---: |"]
    summ = summarize(runs)
    for key, label, _get, with_ratio in FIGURES:
        f = summ[key]
        if f["builtin"] is None and f["ours"] is None:
            continue
        lines.append(f"| {label} | {_cell(f['builtin'])} | {_cell(f['ours'])} | "
                     f"{_cell(f['ratio'], ratio=True) if with_ratio else ''} |")
    rf = {k: (sum(r.get("refence_warnings", 0) for r in runs[k]), sum(r.get("task_failures", 0) for r in runs[k]))
          for k in runs}
    lines.append(f"| slot re-fences / failed tasks, all runs | {rf['builtin'][0]} / {rf['builtin'][1]} | "
                 f"{rf['ours'][0]} / {rf['ours'][1]} | |")
    for k in ("builtin", "ours"):
        t[f"_w_{k}"] = ", ".join(f"{r['wall_s']:.1f}" for r in runs[k])
    lines.append(f"| all runs' wall time, s, in order | {t.pop('_w_builtin')} | {t.pop('_w_ours')} | |")
    if runs.get("jvm"):
        lines += ["", "The JVM slot writer (`sink.writer: jvm`), measured in the same repeats:", "",
                  "| measure: median (min–max) | built-in (at-least-once) | exactly-once, JVM writer "
                  "| jvm / built-in, per repeat |", "| --- | ---: | ---: | ---: |"]
        summ = summarize({"builtin": runs["builtin"], "ours": runs["jvm"]})
        for key, label, _get, with_ratio in FIGURES:
            f = summ[key]
            if f["builtin"] is not None or f["ours"] is not None:
                lines.append(f"| {label} | {_cell(f['builtin'])} | {_cell(f['ours'])} | "
                             f"{_cell(f['ratio'], ratio=True) if with_ratio else ''} |")
        walls = ", ".join(f"{r['wall_s']:.1f}" for r in runs["jvm"])
        lines.append(f"| all runs' wall time, s, in order | | {walls} | |")
    return lines


def _summary(s: dict, th: dict) -> list[str]:
    lines = ["## Summary", "", "Median (min–max) over the repeats; the ratio is ours / built-in of the same repeat "
             "(issue 15's target: throughput ratio ≥ 0.9 for the map-only job).", "",
             "| shape | producers | built-in records/s | ours records/s | throughput ratio | CPU µs/record "
             "(Spark + broker) ratio |", "| --- | --- | ---: | ---: | ---: | ---: |"]
    for name, shp in th.items():
        for p, t in (shp.get("tables") or {}).items():
            f = summarize(t["runs"])
            lines.append(f"| {s['shapes'][name]['title']} | {p} | {_cell(f['records_per_s']['builtin'])} | "
                         f"{_cell(f['records_per_s']['ours'])} | {_cell(f['records_per_s']['ratio'], True)} | "
                         f"{_cell(f['cpu_spark_broker']['ratio'], True)} |")
            if t["runs"].get("jvm"):
                j = summarize({"builtin": t["runs"]["builtin"], "ours": t["runs"]["jvm"]})
                lines.append(f"| {s['shapes'][name]['title']} | {p}, **jvm writer** | "
                             f"{_cell(j['records_per_s']['builtin'])} | {_cell(j['records_per_s']['ours'])} | "
                             f"{_cell(j['records_per_s']['ratio'], True)} | {_cell(j['cpu_spark_broker']['ratio'], True)} |")
    return lines


def _latency_table(s: dict, lat: dict) -> list[str]:
    target = s["trigger_ms"] + 1000
    lines = ["## Latency", "",
             f"Produce to read_committed visibility, {s['latency_warmup_s']:.0f} s warm-up (not counted) + "
             f"{s['seconds']:.0f} s at each rate, processingTime trigger {s['trigger_ms']} ms, "
             f"{lat['producer']} producers; target p99 ≤ trigger + 1 s = {target} ms. Stateful: a record is "
             "visible with the first count update of its color that counts it. "
             f"{_load(lat['load_avg_before'], lat['load_avg_after'])}.", "",
             "| shape | rate, rec/s | sink | p50 ms | p99 ms | max ms | p99 ≤ "
             f"{target} ms | median batch ms | records counted / missing / duplicates | producer lag max s "
             "| load before → after |",
             "| --- | ---: | --- | ---: | ---: | ---: | --- | ---: | --- | ---: | --- |"]
    for shape in (k for k in lat if isinstance(lat[k], dict)):
        for rate, pair in lat[shape].items():
            for sink in ("builtin", "ours"):
                r = pair.get(sink)
                if not r:
                    continue
                ok = "yes" if r.get("p99_within_target") else f"no (+{r['p99_ms'] - target:.0f} ms)" \
                    if r.get("p99_ms") is not None else "no data"
                ge = "≥ " if r.get("lower_bound") else ""   # records still not visible when the wait ended
                lines.append(f"| {shape} | {int(rate):,} | {'built-in' if sink == 'builtin' else 'ours'} | "
                             f"{ge}{r.get('p50_ms', '-')} | {ge}{r.get('p99_ms', '-')} | {ge}{r.get('max_ms', '-')} | "
                             f"{ok} | "
                             f"{r.get('batch_ms_median')} | {r['counted']:,} / {r['missing_counted']} / "
                             f"{r['duplicates']} | {r['producer_max_lag_s']} | "
                             f"{pair['load_avg_before'][0]:.1f} → {pair['load_avg_after'][0]:.1f} |")
    return lines


def _counters_row(where: str, stats: list[dict]) -> str:
    t = {k: sum(x.get(k, 0) for x in stats) for k in ("batches", "tasks", "whole_skips", "pool_hits", "new_producers",
                                                     "stale_producers", "fences", "ledger_reads", "fence_ms",
                                                     "ledger_ms", "commit_ms", "trusted", "trusted_fallbacks")}
    tasks = max(t["tasks"], 1)
    per = (lambda ms, n: f"{t[ms] / t[n]:.1f}" if t[n] else "-")
    return (f"| {where} | {len(stats)} | {t['batches']:,} | {t['tasks']:,} | {t['pool_hits']:,} "
            f"({100 * t['pool_hits'] / tasks:.0f} %) | {t['new_producers']:,} | {t['stale_producers']:,} | "
            f"{t['trusted']:,} | {t['trusted_fallbacks']:,} | "
            f"{t['fences']:,} | {t['ledger_reads']:,} | {per('fence_ms', 'fences')} | {per('ledger_ms', 'ledger_reads')} "
            f"| {t['commit_ms'] / max(t['tasks'] - t['whole_skips'], 1):.1f} |")


def _counters_table(res: dict) -> list[str]:
    """The exactly-once sink's slot task counters (eos_job.slot_stats), summed over each table's runs."""
    rows = []
    for name, shp in (res.get("throughput") or {}).items():
        for p, t in (shp.get("tables") or {}).items():
            stats = [r["slot_stats"] for r in t["runs"]["ours"] if r.get("slot_stats")]
            if stats:
                rows.append(_counters_row(f"throughput, {name}, {p}", stats))
    lat = res.get("latency") or {}
    for shape in (k for k in lat if isinstance(lat[k], dict)):
        for rate, pair in lat[shape].items():
            if (pair.get("ours") or {}).get("slot_stats"):
                rows.append(_counters_row(f"latency, {shape}, {int(rate):,}/s", [pair["ours"]["slot_stats"]]))
    if not rows:
        return []
    return ["## Slot tasks (exactly-once sink)", "",
            "What the slot tasks did besides writing, counted by each task and summed by the driver "
            "(`eos_job.slot_stats`), over all runs of a table. A pool hit: the task's Python worker held the slot's "
            "producer, clean since its last commit, and trusted it (no fence, no ledger read: amendment A2); "
            "fell back: a trusted transaction that failed (another worker had fenced the id) and fenced and read "
            "again; otherwise the task made a producer and fenced (`init_transactions`); stale: a held producer "
            "not clean (or of another key or epoch), fenced again. Runs before A2 show no trusted tasks. The ms columns "
            "are wall time per fence, per ledger read, and in `commit_transaction` per writing task.", "",
            "| runs | n | batches | slot tasks | pool hits | new producers | stale | trusted | fell back | fences | "
            "ledger reads | ms per fence | ms per ledger read | commit ms per task |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"] + rows


def _breakdown(bd: dict) -> list[str]:
    lines = ["## Breakdown (map-only, `--breakdown`)", "",
             "One run per variant over the map-only warm-up topic; the probes (`benchmarks/sink_probes.py`) cut "
             "the exactly-once write path after each step.", "",
             "| variant | records/s | CPU µs/rec Spark+broker | of which JVM | Python workers | median batch ms "
             "| recv (shuffle + Arrow) s | convert s | produce loop s | flush/commit s |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for v, r in bd.items():
        cu = r.get("cpu_us_per_record") or {}
        sb = round(cu["spark"] + cu["broker"], 2) if cu else ""
        lines.append(f"| {v} | {r['records_per_s']:,} | {sb} | {cu.get('jvm', '')} | {cu.get('python_workers', '')} "
                     f"| {r['batch_ms_median']} | {r.get('t_recv_s', '')} | {r.get('t_convert_s', '')} | "
                     f"{r.get('t_produce_s', '')} | {r.get('t_commit_s', '')} |")
    dr = (bd.get("ours") or {}).get("driver_timing")
    if dr:
        lines += ["", f"Driver side of `ours`: {dr['foreach_batch_calls']} foreachBatch calls took "
                  f"{dr['foreach_batch_s']} s, of which {dr['batch_complete_write_s']} s batch-complete writes."]
    return lines


def markdown(res: dict) -> str:
    if res.get("format") != 2:
        from benchmarks import sink_report_v1
        return sink_report_v1.markdown(res)
    m, s = res["machine"], res["settings"]
    lines = [f"# Sink benchmark, fair comparison {res['date']}", "",
             "Spark's built-in Kafka sink (`format(\"kafka\")`, at-least-once) against the exactly-once sink "
             "(`BatchWriter` via foreachBatch): same job, same input, same SparkSession, same parallelism and "
             "maxOffsetsPerTrigger, for two job shapes and two producer settings. Produced by "
             f"`{res.get('command', 'benchmarks/sink_throughput.py')}`.", "",
             f"Machine: {m['cores']} cores ({m['cpu']}), {m['ram_gb']} GB RAM, shared (load average "
             f"{m['load_avg_start'][0]:.1f} at start, {m['load_avg_end'][0]:.1f} at end); Python {m['python']}, "
             f"PySpark {m['pyspark']} (`{s['spark_master']}`), Kafka broker {m['kafka_broker']} (single node, "
             f"same machine), Spark's kafka-clients {m['kafka_clients_jar']}, confluent-kafka "
             f"{m['confluent_kafka']} (librdkafka {m['librdkafka']}), pyarrow {m['pyarrow']}.", "",
             f"Settings: each measured run processes at least {s['records']:,} records or lasts at least "
             f"{s['min_seconds']:.0f} s (input sized per shape, below); {s['input_partitions']} input partitions, "
             f"parallelism {s['parallelism']} ({s['output_partitions']} output partitions / slots), "
             f"maxOffsetsPerTrigger {s['max_offsets_per_trigger']:,}, {s['repeats']} alternating repeats after a "
             f"{s['warmup_records']:,}-record warm-up of each sink under each producer setting; every output read "
             "back read_committed (ours: exactly once; built-in: nothing lost) and deleted. Ratios are ours / "
             "built-in of the same repeat. "
             + (f"The map-only job's exactly-once sink cuts its slots by source partition (`job.slotsFrom: "
                f"sourcePartitions`: {max(s['parallelism'], s['input_partitions'])} slots, one per input partition, "
                "no shuffle); the stateful job's by key. " if s.get("map_slots") == "sourcePartitions" else "")
             + "The exactly-once sink "
             + ("labels every record with its batch and slot (audit headers, the default)"
                if s.get("audit_headers", True) else "writes **no audit headers** (`sink.auditHeaders: false`)")
             + ".", "", "Job shapes:", ""]
    for name, sh in s["shapes"].items():
        lines.append(f"* **{name}**, {sh['title']}: {sh['describe']}.")
    lines += ["", "Producer settings:", ""]
    for p, conf in s["producers"].items():
        if p == "default":
            lines.append(f"* **default**: nothing set. Built-in: {s['producer_defaults']['builtin']}. Ours: "
                         f"{s['producer_defaults']['ours']}.")
        else:
            lines.append(f"* **{p}**: linger.ms {s['linger_ms']}, batch size {s['batch_bytes']:,} bytes, "
                         f"compression {s['compression']}, acks all. Built-in sink options: "
                         + ", ".join(f"`{k}={v}`" for k, v in conf["builtin"].items())
                         + "; ours, `sink.producerConfig`: " + ", ".join(f"`{k}={v}`" for k, v in conf["ours"].items())
                         + " (the runtime adds acks all, enable.idempotence true, transactions).")
    th = res.get("throughput") or {}
    if th:
        lines += [""] + _summary(s, th)
    for p in s["producers"]:
        if not any(p in (th[sh].get("tables") or {}) for sh in th):
            continue
        lines += ["", f"## Throughput, {p} producers", ""]
        for name, shp in th.items():
            if p in shp.get("tables", {}):
                sz = shp["sizing"]
                how = ("--records" if sz.get("rule") != "min_seconds" else
                       f"{s['min_seconds']:.0f} s of the built-in sink at its batches' rate on the warm-up topic, "
                       f"{max(sz['builtin_warm_rates'].values()):,} rec/s, × {sz['margin']}")
                lines += _throughput_table(s, {**s["shapes"][name], "title": f"{s['shapes'][name]['title']}: "
                                               f"{shp['records']:,} input records ({how})"}, shp["tables"][p]) + [""]
    if res.get("latency"):
        lines += [""] + _latency_table(s, res["latency"])
    counters = _counters_table(res)
    if counters:
        lines += [""] + counters
    if res.get("breakdown"):
        lines += [""] + _breakdown(res["breakdown"])
    st = (res.get("stderr") or {}).get("counts")
    if st:
        lines += ["", "Lines on stderr over the whole run: " + ", ".join(f"{k} {v}" for k, v in st.items()) + "."]
    return report.tail(lines, res)
