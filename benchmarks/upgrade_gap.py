"""Output gap of a snapshot upgrade versus a plain restart, measured in one run.

On the local stack (operator, the real nodes, real runtime, real Kafka; the stream placed on
the nodes as the e2e tests place theirs, ``tests/e2e/on_nodes.py``: checkpoint and
snapshots in the stack's bucket) one colors stream runs with events arriving steadily.
The benchmark alternates two operations on it, ``--rounds`` times each:

* **restart**: ``spec.restartNonce`` changes: SIGTERM, stop at a clean boundary,
  resolution, a new driver on the live checkpoint;
* **upgrade**: ``job.args.version`` changes: (pre-flight off) SIGTERM, stop with a
  snapshot, resolution, a new driver in a new checkpoint location restored from it.

The gap of each is the longest pause between consecutive output records (read
committed, record timestamps) from the change until the new driver's first output.
The machine is shared and noisy, so the result is the ratio of the medians
(upgrade / restart) from the same run, not absolute seconds. Output is checked
exactly once at the end.

    make bench-upgrade          # or: python benchmarks/upgrade_gap.py --rounds 3
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for extra in (REPO / "operator", REPO / "jobs", REPO, REPO / "stack"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from eos_job.verify import read_committed  # noqa: E402
from eos_stack.cluster import RESTRICTED, Kubectl, wait_until  # noqa: E402
from eos_stack.common import Stack  # noqa: E402
from tests.e2e.on_nodes import NodeStreams  # noqa: E402
from tests.e2e.streams import NAME, finish_exact, rig  # noqa: E402


NOT_UP = ("the local stack or its real nodes are not up: run `make stack-up`, `python -m eos_stack.image build` "
          "and `python -m eos_stack up node` first")


def longest_pause(timestamps: list[float], start: float, end: float) -> float:
    inside = sorted(t for t in timestamps if start - 5 <= t <= end)
    return max((b - a for a, b in zip(inside, inside[1:])), default=float("nan"))


def bench_namespace() -> tuple[dict, Kubectl, str, Path] | None:
    """The running stack's environment (also put in os.environ), its kubectl with the CRDs applied, a fresh
    namespace enforcing restricted Pod Security, and a work folder under the stack's state folder (the operator's
    log, the Pods' logs followed from the nodes). None when the stack or its real nodes are not up. Shared by the
    benchmarks that run streams; their Pods go to the real nodes through ``NodeStreams`` (``on_nodes``)."""
    import os
    env = Stack().read_env()
    if not env.get("KUBECONFIG") or not env.get("EOS_NODES"):
        return None
    os.environ.update(env)
    kubectl = Kubectl(env)
    kubectl.apply_crds()
    namespace = f"eos-bench-{uuid.uuid4().hex[:6]}"
    kubectl.run("create", "namespace", namespace)
    kubectl.run("label", "namespace", namespace, *RESTRICTED)
    return env, kubectl, namespace, Stack().dir("bench", namespace)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2, help="restarts and upgrades each (alternating)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / f"{time.strftime('%Y-%m-%d')}-upgrade-gap.md"))
    args = ap.parse_args(argv)
    bench = bench_namespace()
    if bench is None:
        print(NOT_UP, file=sys.stderr)
        return 2
    env, kubectl, namespace, workdir = bench
    results: dict[str, list[float]] = {"restart": [], "upgrade": []}
    try:
        with rig(env, kubectl, namespace, workdir, on_nodes=NodeStreams(env, kubectl, namespace).setup()) as r:
            trickle = r.run_stream(r.stream(upgradePreFlight=False), seed=21)
            attempt = 0
            for i in range(args.rounds * 2):
                kind = "restart" if i % 2 == 0 else "upgrade"
                time.sleep(8)
                attempt += 1
                t0 = time.time()
                if kind == "restart":
                    kubectl.patch_spec(namespace, NAME, {"restartNonce": i + 1})
                else:
                    kubectl.patch_spec(namespace, NAME, {"job": {"args": {"version": f"v{i}"}}})
                r.wait_status(lambda s: s.get("driverPod") == f"{NAME}-driver-{attempt}"
                              and s.get("lifecycleState") == "Running" and "upgrade" not in s,
                              f"{kind} {i} to run", 300)
                before = len(list(read_committed(r.bootstrap, r.topics.counts)))
                wait_until(lambda: len(list(read_committed(r.bootstrap, r.topics.counts))) > before + 2,
                           "output of the new driver", 120, r.diag, 1)
                stamps = [m.timestamp()[1] / 1000.0 for m in read_committed(r.bootstrap, r.topics.counts)]
                gap = longest_pause(stamps, t0, time.time())
                results[kind].append(gap)
                print(f"[bench] {kind} {len(results[kind])}: output gap {gap:.1f}s", flush=True)
            finish_exact(r, trickle)
    finally:
        kubectl.run("delete", "namespace", namespace, "--wait=false", check=False)
    med = {k: statistics.median(v) for k, v in results.items()}
    ratio = med["upgrade"] / med["restart"]
    lines = [
        f"# Upgrade output gap vs plain restart ({time.strftime('%Y-%m-%d %H:%M')})", "",
        "`python benchmarks/upgrade_gap.py --rounds {}` on the local stack (2 cores, shared). One colors stream,"
        " events arriving steadily; restarts (restartNonce) and snapshot upgrades (job.args.version, pre-flight"
        " off) alternate. Gap = longest pause between consecutive read_committed output records from the change"
        " until the new driver's output.".format(args.rounds), "",
        "| operation | gaps (s) | median (s) |", "|---|---|---|",
        *[f"| {k} | {', '.join(f'{g:.1f}' for g in v)} | {med[k]:.1f} |" for k, v in results.items()], "",
        f"**Ratio upgrade / restart (medians, same run): {ratio:.2f}**. Output exactly once at the end.", "",
        "The upgrade adds the snapshot copy at stop and the restore copy at start to what a restart does; both"
        " are file copies of the checkpoint (small for this job), so the gap is dominated by the driver's"
        " JVM/Spark start, which both pay.",
    ]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(json.dumps({"ratio": ratio, **{f"median_{k}": v for k, v in med.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
