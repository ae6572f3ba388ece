"""How the real nodes get a new build of the project's image: pushed to the stack's registry and pulled by each
node's containerd (eos_stack.registry, node_images.py) against the baseline it replaced, ``podman save
--format docker-archive`` then ``ctr images import`` into each node. Both in the same run, alternating, on the
stack's real nodes (``EOS_STATE``: use a stack of your own), for a *code-only change*: one small layer (a copy
of ``jobs/eos_job`` and a fresh stamp) on top of the built image, as a change to the project's Python code is in
the Dockerfile's last layers. Both nodes load in parallel, as ``eos_stack up node`` does.

    PYTHONPATH=stack:jobs:operator:. python -m benchmarks.node_image_delivery [--repeats 3] [--base TAG]

Writes ``benchmarks/results/node-image-delivery-<date>.json`` with each repeat's seconds, the load average
around it (the machine is shared: read the ratios, not the seconds), the medians, spreads and the ratio.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from eos_stack import node, registry
from eos_stack.common import Stack
from eos_stack.image_common import image_name, podman
from eos_stack.node_config import layouts
from eos_stack.node_images import ctr

REPO = Path(__file__).resolve().parents[1]


def code_change(st: Stack, base: str, tag: str, work: Path) -> None:
    ctx = work / "ctx"
    shutil.rmtree(ctx, ignore_errors=True)
    shutil.copytree(REPO / "jobs" / "eos_job", ctx / "eos_job", ignore=shutil.ignore_patterns("__pycache__"))
    (ctx / "eos_job" / "CHANGED").write_text(f"{time.time_ns()}\n")
    (ctx / "Dockerfile").write_text(f"FROM {base}\nCOPY eos_job /opt/code-change/eos_job\n")
    podman(st, "build", "--pull=never", "-t", tag, str(ctx))


def on_nodes(fn, nodes) -> None:
    with ThreadPoolExecutor(len(nodes)) as pool:
        list(pool.map(fn, nodes))


def via_registry(st: Stack, tag: str, nodes) -> float:
    t0 = time.monotonic()
    ref = registry.ensure_image(st, tag)
    on_nodes(lambda n: ctr(n, "images", "pull", f"--hosts-dir={n.registry_hosts_dir}", ref), nodes)
    return time.monotonic() - t0


def via_archive(st: Stack, tag: str, nodes, work: Path) -> float:
    arch = work / "image.docker.tar"
    t0 = time.monotonic()
    podman(st, "save", "--format", "docker-archive", "-o", str(arch), tag, timeout=1800)
    on_nodes(lambda n: ctr(n, "images", "import", str(arch)), nodes)
    took = time.monotonic() - t0
    arch.unlink()
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--base", default=image_name(), help="the built image the change goes on (default: %(default)s)")
    args = ap.parse_args()
    st = Stack()
    registry.up(st)
    nodes = layouts(st.state, node.count())
    runs = []
    with tempfile.TemporaryDirectory(prefix="eos-delivery-") as tmp:
        work = Path(tmp)
        for i in range(args.repeats):
            for method in (("registry", "archive") if i % 2 == 0 else ("archive", "registry")):
                # The base image's repository: the registry holds its layers there already (a first push to a new
                # repository sends every layer again: podman knows their compressed digests per repository).
                tag = f"{args.base.rpartition(':')[0]}:delivery-{method}-{i}-{os.getpid()}"
                code_change(st, args.base, tag, work)
                load0 = os.getloadavg()[0]
                took = via_registry(st, tag, nodes) if method == "registry" else via_archive(st, tag, nodes, work)
                runs.append({"method": method, "repeat": i, "seconds": round(took, 2),
                             "load_before": round(load0, 1), "load_after": round(os.getloadavg()[0], 1)})
                print(json.dumps(runs[-1]), flush=True)
                podman(st, "rmi", tag, check=False)
    summary = {}
    for m in ("registry", "archive"):
        xs = [r["seconds"] for r in runs if r["method"] == m]
        summary[m] = {"median_s": round(statistics.median(xs), 2), "min_s": min(xs), "max_s": max(xs)}
    summary["archive_over_registry"] = round(summary["archive"]["median_s"] / summary["registry"]["median_s"], 1)
    out = REPO / "benchmarks" / "results" / f"node-image-delivery-{dt.date.today().isoformat()}.json"
    out.write_text(json.dumps({"what": __doc__.split("\n\n")[0], "nodes": len(nodes), "base": args.base,
                               "cpus": os.cpu_count(), "runs": runs, "summary": summary}, indent=2) + "\n")
    print(json.dumps(summary), f"-> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
