"""What the benchmarks' results files share: progress lines, the machine, the results' CLI and their tail.

A results file (``benchmarks/results/<date>-<name>.md``) is markdown that a
benchmark renders from one dict of measurements, ending with an optional
``## Findings`` section (notes from a markdown file, ``--findings``) and the
dict itself as JSON (``## Raw results``), so that ``--render FILE`` can
render the file again from its JSON, e.g. to add findings.

Used by the sink benchmark (``sink_throughput.py``, ``sink_report.py``) and ``executors.py``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Callable

T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {msg}", flush=True)


def machine_info() -> dict:
    """Cores, CPU model, RAM, OS, Python, PySpark, the stack's Kafka broker and librdkafka."""
    import confluent_kafka
    import pyspark
    mem_kb, cpu = 0, "unknown"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    except OSError:
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        from eos_stack import kafka as stack_kafka
        kafka_version = stack_kafka.VERSION
    except Exception:  # noqa: BLE001
        kafka_version = "unknown"
    return {"cores": os.cpu_count(), "cpu": cpu, "ram_gb": round(mem_kb / 1024 / 1024, 1),
            "os": platform.platform(), "python": platform.python_version(), "pyspark": pyspark.__version__,
            "kafka_broker": kafka_version, "librdkafka": confluent_kafka.libversion()[0]}


def add_results_args(ap: argparse.ArgumentParser, name: str) -> None:
    """``--out``, ``--findings`` and ``--render`` of a benchmark whose results file is ``<date>-<name>.md``."""
    ap.add_argument("--out", help=f"results file (default benchmarks/results/<date>-{name}.md)")
    ap.add_argument("--findings", help="a markdown file whose text goes in the results' Findings section")
    ap.add_argument("--render", metavar="RESULTS_MD",
                    help="only re-render a results file from its raw JSON (e.g. to add --findings), then exit")


def write_results(res: dict, name: str, markdown: Callable[[dict], str], out: str | None) -> Path:
    """The results file (``out``, else ``benchmarks/results/<date>-<name>.md``) written from ``res``; its text up to
    the raw results printed."""
    path = Path(out or Path(__file__).resolve().parent / "results" / f"{res['date']}-{name}.md")
    text = markdown(res)
    path.write_text(text)
    say(f"results written to {path}")
    print(text.split("## Raw results")[0])
    return path


def add_findings(res: dict, findings: str | None) -> None:
    if findings:
        res["findings"] = Path(findings).read_text()


def render(path: str, findings: str | None, markdown: Callable[[dict], str],
           recompute: Callable[[dict], None] = lambda res: None) -> int:
    """``--render``: the results file at ``path`` rendered again from its raw JSON, ``recompute`` applied to it
    first (what is derived from the raw measurements), with ``findings`` if given."""
    p = Path(path)
    res = json.loads(p.read_text().split("```json", 1)[1].split("```", 1)[0])
    recompute(res)
    add_findings(res, findings)
    p.write_text(markdown(res))
    print(f"re-rendered {p}")
    return 0


def tail(lines: list[str], res: dict) -> str:
    """The results file: ``lines``, the Findings section if ``res`` has findings, and ``res`` as JSON."""
    if res.get("findings"):
        lines += ["", "## Findings", "", res["findings"].strip()]
    lines += ["", "## Raw results", "", "```json", json.dumps(res, indent=1, sort_keys=True, default=str), "```", ""]
    return "\n".join(lines)
