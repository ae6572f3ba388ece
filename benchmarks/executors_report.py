"""The executors benchmark's results: the runs summed up by mode, and the results file in markdown.

``summarize`` turns the runs of ``executors_run.Bench.run`` into medians,
spreads and cluster/local ratios; ``markdown`` renders the results file
(settings, machine, tables, the runs in order, findings and the raw JSON).
``executors.py --render FILE`` calls both again on a file's raw JSON.
"""
from __future__ import annotations

import statistics

from benchmarks import report

MODES = ("local", "cluster")


def spread(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "all": [round(v, 3) for v in values]}


def summarize(runs: list[dict], n: int) -> dict:
    by = {m: [r for r in runs if r["mode"] == m and not r.get("warmup")] for m in MODES}
    out: dict = {}
    for key in ("end_to_end_s", "processing_s", "startup_s"):
        out[key] = {m: spread([r[key] for r in by[m]]) for m in MODES}
        med = {m: statistics.median(r[key] for r in by[m]) for m in MODES}
        pairs = [c[key] / lo[key] for lo, c in zip(by["local"], by["cluster"])]
        out[key]["ratio_of_medians"] = round(med["cluster"] / med["local"], 2)
        out[key]["pair_ratios"] = spread(pairs)
    # Batch 0 pays the first Python workers, Kafka consumers and connections of each JVM; the later ones run warm.
    for key, pick in (("batch0_s", lambda r: r["batch_ms"][0] / 1000),
                      ("later_batches_s", lambda r: sum(r["batch_ms"][1:]) / 1000)):
        vals = {m: [pick(r) for r in by[m] if r.get("batch_ms")] for m in MODES}
        if all(vals.values()) and all(min(v) > 0 for v in vals.values()):
            out[key] = {m: spread(vals[m]) for m in MODES}
            med = {m: statistics.median(vals[m]) for m in MODES}
            out[key]["ratio_of_medians"] = round(med["cluster"] / med["local"], 2)
            out[key]["pair_ratios"] = spread([c / lo for lo, c in zip(vals["local"], vals["cluster"])])
    out["records_per_s"] = {f"{m}_{k}": round(n / statistics.median(r[f"{k}_s"] for r in by[m]))
                            for m in MODES for k in ("end_to_end", "processing")}
    cpu: dict = {}
    for m in MODES:
        keys = by[m][0]["cpu_us_per_record"].keys()
        cpu[m] = {k: round(statistics.median(r["cpu_us_per_record"][k] for r in by[m]), 2) for k in keys}
    out["cpu_us_per_record_median"] = cpu
    out["cpu_ratio_spark"] = round(cpu["cluster"]["spark"] / cpu["local"]["spark"], 2)
    return out



# Where the Pods ran: the real nodes; results from before 2026-11-29 (no ``pods`` setting) ran them on the process
# kubelet (retired), a test node that ran each Pod as a local process without cgroups.
PODS = {"real nodes": "the stack's real nodes (kubelet, containerd, cgroup CPU limits; every Pod on one node)",
        "process kubelet": "the process kubelet (a test node since retired: Pods as local processes, no CPU limits)"}


def pod_resources(s: dict) -> str:
    """The Pods' CPU and memory as the settings give them (older results: only the executors')."""
    if "executor_cpu" not in s:
        return (f"cluster mode: {s['executors']} executors of 1 core and {s['executor_memory']} each (driver: "
                "Spark's default 1g; local mode: `spark.driver.memory=1g`)")
    return (f"local mode: a driver of {s['driver_cpu']} CPU and {s['driver_memory']}; cluster mode: a driver of "
            f"{s['cluster_driver_cpu']} CPU and {s['driver_memory']}, {s['executors']} executors of "
            f"{s['executor_cpu']} CPU and {s['executor_memory']} each (requests and limits)")


def fmt_spread(s: dict, unit: str = "") -> str:
    return f"{s['median']:.1f}{unit} ({s['min']:.1f}–{s['max']:.1f})"


