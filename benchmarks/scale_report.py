"""The scale benchmark's results: figures per stream count, the issue's targets, markdown and a plot."""
from __future__ import annotations

from pathlib import Path

from benchmarks import report

# Issue 14's targets at 500 streams.
TARGETS = {"first_action_p99_s": 1.0, "api_per_stream_per_s": 0.1, "rss_peak_mib": 512.0, "takeover_s": 15.0}


def pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (with 20 samples, p99 is the slowest)."""
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, max(0, int(round(q / 100 * len(v) + 0.5)) - 1))]


def per_stream(run: dict, key: str) -> float | None:
    steady, base = run.get("steady") or {}, run.get("baseline") or {}
    if key not in steady:
        return None
    # A counter missing from the baseline had counted nothing yet (the operator exports it at its first request).
    return round((steady[key] - base.get(key, 0.0)) / run["streams"], 4)


def figures(run: dict) -> dict:
    fa = [x["first_action_s"] for x in run.get("first_action", [])]
    cr = [x["restart_pod_s"] for x in run.get("crash_restart", [])]
    steady, take = run.get("steady") or {}, run.get("takeover") or {}
    return {
        "startup_all_running_s": (run.get("startup") or {}).get("all_running_s"),
        "first_action_p50_s": pct(fa, 50), "first_action_p99_s": pct(fa, 99), "first_action_n": len(fa),
        "crash_restart_p50_s": pct(cr, 50), "crash_restart_max_s": pct(cr, 100), "crash_restart_n": len(cr),
        "api_per_stream_per_s": per_stream(run, "operator_requests_per_s"),
        "apiserver_per_stream_per_s": per_stream(run, "apiserver_requests_per_s"),
        "kafka_connections": steady.get("kafka_connections_median"),
        "cpu_pct": steady.get("cpu_pct"), "rss_peak_mib": steady.get("rss_peak_mib"),
        "takeover_lease_s": take.get("lease_s"), "takeover_s": take.get("first_action_s"),
        "standin_private_mib": (run.get("standins") or {}).get("private_mib_mean"),
    }


def run_label(run: dict) -> str:
    """A run's column: its stream count, and the operator variant if it is not the product's default."""
    return f"{run['streams']} streams" + (f", {run['variant']}" if run.get("variant") else "")


def summarize(res: dict) -> None:
    res["summary"] = {run_label(r): figures(r) for r in res["runs"]}


ROWS = [("startup: create → all Running with a batch, s", "startup_all_running_s"),
        ("first action p50, s", "first_action_p50_s"), ("first action p99, s", "first_action_p99_s"),
        ("driver crash → restart Pod, p50 s", "crash_restart_p50_s"),
        ("driver crash → restart Pod, max s", "crash_restart_max_s"),
        ("API requests /s per stream (operator's counter)", "api_per_stream_per_s"),
        ("API requests /s per stream (API server, all clients, non-watch)", "apiserver_per_stream_per_s"),
        ("Kafka connections held by the operator", "kafka_connections"),
        ("operator CPU, % of one core", "cpu_pct"), ("operator RSS peak, MiB", "rss_peak_mib"),
        ("takeover: leader killed → standby holds the Lease, s", "takeover_lease_s"),
        ("takeover: leader killed → standby's first action, s", "takeover_s"),
        ("playing the drivers (simulators; stand-ins before), private memory per stream, MiB",
         "standin_private_mib")]

STOOD_IN = {"kwok": "the node and Spark (driver Pods on a KWOK node, made Running and removed through the API "
                    "server; simulator processes of 250 streams each play every driver's start and batches through "
                    "the sink's write path, a thread each)",
            # results from before 2026-11-29 (no ``nodes`` setting): the process kubelet's, since retired
            "standin": "Spark (the process kubelet's driver stand-in, a process per driver)"}


def _cell(v) -> str:
    if v is None:
        return "-"
    return f"{v:,.3f}".rstrip("0").rstrip(".") if isinstance(v, float) else f"{v:,}"


def markdown(res: dict) -> str:
    summ = res.get("summary") or {}
    ns = list(summ)
    m = res["machine"]
    lines = [f"# Scale benchmark, {res['date']}", "", f"Command: `{res['command']}` (`make bench-scale`)", "",
             f"Machine: {m['cores']} cores ({m['cpu']}), {m['ram_gb']} GB RAM, {m['os']}, Python {m['python']}, "
             f"Kafka {m['kafka_broker']}, librdkafka {m['librdkafka']}. Load average at start "
             f"{', '.join(f'{x:.2f}' for x in res['load_avg_start'])}, at end "
             f"{', '.join(f'{x:.2f}' for x in res.get('load_avg_end', []))}.", "",
             "Real: the operator (two replicas, leader election, the CLI's default intervals), the API server, "
             f"Kafka, resolution. Stood in: {STOOD_IN[res['settings'].get('nodes', 'standin')]}, one batch every "
             f"{res['settings']['batch_seconds']:g} s, {res['settings']['parallelism']} slot(s) per stream. "
             "One run per stream count.", "",
             "| figure | " + " | ".join(ns) + " |",
             "| --- | " + " | ".join("---:" for _ in ns) + " |"]
    for label, key in ROWS:
        lines.append(f"| {label} | " + " | ".join(_cell(summ[n].get(key)) for n in ns) + " |")
    lines += ["", "Targets (issue 14, at 500 streams; here for the largest N run):", "",
              "| target | limit | measured | met |", "| --- | ---: | ---: | --- |"]
    default = [run_label(r) for r in res["runs"] if not r.get("variant")]
    if default:
        big = summ[default[-1]]
        for key, limit in TARGETS.items():
            v = big.get(key)
            verdict = "not measured" if v is None else "yes" if v <= limit else f"no: {v - limit:.3g} over (x{v / limit:.2f})"
            lines.append(f"| {key} ({default[-1]}) | {limit:g} | {_cell(v)} | {verdict} |")
    for r in res["runs"]:
        lines += ["", f"## {run_label(r)}", ""]
        if r.get("error"):
            lines += [f"**Stopped by:** `{r['error'][:1500]}`", ""]
        foreign = sorted({f for w in ("baseline", "steady") for f in (r.get(w) or {}).get("foreign_processes", [])})
        if foreign:
            lines += [f"Other work on the machine during the windows ({len(foreign)} java/pytest processes, another "
                      "engineer's tests on the same stack): " + "; ".join(f"`{f}`" for f in foreign[:8]), ""]
        for what in ("baseline", "steady", "standins", "startup", "takeover"):
            if r.get(what):
                lines.append(f"- {what}: `{r[what]}`")
        if r.get("first_action"):
            lines.append("- first action, each sample (s): " + ", ".join(
                f"{x['stream']} {x['first_action_s']:.3f} ({x['what']})" for x in r["first_action"]))
        prof = r.get("profile") or {}
        if prof.get("samples"):
            lines.append(f"- the leader's profile (py-spy, {prof['samples']:,} samples on CPU over {prof['seconds']:g} s "
                         "from the steady window through the first actions), % of samples; where the CPU was: " +
                         ", ".join(f"`{f}` {p:g}" for f, p in prof["self_pct"]) + "; on the stack: " +
                         ", ".join(f"`{f}` {p:g}" for f, p in prof["inclusive_pct"]))
        elif prof:
            lines.append(f"- the leader's profile: `{prof}`")
        if r.get("crash_restart"):
            lines.append("- crash → restart Pod, each (s): " + ", ".join(
                f"{x['stream']} {x['restart_pod_s']:.3f}" for x in r["crash_restart"]))
    return report.tail(lines, res)


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in res["runs"] if not r.get("variant")]   # the product's default only
    summ = {r["streams"]: (res.get("summary") or {}).get(run_label(r), {}) for r in runs}
    ns = list(summ)
    panels = [("first action, s", [("p50", "first_action_p50_s"), ("p99", "first_action_p99_s"),
                                   ("crash → restart Pod p50", "crash_restart_p50_s")], 1.0),
              ("API requests /s per stream", [("operator", "api_per_stream_per_s"),
                                               ("API server, all", "apiserver_per_stream_per_s")], 0.1),
              ("operator RSS peak, MiB", [("RSS", "rss_peak_mib")], 512.0),
              ("operator CPU, % of a core", [("CPU", "cpu_pct")], None),
              ("Kafka connections (operator)", [("connections", "kafka_connections")], None),
              ("takeover, s", [("Lease", "takeover_lease_s"), ("first action", "takeover_s")], 15.0)]
    fig, axes = plt.subplots(2, 3, figsize=(14, 8))
    for ax, (title, series, target) in zip(axes.flat, panels):
        for label, key in series:
            pts = [(n, summ[n].get(key)) for n in ns if summ[n].get(key) is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        if target is not None:
            ax.axhline(target, color="red", linestyle="--", linewidth=1, label=f"target {target:g}")
        ax.set_title(title)
        ax.set_xlabel("streams")
        ax.set_xticks(ns)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.suptitle(f"Operator at scale ({res['date']}, {res['machine']['cores']} cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
