"""Results files of the one-shape sink benchmark (2026-11-23/24: the passthrough job, one producer setting,
``--render`` of those files): their markdown, as that benchmark wrote it."""
from __future__ import annotations

from benchmarks import report


def markdown(res: dict) -> str:
    m, s = res["machine"], res["settings"]
    lines = [f"# Sink benchmark {res['date']}", "",
             "Spark's built-in Kafka sink (`format(\"kafka\")`, at-least-once) against the exactly-once "
             "sink (`BatchWriter` via foreachBatch), same job (passthrough), same input, same SparkSession, "
             "same parallelism and maxOffsetsPerTrigger. Produced by `benchmarks/sink_throughput.py`.", "",
             f"Machine: {m['cores']} cores ({m['cpu']}), {m['ram_gb']} GB RAM, shared (load average "
             f"{m['load_avg_start'][0]:.1f} at start, {m['load_avg_end'][0]:.1f} at end); Python {m['python']}, "
             f"PySpark {m['pyspark']} (`{s['spark_master']}`), Kafka broker {m['kafka_broker']} (single node, "
             f"same machine), Spark's kafka-clients {m['kafka_clients_jar']}, confluent-kafka "
             f"{m['confluent_kafka']} (librdkafka {m['librdkafka']}), pyarrow {m['pyarrow']}.", "",
             f"Settings: {s['records']:,} records of ~{s['record_bytes']} bytes, {s['input_partitions']} input "
             f"partitions, parallelism {s['parallelism']} ({s['output_partitions']} output partitions / slots), "
             f"maxOffsetsPerTrigger {s['max_offsets_per_trigger']:,}, {s['repeats']} alternating repeats "
             f"(median) after a {s['warmup_records']:,}-record warm-up of each sink; latency at "
             f"{s['rate']:,} rec/s for {s['seconds']:.0f}s (after {s['latency_warmup_s']:.0f}s not counted), "
             f"processingTime trigger {s['trigger_ms']} ms, read_committed consumer.", "",
             "| measure | built-in (at-least-once) | exactly-once (ours) | ours / built-in |",
             "| --- | ---: | ---: | ---: |"]
    t = res.get("throughput")
    if t:
        lines.append(f"| throughput, records/s (median of {s['repeats']}) | {t['records_per_s']['builtin']:,} | "
                     f"{t['records_per_s']['ours']:,} | {t['ratio']:.2f} |")
        for sx in [k for k in t["records_per_s"] if k.startswith("ours+")]:
            lines.append(f"| throughput, records/s, {sx} (candidate fixes, median of {s['repeats']}) | "
                         f"{t['records_per_s']['builtin']:,} | {t['records_per_s'][sx]:,} | {t['ratios'][sx]:.2f} |")
        lines.append(f"| wall time for {t['records']:,} records, s | {t['median_wall_s']['builtin']:.2f} | "
                     f"{t['median_wall_s']['ours']:.2f} | {t['median_wall_s']['ours'] / t['median_wall_s']['builtin']:.2f} |")
        for sink in ("builtin", "ours"):
            t[f"_walls_{sink}"] = ", ".join(f"{r['wall_s']:.2f}" for r in t["runs"][sink])
        lines.append(f"| all runs, s | {t['_walls_builtin']} | {t['_walls_ours']} | |")
        for sx in [k for k in t["runs"] if k.startswith("ours+")]:
            walls = ", ".join(f"{r['wall_s']:.2f}" for r in t["runs"][sx])
            lines.append(f"| all runs, s, {sx} | | {walls} | |")
        cb, co = t.get("cpu_us_per_record_median", {}).get("builtin"), t.get("cpu_us_per_record_median", {}).get("ours")
        if cb and co:
            for k, label in (("spark+broker", "Spark (driver + JVM + Python workers) + broker"), ("jvm", "JVM"),
                             ("python_workers", "Python workers"), ("driver", "driver Python"),
                             ("broker", "Kafka broker"), ("other", "rest of the machine (noise)")):
                ratio = f"{co[k] / cb[k]:.2f}" if cb[k] > 0 and k in ("spark+broker", "jvm", "broker") else ""
                lines.append(f"| CPU µs per record: {label} | {cb[k]} | {co[k]} | {ratio} |")
        ws = t.get("time_split_median_run") or {}
        if ws.get("builtin") and ws.get("ours"):
            for k, label in (("batches_s", "micro-batches (sum of triggerExecution)"),
                             ("query_start_and_stop_s", "query start and stop"),
                             ("spark_jobs_s", "Spark jobs"),
                             ("batch_outside_jobs_s", "batch time outside Spark jobs (planning, offsets, commit log, "
                                                      "foreachBatch driver work)"),
                             ("map_stages_s", "shuffle-map stages (Kafka read + shuffle write)"),
                             ("result_stages_s", "result stages (built-in: read + write; ours: slot tasks)"),
                             ("result_task_run_s", "result tasks' run time, summed over tasks"),
                             ("result_task_jvm_cpu_s", "result tasks' JVM CPU, summed")):
                lines.append(f"| wall s, median run: {label} | {ws['builtin'].get(k, '-')} | {ws['ours'].get(k, '-')} | |")
        rf = {k: (sum(r.get("refence_warnings", 0) for r in t["runs"][k]),
                  sum(r.get("task_failures", 0) for r in t["runs"][k])) for k in ("builtin", "ours")}
        lines.append(f"| slot re-fences / failed tasks, all runs | {rf['builtin'][0]} / {rf['builtin'][1]} | "
                     f"{rf['ours'][0]} / {rf['ours'][1]} | |")
        for sink in ("builtin", "ours"):
            del t[f"_walls_{sink}"]
    lat = res.get("latency")
    if lat:
        b, o = lat["builtin"], lat["ours"]
        for q in ("p50", "p99"):
            if b.get(f"{q}_ms") and o.get(f"{q}_ms"):
                lines.append(f"| end-to-end latency {q}, ms | {b[f'{q}_ms']} | {o[f'{q}_ms']} | "
                             f"{o[f'{q}_ms'] / b[f'{q}_ms']:.2f} |")
        lines.append(f"| latency: median batch duration, ms | {b['batch_ms_median']} | {o['batch_ms_median']} | |")
        for sink in [k for k in lat if k.startswith("ours+")]:
            f = lat[sink]
            for q in ("p50", "p99"):
                if b.get(f"{q}_ms") and f.get(f"{q}_ms"):
                    lines.append(f"| end-to-end latency {q}, ms, {sink} (candidate fix) | {b[f'{q}_ms']} | "
                                 f"{f[f'{q}_ms']} | {f[f'{q}_ms'] / b[f'{q}_ms']:.2f} |")
            lines.append(f"| latency: median batch duration, ms, {sink} | {b['batch_ms_median']} | "
                         f"{f['batch_ms_median']} | |")
    bd = res.get("breakdown")
    if bd:
        n_bd = res["throughput"]["warmup_records"] if t else "?"
        lines += ["", f"Breakdown: one run per variant over the same {n_bd:,} records (the warm-up topic), same "
                  "settings. The probes (`benchmarks/sink_probes.py`) cut the exactly-once write path after each "
                  "step; `ours` is the sink itself (runs before 2026-11-24 also had `ours+...` variants: "
                  "candidate fixes applied in the benchmark only, since merged into the sink). Slot task "
                  "seconds are summed over the parallel slot tasks.", "",
                  "| variant | records/s | CPU µs/rec Spark+broker | of which JVM | Python workers | median batch ms "
                  "| re-fences | failed tasks | recv (shuffle + Arrow) s | convert s | produce loop s | flush/commit s |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for v, r in bd.items():
            cu = r.get("cpu_us_per_record") or {}
            sb = round(cu["spark"] + cu["broker"], 2) if cu else ""
            lines.append(f"| {v} | {r['records_per_s']:,} | {sb} | {cu.get('jvm', '')} | {cu.get('python_workers', '')} "
                         f"| {r['batch_ms_median']} | {r.get('refence_warnings', '')} | "
                         f"{r.get('task_failures', '')} | {r.get('t_recv_s', '')} | {r.get('t_convert_s', '')} | "
                         f"{r.get('t_produce_s', '')} | {r.get('t_commit_s', '')} |")
        dr = (bd.get("ours") or {}).get("driver_timing")
        if dr:
            lines += ["", f"Driver side of `ours`: {dr['foreach_batch_calls']} foreachBatch calls took "
                      f"{dr['foreach_batch_s']} s, of which {dr['batch_complete_write_s']} s batch-complete writes."]
    timed = {v: r for v, r in (bd or {}).items() if r.get("slot_timing")}
    if lat:
        timed.update({f"latency: {k}": v for k, v in lat.items() if isinstance(v, dict) and v.get("slot_timing")})
    if timed:
        lines += ["", "Slot task time split of the timed variants (a step timer of the runs before 2026-11-24; "
                  "seconds summed over slot tasks, "
                  "and the median task in ms):", "",
                  "| variant | tasks | task s | recv s | fence s | ledger read s | produce loop s | begin+ledger+commit s "
                  "| median task ms: fence / ledger read / produce / commit | driver foreachBatch s | "
                  "batch-complete write s |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |"]
        for v, r in timed.items():
            st, dr, med = r["slot_timing"], r.get("driver_timing", {}), r["slot_timing"]["per_task_ms_median"]
            lines.append(f"| {v} | {st['tasks']} | {st['task_s']} | {st['recv_s']} | {st['fence_s']} | "
                         f"{st['read_latest_s']} | {st['produce_loop_s']} | {st['tx_rest_s']} | "
                         f"{med['fence']} / {med['read_latest']} / {med['produce_loop']} / {med['tx_rest']} | "
                         f"{dr.get('foreach_batch_s', '')} | {dr.get('batch_complete_write_s', '')} |")
    return report.tail(lines, res)
