"""The unique-id stream exactly once on a real node: its driver is a Pod of the project's image on one of the
stack's kubelets (stack/eos_stack/node.py), in a namespace enforcing ``restricted``, reaching Kafka through
the stack's services address (node_services.py). Mid-stream the Pod is deleted with grace 0: the kubelet
kills every process of the container (the JVM and PySpark's workers, whatever their process groups; checked
in the Pod's cgroup), with transactions in flight. A new driver Pod on the same checkpoint resumes; the output,
read_committed, is every id sent, none twice (``eos_job.verify.audit_ids``, with the ledger and open-transaction
checks of the e2e audit).

The checkpoint is a hostPath PersistentVolume (the test's folder, owned by the image's user) bound to a
claim, mounted at the same path: the host reads the batches the driver commits.
"""
from __future__ import annotations

import os
import subprocess
import time

import pytest
from kubernetes import client, config

from examples.colors.local_run import ColorsRun
from tests.e2e.streams import IdFeed, assert_ids_exact, host_claim, wait_ids
from tests.harness.real_nodes import UID, pod_processes, real_pod, wait_gone, wait_pod

pytestmark = pytest.mark.timeout(1500)


def driver_pod(name: str, run: ColorsRun, claim: str) -> dict:
    body = real_pod(name, ["python", "-m", "eos_job", "run", "--config", str(run.config_path)],
                    env={"TMPDIR": "/tmp/spark", "EOS_TERMINATION_MESSAGE_PATH": "/tmp/spark/termination.json"},
                    grace=60, volumes=[{"name": "work", "persistentVolumeClaim": {"claimName": claim}},
                                       {"name": "scratch", "emptyDir": {}}])
    body["spec"]["containers"][0]["volumeMounts"] = [{"name": "work", "mountPath": str(run.workdir)},
                                                     {"name": "scratch", "mountPath": "/tmp/spark"}]
    return body


def running(pod) -> bool:
    if pod.status.phase in ("Failed", "Succeeded"):
        raise AssertionError(f"the driver Pod ended: {pod.status}")
    return pod.status.phase == "Running"


def wait_batches(run: ColorsRun, v1, ns: str, pod: str, more: int, timeout: float = 420) -> int:
    start, deadline = run.committed_batches(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        if run.committed_batches() >= start + more:
            return run.committed_batches()
        p = v1.read_namespaced_pod(pod, ns)
        if p.status.phase in ("Failed", "Succeeded"):
            raise AssertionError(f"the driver Pod ended: {p.status}\n{v1.read_namespaced_pod_log(pod, ns)[-4000:]}")
        time.sleep(1)
    raise AssertionError(f"no {more} new batches in {timeout:.0f} s\n{v1.read_namespaced_pod_log(pod, ns)[-4000:]}")


def test_unique_ids_exactly_once_through_a_grace_0_pod_deletion_on_a_real_node(stack_env, nodes, namespace,
                                                                                 kubectl, tmp_path, report_result):
    from eos_stack import node_services
    from eos_stack.common import Stack
    env = node_services.pod_env(Stack())     # not .stack/env: test workers rewrite it concurrently
    api = config.new_client_from_config(config_file=stack_env["KUBECONFIG"])
    v1 = client.CoreV1Api(api)
    run = ColorsRun(env["POD_KAFKA_BOOTSTRAP"], tmp_path / "run", parallelism=2, module="examples.colors.ids",
                    max_offsets_per_trigger=400, trigger_interval_ms=500)
    run.setup()
    subprocess.run(["chown", "-R", f"{UID}:{UID}", str(run.workdir)], check=True)
    claim = "work"
    pv = host_claim(kubectl, namespace, claim, run.workdir)
    feed = IdFeed(stack_env["KAFKA_BOOTSTRAP"], run.events, chunk=100, pause=1.0)
    feed.start()
    try:
        v1.create_namespaced_pod(namespace, driver_pod("driver-1", run, claim))
        first = wait_pod(v1, namespace, "driver-1", running, "the first driver Pod to run", timeout=300)
        assert first.spec.node_name in {n.name for n in nodes}, first.spec.node_name
        wait_batches(run, v1, namespace, "driver-1", 3)
        procs = pod_processes(first.metadata.uid)
        assert len(procs) >= 2, f"the driver's processes (JVM, Python) in its Pod's cgroup: {procs}"
        v1.delete_namespaced_pod("driver-1", namespace, grace_period_seconds=0)
        wait_gone(v1, namespace, "driver-1")
        # A grace-0 deletion removes the object at once; the kubelet kills the container after (SIGKILL to every
        # process of it). Start the next driver once none of the old one's processes is left.
        deadline = time.monotonic() + 120
        while (alive := [p for p in procs if os.path.exists(f"/proc/{p}")
                         and open(f"/proc/{p}/stat").read().split()[2] != "Z"]) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not alive, f"processes of the deleted driver still run 120 s after its deletion: {alive}"
        assert not pod_processes(first.metadata.uid), pod_processes(first.metadata.uid)
        pgroups = set(procs.values())
        killed_at = run.committed_batches()
        v1.create_namespaced_pod(namespace, driver_pod("driver-2", run, claim))
        second = wait_pod(v1, namespace, "driver-2", running, "the second driver Pod to run", timeout=300)
        wait_batches(run, v1, namespace, "driver-2", 3)
        expected = feed.finish()
        wait_ids(run.bootstrap, run.counts, expected, lambda: v1.read_namespaced_pod_log("driver-2", namespace)[-4000:],
                 timeout=420)
        v1.delete_namespaced_pod("driver-2", namespace)          # SIGTERM: it stops at a batch boundary
        wait_gone(v1, namespace, "driver-2")
        assert_ids_exact(run, expected)
        report_result(f"real node: {len(expected)} ids exactly once through a grace-0 deletion of the driver Pod "
                      f"(killed after batch {killed_at}, {len(procs)} processes in {len(pgroups)} process groups, on "
                      f"{first.spec.node_name}; resumed on "
                      f"{second.spec.node_name})")
    finally:
        feed.stop_flag.set()
        for name in ("driver-1", "driver-2"):
            try:
                v1.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
            except client.ApiException:
                pass
        kubectl.run("delete", "pvc", claim, "-n", namespace, "--wait=false", check=False)
        kubectl.run("delete", "pv", pv, "--wait=false", check=False)
        api.close()
