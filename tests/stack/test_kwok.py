"""The scale benchmark's KWOK path end to end (``eos_stack.kwok``, ``tests/harness/kwok_drivers.py``), small.

The real operator, API server, scheduler and Kafka; a KWOK fake Node and the one simulator process playing its
driver Pods. Two streams: both driver Pods are scheduled to the fake Node and go Running, the simulator plays
their drivers so the operator reports them Running with committed batches; one driver is killed (its Pod
``Failed`` with exit code 137) and the operator starts the next attempt, which goes on from the checkpoint; the
other's ``restartNonce`` is bumped and its Pod is deleted (KWOK removes it) and replaced. Then every batch's
records are in the sink exactly once (read_committed: no id twice; every id of a committed batch present; none
beyond the batch after it) and each ledger key's batches only grow.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kubernetes import client

from eos_job import checkpoint
from eos_job.verify import ledger_monotone, read_committed
from eos_stack import cluster, kwok
from eos_stack.cluster import wait_until
from examples.colors.manifest import colors_manifest
from tests.harness.kwok_drivers import fail_pod

# Out of `make test` (`make soak` runs it, and `make bench-scale` drives the same path at scale): about a minute
# by the 5-stream benchmark runs (two streams Running with a batch in about 25 s, then a kill, a restart and the
# audit), and KWOK's cold build (about 4 minutes) the first time on a fresh machine.
pytestmark = [pytest.mark.timeout(600), pytest.mark.soak]

GROUP, VERSION, PLURAL = "streaming.eos.dev", "v1beta1", "exactlyoncestreams"
SLOTS = 2


@pytest.fixture
def topics(bootstrap):
    run = uuid.uuid4().hex[:8]
    names = [f"kwok-src-{run}", f"kwok-sink-{run}-a", f"kwok-sink-{run}-b"]
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        for fut in admin.create_topics([NewTopic(t, 1, 1) for t in names], operation_timeout=30).values():
            fut.result(60)
        yield names
        ledgers = [t for t in admin.list_topics(timeout=30).topics
                   if t.startswith(tuple(f"{n}.eos-ledger." for n in names))]
        admin.delete_topics(names + ledgers, operation_timeout=30)


@pytest.fixture
def rig(stack_env, namespace, tmp_path):
    """A fake Node, the simulator (a batch a second) and one operator, for ``namespace``."""
    cluster.Kubectl(stack_env).apply_crds()
    run = uuid.uuid4().hex[:6]
    nodes = kwok.KwokNodes(stack_env["KUBECONFIG"], run, tmp_path / "kwok.log").start()
    with open(tmp_path / "drivers.log", "ab") as out:
        sim = subprocess.Popen([sys.executable, "-m", "tests.harness.kwok_drivers", "--kubeconfig",
                                stack_env["KUBECONFIG"], "--namespace", namespace, "--run", run,
                                "--batch-seconds", "1"], env={**os.environ, "PYTHONPATH": cluster.PYTHONPATH},
                               stdout=out, stderr=subprocess.STDOUT)
    op = cluster.OperatorProcess(stack_env["KUBECONFIG"], namespace, tmp_path / "operator.log").start()
    try:
        yield run, nodes, sim
    finally:
        op.stop()
        sim.send_signal(signal.SIGTERM)
        sim.wait(60)
        nodes.stop()
        for f in ("drivers.log", "operator.log"):
            print(f"----- {f} (tail)\n" + "\n".join((tmp_path / f).read_text(errors="replace").splitlines()[-25:]))


def test_kwok_driver_pods_run_crash_and_restart_exactly_once(stack_env, api, namespace, bootstrap, topics, rig,
                                                             tmp_path):
    run, nodes, sim = rig
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    streams = {"sa": topics[1], "sb": topics[2]}
    for name, sink in streams.items():
        m = colors_manifest(name, bootstrap, topics[0], sink, tmp_path / "ckpt" / name, parallelism=SLOTS,
                            job={"image": "eos-kwok-driver:test", "podTemplate": kwok.pod_template(run)},
                            restartStrategy={"type": "fixed-delay", "fixedDelay": {"attempts": 10, "delaySeconds": 0}})
        m["spec"]["job"].pop("sparkConf")
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, m)

    def status(name: str) -> dict:
        return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name).get("status") or {}

    def committed_past(name: str, batch: int, pod: str) -> bool:
        st = status(name)
        return st.get("lifecycleState") == "Running" and st.get("driverPod") == pod and \
            (st.get("lastCommittedBatch") if st.get("lastCommittedBatch") is not None else -1) > batch

    def running_on_kwok(pod: str) -> bool:
        try:
            p = core.read_namespaced_pod(pod, namespace)
        except client.ApiException:
            return False
        return p.status.phase == "Running" and p.spec.node_name == nodes.names[0]

    def next_driver(name: str, old: str) -> str | None:
        pod = status(name).get("driverPod")
        return pod if pod not in (None, old) and running_on_kwok(pod) else None

    for name in streams:
        wait_until(lambda: running_on_kwok(f"{name}-driver-0"), f"{name}-driver-0 Running on the fake Node", 90)
        wait_until(lambda: committed_past(name, 0, f"{name}-driver-0"), f"{name}: Running, batch 1 committed", 90)
    assert sim.poll() is None, "the simulator exited"

    # A crash: the Pod Failed with 137, as a node reports a SIGKILL; the operator starts the next attempt.
    killed_at = status("sa")["lastCommittedBatch"]
    fail_pod(core, namespace, "sa-driver-0")
    pod = wait_until(lambda: next_driver("sa", "sa-driver-0"), "sa: its next driver Running after the kill", 90)
    wait_until(lambda: committed_past("sa", killed_at + 1, pod), "sa: batches after the kill", 90)

    # A restart: the old Pod deleted (KWOK removes it at once), the next attempt goes on.
    before = status("sb")["lastCommittedBatch"]
    custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "sb", {"spec": {"restartNonce": 1}})
    pod = wait_until(lambda: next_driver("sb", "sb-driver-0"), "sb: its next driver Running after the restart", 90)
    with pytest.raises(client.ApiException) as gone:
        core.read_namespaced_pod("sb-driver-0", namespace)
    assert gone.value.status == 404
    wait_until(lambda: committed_past("sb", before + 1, pod), "sb: batches after the restart", 90)

    # Stop every driver after its running batch, then audit what they wrote.
    sim.send_signal(signal.SIGTERM)
    assert sim.wait(60) == 0
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        for name, sink in streams.items():
            last = checkpoint.last_committed_batch(tmp_path / "ckpt" / name / "live")   # children.checkpoint_dir
            ids = [m.value().decode() for m in read_committed(bootstrap, sink)]
            dupes = sorted({i for i in ids if ids.count(i) > 1})
            assert not dupes, f"{name}: ids written twice: {dupes[:10]}"
            expected = {f"{b}-{s}-0" for b in range(last + 1) for s in range(SLOTS)}
            assert expected <= set(ids), f"{name}: committed batches' ids missing: {sorted(expected - set(ids))[:10]}"
            beyond = set(ids) - expected - {f"{last + 1}-{s}-0" for s in range(SLOTS)}
            assert not beyond, f"{name}: ids of batches never run: {sorted(beyond)[:10]}"
            ledger = next(t for t in admin.list_topics(timeout=30).topics if t.startswith(f"{sink}.eos-ledger."))
            assert ledger_monotone(bootstrap, ledger) == []
