#!/usr/bin/env python3
"""Executors benchmark: the exactly-once sink job in Spark local mode against cluster mode with executor Pods.

The sink benchmark's exactly-once run (``benchmarks/sink_throughput.py``: the
passthrough job of ``benchmarks/passthrough.py``, ~100-byte keyed records,
parallelism 2, maxOffsetsPerTrigger 100,000) here runs the production path:
an ExactlyOnceStream applied to the local stack's API server, the operator
(a local process for one namespace of our own, labelled for the restricted Pod
Security level) and the stack's real nodes (kubelet, containerd, the project's
image from the stack's registry: ``python -m eos_stack up node``), as the
cluster-mode e2e runs streams there (``tests/e2e/test_cluster_mode_e2e.py``):
the nodes' scheduler and toleration, Kafka at the Pods' bootstrap
(``POD_KAFKA_BOOTSTRAP``), the checkpoint in the stack's bucket, the job module
as a ConfigMap (the image has no ``benchmarks/``). Every Pod of every run goes
to one node (Pods of two nodes do not reach each other here). Two modes, same
input, same spec but for the deploy mode and how the node's CPU is shared:

* **local**: ``deployMode: local`` (the default), Spark local mode
  (``local[*,4]``) inside the one driver Pod of ``--driver-cpu`` (2: the node);
* **cluster**: ``deployMode: cluster``, the driver Pod (``--cluster-driver-cpu``,
  1) runs Spark's Kubernetes scheduler, which creates ``--executors`` executor
  Pods (``--executor-cpu``, 500m, and ``--executor-memory`` each) under the job's
  ServiceAccount (its RBAC rendered from the chart by helm, as in
  ``tests/e2e/test_cluster_mode_e2e.py``); the shuffle to the output slots goes
  between executor JVMs. The CPU limits are real (cgroups): together the Pods of
  either mode ask for the node's 2 CPUs.

N records are produced once into a 4-partition topic. Each run is a new stream
with a fresh checkpoint (``store: s3``, in the stack's bucket under
``/bench/<namespace>/<run>``) and a fresh output topic; modes alternate over
``--repeats`` (local first in odd repeats, cluster first in even ones). A run
ends when the checkpoint's commit log, listed in the bucket, holds the batch
whose offsets reach the input's end: the slot transactions are committed
before Spark writes that entry, so every record is then visible read_committed.
The stream is then deleted (its driver and executor Pods go), and the output is
read back read_committed: every key exactly once, set equality with the input's
keys.

Times per run (epoch seconds; Kubernetes timestamps have 1 s resolution):

* **end-to-end**: from ``kubectl apply`` to the commit-log entry of the last
  batch (its time in the bucket's listing). Includes the operator's resolution,
  the driver Pod's start, the driver's JVM and SparkSession, in cluster mode the
  executor Pods' start and registration (the driver starts its query once one
  executor registered), and all batches;
* **processing**: from the offset-log entry of batch 0 (written when the first
  batch starts) to the commit-log entry of the last batch: the batches alone;
* **startup**: the difference: apply to the first batch.

CPU seconds by component over each run's end-to-end interval (from /proc,
sampled twice a second; ``executors_run.CpuMeter``): driver Pod (its JVM and, in
local mode, the Python workers) and executor Pods (JVMs and their Python
workers), found by the Pod uid in each process's cgroup; the operator; this
process; the broker; the API server with etcd and the controller-manager; the
real nodes' own processes (kubelets, containerd and its shims, kube-scheduler,
CoreDNS); the services address's forwarder, which relays the Pods' Kafka and S3
traffic (an artefact of this stack: its servers listen on loopback); MinIO; and
the rest of the machine (other work: the noise). Load average and other
engineers' java/pytest processes are recorded before and after each run.

Results: ``benchmarks/results/<date>-executors.md`` (or ``--out``) with the
settings, the machine, a table and the JSON of every measurement;
``--render FILE --findings NOTES.md`` adds notes to a results file.

Run: ``make bench-executors`` (it starts the stack, builds the image and starts
the nodes), or, with those up,
``EOS_STATE=.stack PYTHONPATH=stack:. .venv/bin/python benchmarks/executors.py --records 200000 --repeats 1``.

This file sets up (namespace, the Pods' log followers, operator, input) and runs the modes in
order; ``executors_run.py`` is one run, ``executors_report.py`` the summary and
the results file; ``procstat.py``, ``kafka_io.py`` and ``report.py`` are shared
with the sink benchmark.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for _p in (REPO / "operator", REPO / "jobs", REPO, REPO / "stack"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from benchmarks import report  # noqa: E402
from benchmarks.executors_report import MODES, markdown, summarize  # noqa: E402
from benchmarks.executors_run import Bench  # noqa: E402
from benchmarks.kafka_io import KEY_BYTES, VALUE_BYTES, input_ends, produce_records  # noqa: E402
from benchmarks.report import say  # noqa: E402
from eos_job.storage import Loc  # noqa: E402
from eos_stack import cluster  # noqa: E402
from eos_stack.cluster import RESTRICTED, Kubectl  # noqa: E402
from eos_stack.common import Stack  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000, help="input records (produced once)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per mode (alternating order)")
    ap.add_argument("--warmup-records", type=int, default=100_000,
                    help="first run each mode once on this many records, not counted (0: none)")
    ap.add_argument("--executors", type=int, default=2, help="executor Pods in cluster mode")
    ap.add_argument("--executor-memory", default="1Gi", help="memory of each executor Pod")
    ap.add_argument("--executor-cpu", default="500m", help="CPU of each executor Pod (request and limit)")
    ap.add_argument("--driver-cpu", default="2", help="CPU of the driver Pod in local mode")
    ap.add_argument("--cluster-driver-cpu", default="1", help="CPU of the driver Pod in cluster mode")
    ap.add_argument("--driver-memory", default="2Gi", help="memory of the driver Pod (both modes)")
    ap.add_argument("--parallelism", type=int, default=2, help="slots = output partitions")
    ap.add_argument("--max-offsets", type=int, default=100_000, help="maxOffsetsPerTrigger")
    ap.add_argument("--trigger-ms", type=int, default=100, help="triggerIntervalMs (100: the smallest)")
    ap.add_argument("--run-timeout", type=float, default=600, help="seconds a run may take")
    report.add_results_args(ap, "executors")
    a = ap.parse_args(argv)
    if a.render:
        return report.render(a.render, a.findings, markdown,
                             lambda res: res.update(summary=summarize(res["runs"], res["settings"]["records"])))

    stack = Stack()
    env = stack.read_env()
    if not env.get("KUBECONFIG") or not env.get("KAFKA_BOOTSTRAP"):
        print("the local stack is not up: run `make stack-up` first", file=sys.stderr)
        return 2
    if not env.get("EOS_NODES"):
        print("the real nodes are not up: run `python -m eos_stack.image build` and `python -m eos_stack up node` "
              "(or `make bench-executors`)", file=sys.stderr)
        return 2
    os.environ.update(env)
    date = dt.date.today().isoformat()
    out_path = Path(a.out) if a.out else REPO / "benchmarks" / "results" / f"{date}-executors.md"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    from kubernetes import client, config
    from tests.e2e.test_cluster_mode_e2e import job_rbac
    from tests.harness.node_pods import NodePods

    kubectl = Kubectl(env)
    kubectl.apply_crds()
    namespace = f"bench-exec-{uuid.uuid4().hex[:6]}"
    work = stack.state / namespace      # the operator's log and the Pods' (followed from the nodes)
    work.mkdir(parents=True)
    n = a.records
    res: dict = {"date": date, "namespace": namespace, "machine": report.machine_info(),
                 "load_avg_start": list(os.getloadavg()),
                 "settings": {"records": n, "repeats": a.repeats, "warmup_records": a.warmup_records,
                              "executors": a.executors, "executor_memory": a.executor_memory,
                              "parallelism": a.parallelism, "input_partitions": 4,
                              "max_offsets_per_trigger": a.max_offsets, "trigger_ms": a.trigger_ms,
                              "record_bytes": KEY_BYTES + VALUE_BYTES, "checkpoint_store": "s3",
                              "executor_cpu": a.executor_cpu, "driver_cpu": a.driver_cpu,
                              "cluster_driver_cpu": a.cluster_driver_cpu, "driver_memory": a.driver_memory,
                              "pods": "real nodes"}}
    runs: list[dict] = []
    bench: Bench | None = None
    say(f"executors benchmark in namespace {namespace}, work dir {work}")
    kubectl.run("create", "namespace", namespace)
    try:
        kubectl.run("label", "namespace", namespace, *RESTRICTED)
        job_rbac(env, kubectl, namespace)
        bench = Bench(a, env, kubectl, namespace, work)
        res["settings"]["node"] = bench.place(env["EOS_NODES"].split(","))
        say(f"every Pod on real node {bench.node}")
        with NodePods(client.CoreV1Api(config.new_client_from_config(config_file=env["KUBECONFIG"])), namespace,
                      work / "kubelet") as kubelet:
            bench.kubelet = kubelet
            bench.operator = cluster.OperatorProcess(env["KUBECONFIG"], namespace, work / "operator.log").start()
            try:
                in_topic = f"bench-exec-in-{bench.run_id}"
                bench.topics.create({in_topic: 4})
                say(f"producing {n:,} records of ~{KEY_BYTES + VALUE_BYTES} bytes into {in_topic} (4 partitions)")
                res["produce_s"] = round(produce_records(bench.bootstrap, in_topic, n), 1)
                ends = input_ends(bench.bootstrap, in_topic)
                if a.warmup_records:
                    warm_topic = f"bench-exec-warm-{bench.run_id}"
                    bench.topics.create({warm_topic: 4})
                    produce_records(bench.bootstrap, warm_topic, a.warmup_records)
                    warm_ends = input_ends(bench.bootstrap, warm_topic)
                    for mode in MODES:
                        say(f"warm-up: {mode} on {a.warmup_records:,} records")
                        r = bench.run(mode, f"warm-{mode}", warm_topic, a.warmup_records, warm_ends)
                        r["warmup"] = True
                        runs.append(r)
                        say(f"  {mode}: end-to-end {r['end_to_end_s']:.1f}s, processing {r['processing_s']:.1f}s")
                for rep in range(1, a.repeats + 1):
                    for mode in (MODES if rep % 2 else MODES[::-1]):
                        label = f"{mode}-{rep}"
                        say(f"repeat {rep}/{a.repeats}: {mode}, {n:,} records (load {os.getloadavg()[0]:.1f})")
                        r = bench.run(mode, label, in_topic, n, ends)
                        r["repeat"] = rep
                        runs.append(r)
                        cu = r["cpu_us_per_record"]
                        say(f"  {mode}: end-to-end {r['end_to_end_s']:.1f}s (startup {r['startup_s']:.1f}s, processing "
                            f"{r['processing_s']:.1f}s = {r['records_per_s_processing']:,} rec/s, {r['batches']} "
                            f"batches); CPU µs/record driver {cu['driver']} executors {cu['executors']} operator "
                            f"{cu['operator']} broker {cu['broker']} nodes {cu['nodes']} forwarder "
                            f"{cu['forwarder']} other {cu['other']}; timeline {r['timeline_s']}; "
                            f"load {r['load_before'][0]:.1f} -> {r['load_after'][0]:.1f}, foreign processes "
                            f"{len(r['foreign_before'])} -> {len(r['foreign_after'])}; output exactly once "
                            f"({r['audit']['records']:,} records, {r['audit']['distinct']:,} keys)")
                res["runs"] = runs
                res["summary"] = summarize(runs, n)
                res["load_avg_end"] = list(os.getloadavg())
                report.add_findings(res, a.findings)
                text = markdown(res)
                out_path.write_text(text)
                say(f"results written to {out_path}")
                print("\n" + text.split("## Raw results")[0])
            finally:
                # While the operator runs: it stops the drivers, their executors go with them.
                kubectl.run("delete", "exactlyoncestream", "--all", "-n", namespace, "--timeout=120s",
                            check=False, timeout=180)
                bench.operator.stop()
    finally:
        if runs and "summary" not in res:
            (work / "partial.json").write_text(json.dumps(runs, indent=1, default=str))
            say(f"partial results in {work / 'partial.json'}")
        for s in kubectl.json("get", "exactlyoncestreams", "-n", namespace)["items"]:
            kubectl.run("patch", "exactlyoncestream", s["metadata"]["name"], "-n", namespace, "--type=merge",
                        "-p", '{"metadata":{"finalizers":null}}', check=False)
        kubectl.run("delete", "namespace", namespace, "--wait=false", check=False)
        if bench is not None:
            say("deleting the benchmark's topics and checkpoints")
            bench.topics.delete_all()
            bench.topics.close()
            Loc.of(f"s3a://{env['S3_BUCKET']}/bench/{namespace}", bench.s3).rmtree()   # those of failed runs
        say(f"logs (operator, driver and executor Pods) kept in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