def markdown(res: dict) -> str:
    m, s, sm = res["machine"], res["settings"], res["summary"]
    lines = [
        f"# Executors benchmark {res['date']}: local mode against {s['executors']} executor Pods", "",
        "The exactly-once sink job of the sink benchmark (`benchmarks/passthrough.py`, the `BatchWriter` sink) "
        f"run as an ExactlyOnceStream through the operator and {PODS[s.get('pods', 'process kubelet')]} on the "
        f"local stack, in Spark local mode in one driver Pod (`deployMode: local`, `local[*,4]`) and with "
        f"`deployMode: cluster` and {s['executors']} executor Pods. Same input, same spec but for the deploy mode "
        "(and the Pods' sizes, below); each run a fresh stream, checkpoint and output topic; modes alternate. "
        "Produced by `benchmarks/executors.py`.", "",
        f"Machine: **{m['cores']} cores** ({m['cpu']}), {m['ram_gb']} GB RAM, shared (load average "
        f"{res['load_avg_start'][0]:.1f} at start, {res['load_avg_end'][0]:.1f} at end); Python {m['python']}, "
        f"PySpark {m['pyspark']}, Kafka broker {m['kafka_broker']} (single node, same machine), librdkafka "
        f"{m['librdkafka']}. With {m['cores']} cores, {s['executors']} executor JVMs and a driver JVM cannot "
        "be faster than one local-mode JVM using both cores: the ratio measures the overhead of executor Pods "
        "and of the shuffle between JVMs, not a speed-up.", "",
        f"Settings: {s['records']:,} records of ~{s['record_bytes']} bytes in a {s['input_partitions']}-partition "
        f"topic, parallelism {s['parallelism']} (output partitions / slots), maxOffsetsPerTrigger "
        f"{s['max_offsets_per_trigger']:,}, triggerIntervalMs {s['trigger_ms']} (batches back to back), "
        f"checkpoint `store: {s['checkpoint_store']}`; {pod_resources(s)}; "
        f"{s['repeats']} repeats, alternating order, median (min–max).", "",
        "What the times include. **End-to-end**: `kubectl apply` of the stream until the commit-log entry of "
        "the batch that reached the input's end (the slot transactions commit before it, so all N records are "
        "then visible read_committed): the operator's resolution, the driver Pod's start, JVM and SparkSession, "
        "in cluster mode the executor Pods' start and registration, and every batch. **Processing**: the offset-"
        "log entry of batch 0 to that commit-log entry, the batches alone. **Startup**: apply to batch 0.", "",
        "| measure | local mode | cluster, executors | cluster / local |", "| --- | ---: | ---: | ---: |"]
    for key, label in (("end_to_end_s", "end-to-end, s"), ("processing_s", "processing, s"),
                       ("startup_s", "startup (apply to first batch), s"),
                       ("batch0_s", "… of which batch 0's foreachBatch (the sink; the runtime's log), s"),
                       ("later_batches_s", "… of which the later batches' foreachBatch, summed, s")):
        if key not in sm:
            continue
        d = sm[key]
        lines.append(f"| {label} | {fmt_spread(d['local'])} | {fmt_spread(d['cluster'])} | "
                     f"**{d['ratio_of_medians']:.2f}** (pairs {d['pair_ratios']['min']:.2f}–"
                     f"{d['pair_ratios']['max']:.2f}) |")
    rps = sm["records_per_s"]
    for k, label in (("processing", "records/s, processing"), ("end_to_end", "records/s, end-to-end")):
        lines.append(f"| {label} (median) | {rps[f'local_{k}']:,} | {rps[f'cluster_{k}']:,} | "
                     f"{rps[f'cluster_{k}'] / rps[f'local_{k}']:.2f} |")
    cl, cc = sm["cpu_us_per_record_median"]["local"], sm["cpu_us_per_record_median"]["cluster"]
    for k, label in (("spark", "CPU µs/record, Spark (driver + executor Pods)"), ("driver", "… of which driver Pod"),
                     ("executors", "… of which executor Pods"), ("operator", "CPU µs/record, operator"),
                     ("kube", "CPU µs/record, API server + etcd + controller-manager"),
                     ("broker", "CPU µs/record, Kafka broker"),
                     ("nodes", "CPU µs/record, the real nodes (kubelets, containerd and its shims, scheduler, DNS)"),
                     ("forwarder", "CPU µs/record, the services address's forwarder (the Pods' Kafka and S3)"),
                     ("s3", "CPU µs/record, MinIO (the checkpoint)"),
                     ("bench", "CPU µs/record, this process" + (" (kubelet)" if "nodes" not in cl else "")),
                     ("other", "CPU µs/record, rest of the machine (noise)")):
        if k not in cl:
            continue   # results of the process kubelet's time had no such component
        ratio = f"{cc[k] / cl[k]:.2f}" if k in ("spark", "broker") and cl[k] else ""
        lines.append(f"| {label} | {cl[k]} | {cc[k]} | {ratio} |")
    steps = (("driver_pod_running", "driver Pod running (API timestamp: whole seconds, truncated)"),
             ("executor_pods_created", "executor Pods created (whole seconds)"),
             ("executor_pods_running_all", "executor Pods running, all (whole seconds)"),
             ("executors_registered", "first executor registered (the query waits for one)"),
             ("session_ready", "driver epoch claimed: SparkSession up (cluster mode: after an executor registered)"),
             ("query_started", "query started"), ("first_batch_started", "batch 0 started (offset log)"),
             ("first_output_record", "first output record (its timestamp)"),
             ("last_output_record", "last output record (its timestamp)"),
             ("last_batch_committed", "last batch committed (commit log): end"))
    med = {}
    for mode in ("local", "cluster"):
        rs = sorted((r for r in res["runs"] if r["mode"] == mode and not r.get("warmup")),
                    key=lambda r: r["end_to_end_s"])
        med[mode] = rs[len(rs) // 2] if rs else {"timeline_s": {}}
    lines += ["", "Where the end-to-end time goes, seconds after the apply, in the median run of each mode "
              f"({med['local'].get('label')}, {med['cluster'].get('label')}):", "",
              "| step | local mode | cluster |", "| --- | ---: | ---: |"]
    for k, label in steps:
        vals = [med[m]["timeline_s"].get(k) for m in ("local", "cluster")]
        if any(v is not None for v in vals):
            lines.append(f"| {label} | " + " | ".join("-" if v is None else f"{v:.1f}" for v in vals) + " |")
    lines.append("| median foreachBatch duration of a batch, ms (the runtime's log) | "
                 + " | ".join(str(med[m].get("batch_ms_median", "-")) for m in ("local", "cluster")) + " |")
    lines += ["", "Every run, in order (times in s from the apply; load average 1 min before → after, of which "
              "the benchmark's own JVMs make 2 to 5 on these cores; `other` = CPU seconds of the rest of the machine "
              "during the run and `foreign` = other java/pytest processes before / after it: the disturbance "
              "by other work):", "",
              "| run | mode | end-to-end | startup | processing | batches | median foreachBatch ms | driver running "
              "| executors running | CPU s Spark | other CPU s | load | foreign java/pytest | exactly once |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- |"]
    for r in res["runs"]:
        tl, au = r["timeline_s"], r["audit"]
        name = r["label"] + (" (warm-up)" if r.get("warmup") else "")
        drv = f"{tl['driver_pod_running']:.1f}" if "driver_pod_running" in tl else "-"
        exe = f"{tl['executor_pods_running_all']:.1f}" if "executor_pods_running_all" in tl else "-"
        ok = "yes" if not (au["duplicates"] or au["missing"] or au["unexpected"]) else "NO"
        lines.append(f"| {name} | {r['mode']} | {r['end_to_end_s']:.1f} | {r['startup_s']:.1f} | "
                     f"{r['processing_s']:.1f} | {r['batches']} | {r.get('batch_ms_median') or '-'} | {drv} | {exe} | "
                     f"{r['cpu_s']['spark']:.0f} | {r['cpu_s']['other']:.0f} | "
                     f"{r['load_before'][0]:.1f} → {r['load_after'][0]:.1f} | "
                     f"{len(r['foreign_before'])} / {len(r['foreign_after'])} | "
                     f"{ok} ({au['records']:,} records, {au['distinct']:,} keys) |")
    return report.tail(lines, res)
