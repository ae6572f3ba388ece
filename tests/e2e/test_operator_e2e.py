"""The operator on the real stack: kube-apiserver, Kafka, the real nodes and the real job runtime.

Each test gets its own namespace and its own operator process (``python -m eos_operator run
--namespace NS``, through a small wrapper that can slow resolution down or die right
after a Pod create, to kill the operator at exact points of a launch). Every Pod runs on the real nodes
(kubelet + containerd, the project's image), the checkpoints in the stack's bucket (tests/e2e/on_nodes.py); the
exhausted-restarts test's operator is the chart's Deployment, on the nodes too.
"""
from __future__ import annotations

from eos_job.spec import stream_uid  # noqa: E402
import json
import os
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
for extra in (REPO / "operator", REPO / "jobs", REPO):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from eos_job.verify import audit_counts  # noqa: E402
from eos_stack.cluster import condition, holds_for, wait_until  # noqa: E402
from eos_stack import registry  # noqa: E402
from eos_stack.common import Stack  # noqa: E402
from eos_stack.image import build_on_project_image  # noqa: E402
from examples.colors.generator import produce  # noqa: E402
from tests.e2e.exactness import assert_exactly_once  # noqa: E402
from tests.e2e.planted import kubectl_eos, plant_duplicate, plant_loss  # noqa: E402
from tests.e2e.streams import ColorsTopics, Diagnostics, OperatorProcess, colors_stream, host_claim  # noqa: E402

pytestmark = pytest.mark.stack

INVALID = sorted((REPO / "tests" / "operator" / "invalid").glob("*.yaml"))
# The runtime's log line on SIGTERM: the driver was asked to stop at a batch boundary (a graceful
# delete), not SIGKILLed. Whether the stop then completes cleanly is the runtime's business (its own tests).
GRACEFUL = "received SIGTERM: stopping at the next clean batch boundary"



# ----------------------------------------------------------------------- tests
@pytest.mark.real_nodes   # no Pod runs; the operator's Pods would go to the real nodes
def test_invalid_resources_are_rejected_naming_the_field(nodes, kubectl, namespace, operator):
    diag = Diagnostics(kubectl, namespace, operator)
    health = wait_until(lambda: urllib.request.urlopen(
        f"http://127.0.0.1:{operator.liveness_port}/healthz", timeout=2).status, "the liveness endpoint", 60, diag)
    assert health == 200
    by_operator = []
    for path in INVALID:
        doc = yaml.safe_load(path.read_text())
        ann = doc["metadata"]["annotations"]
        field, by = ann["test.eos.dev/expect-field"], ann["test.eos.dev/rejected-by"]
        result = kubectl.apply(doc, namespace, check=False)
        if by in ("schema", "cel"):
            assert result.returncode != 0, f"the API server accepted {path.name}"
            assert field in result.stderr, f"{path.name}: {result.stderr}"
        else:
            assert result.returncode == 0, f"{path.name} should pass the schema: {result.stderr}"
            by_operator.append((doc["metadata"]["name"], field))
    assert len(by_operator) >= 5
    for name, field in by_operator:
        ready = wait_until(lambda: (lambda c: c if c.get("reason") == "InvalidSpec" else None)(
            condition(kubectl.status(namespace, name), "Ready")), f"{name} to be InvalidSpec", 60, diag)
        assert ready["status"] == "False" and field in ready["message"], ready
        assert kubectl.status(namespace, name)["lifecycleState"] == "Invalid"
        messages = kubectl.event_messages(namespace, name, "InvalidSpec")
        assert messages and field in messages[0], messages
        assert "hunter2" not in json.dumps(kubectl.status(namespace, name)) + " ".join(messages)
    # The operator did nothing else: no Pods, no ConfigMaps of ours.
    assert kubectl.pods(namespace) == []
    cms = kubectl.json("get", "configmaps", "-n", namespace, "-l", "app.kubernetes.io/managed-by=eos-operator")
    assert cms["items"] == []
    for name, _ in by_operator:
        # Generous: under CI load one API call of the operator can take a while (30 s timeout, retried).
        kubectl.run("delete", "exactlyoncestream", name, "-n", namespace, "--timeout=180s", timeout=240)


def test_names_longer_than_derived_names_allow_are_rejected_by_the_api_server(kubectl, namespace):
    """The driver's Service is <stream>-driver and snapshot names are Pod label values: the CRDs cap the names
    (the generated snapshot names of a stream with the longest allowed name are shortened with a hash)."""
    kubectl.apply_crds()
    stream = yaml.safe_load((REPO / "examples" / "colors.yaml").read_text())
    snapshot = {"apiVersion": stream["apiVersion"], "kind": "ExactlyOnceSnapshot", "spec": {"stream": "colors"}}
    for doc, limit in ((stream, 56), (snapshot, 63)):
        for length, accepted in ((limit, True), (limit + 1, False)):
            named = {**doc, "metadata": {"name": "n" * length}}
            dry = kubectl.run("apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(named),
                              check=False)
            assert (dry.returncode == 0) == accepted, (doc["kind"], length, dry.stderr)
            if not accepted:
                assert f"metadata.name must be at most {limit} characters" in dry.stderr, dry.stderr


@pytest.mark.soak   # make soak (overlaps the lifecycle chaos: kills, suspend-resume, delete); make test deselects it
@pytest.mark.real_nodes
def test_kill_restart_suspend_resume_delete(stack_env, kubectl, namespace, kubelet, on_nodes, operator, tmp_path):
    """The driver on the real nodes, its checkpoint in the bucket: SIGKILL of every process of its container (the
    JVM and PySpark's workers, through the container's cgroup: ``kubelet.kill9``), resolution, a new driver; then
    suspend (a graceful stop), resume and delete; exactly-once counts after each."""
    diag = Diagnostics(kubectl, namespace, operator, kubelet)
    topics = ColorsTopics(stack_env["KAFKA_BOOTSTRAP"])
    name = "colors"
    expected = produce(topics.bootstrap, topics.events, 3000)
    kubectl.apply(on_nodes.place(colors_stream(name, topics, tmp_path / "checkpoint")), namespace)

    status = wait_until(lambda: (lambda s: s if s.get("lifecycleState") == "Running" else None)(
        kubectl.status(namespace, name)), "the stream to run", 120, diag)
    assert status["driverPod"] == "colors-driver-0"
    assert condition(status, "Ready")["status"] == "True"
    assert status["resolution"]["streamUid"] == stream_uid(namespace, name)
    run = kubectl.json("get", "configmap", "colors-run", "-n", namespace)
    run_cfg = json.loads(run["data"]["run.json"])
    assert run_cfg["checkpointDir"] == f"s3a://{stack_env['S3_BUCKET']}/e2e/{namespace}/{name}/live", run_cfg
    assert run_cfg["stream"]["name"] == name
    pod = kubectl.json("get", "pod", "colors-driver-0", "-n", namespace)
    assert pod["spec"]["containers"][0]["args"] == ["python", "-m", "eos_job", "run", "--config-env",
                                                       "EOS_RUN_CONFIG"]
    assert pod["metadata"]["ownerReferences"][0]["name"] == name
    assert kubectl.events(namespace, name)[:3] == ["Resolved", "Submitted", "Running"]
    table = kubectl.run("get", "eos", name, "-n", namespace).stdout
    assert table.split()[:6] == ["NAME", "STATE", "READY", "BATCH", "RESTARTS", "AGE"], table
    assert "Running" in table.splitlines()[1]

    # Wait for output, then SIGKILL the driver: resolution first, then a new driver.
    wait_until(lambda: audit_counts(topics.bootstrap, topics.counts).final, "first output", 240, diag, 2)
    assert kubelet.kill9(namespace, "colors-driver-0")
    status = wait_until(lambda: (lambda s: s if s.get("driverPod") == "colors-driver-1"
                                 and s.get("lifecycleState") == "Running" else None)(kubectl.status(namespace, name)),
                        "the restart after kill -9", 120, diag)
    assert status["restartCount"] == 1
    assert "exit code 137" in status["lastError"]
    reasons = kubectl.events(namespace, name)
    assert reasons.count("Resolved") >= 2 and reasons.count("Submitted") == 2
    for reason in ("DriverFailed", "Restarting"):
        assert reason in reasons
    after_kill = reasons[reasons.index("DriverFailed"):]
    assert after_kill.index("Resolved") < after_kill.index("Submitted")      # resolution before the start
    # Never two drivers: the killed one is kept for its log (Failed) until the next commits past its last batch.
    phases = {p["metadata"]["name"]: p["status"].get("phase") for p in kubectl.pods(namespace)}
    assert [n for n, ph in phases.items() if ph != "Failed"] == ["colors-driver-1"], phases
    assert set(phases) <= {"colors-driver-0", "colors-driver-1"}, phases

    more = produce(topics.bootstrap, topics.events, 2000, seed=11, start_id=3000)
    expected = {c: expected.get(c, 0) + more.get(c, 0) for c in set(expected) | set(more)}
    wait_until(lambda: audit_counts(topics.bootstrap, topics.counts).final == expected, "the output to catch up",
               300, diag, 2)
    assert_exactly_once(topics.bootstrap, topics.counts, topics.ledger(namespace, name), expected, (topics.dlq,))
    # Progress from the ledger, in status and in `kubectl get`.
    batch = wait_until(lambda: (lambda b: (b,) if b is not None else None)(
        kubectl.status(namespace, name).get("lastCommittedBatch")), "lastCommittedBatch", 60, diag)[0]
    row = kubectl.run("get", "eos", name, "-n", namespace, "--no-headers").stdout.split()
    assert row[:3] == [name, "Running", "Running"] and int(row[3]) >= batch and row[4] == "1", row

    # Suspend: a graceful stop at a batch boundary, then no driver.
    kubectl.patch_spec(namespace, name, {"job": {"state": "suspended"}})
    wait_until(lambda: kubectl.status(namespace, name).get("lifecycleState") == "Suspended"
               and not kubectl.pods(namespace), "the stream to suspend", 120, diag)
    assert GRACEFUL in kubelet.wait_log(namespace, "colors-driver-1")
    assert "Suspended" in kubectl.events(namespace, name)
    assert condition(kubectl.status(namespace, name), "Ready")["reason"] == "Suspended"

    # Resume: resolution first, a new driver, the counters untouched.
    resolved_before = kubectl.events(namespace, name).count("Resolved")
    kubectl.patch_spec(namespace, name, {"job": {"state": "running"}})
    status = wait_until(lambda: (lambda s: s if s.get("lifecycleState") == "Running" else None)(
        kubectl.status(namespace, name)), "the stream to resume", 120, diag)
    assert status["driverPod"] == "colors-driver-2" and status["restartCount"] == 1
    reasons = kubectl.events(namespace, name)
    assert "Resumed" in reasons and reasons.count("Resolved") == resolved_before + 1
    more = produce(topics.bootstrap, topics.events, 1000, seed=12, start_id=5000)
    expected = {c: expected.get(c, 0) + more.get(c, 0) for c in set(expected) | set(more)}
    wait_until(lambda: audit_counts(topics.bootstrap, topics.counts).final == expected,
               "the output after the resume", 300, diag, 2)
    assert_exactly_once(topics.bootstrap, topics.counts, topics.ledger(namespace, name), expected, (topics.dlq,))

    # Delete: the driver stops gracefully, the children go, the checkpoint stays.
    kubectl.run("delete", "exactlyoncestream", name, "-n", namespace, "--timeout=120s")
    assert kubectl.pods(namespace) == []
    assert kubectl.run("get", "configmap", "colors-run", "-n", namespace, check=False).returncode != 0
    assert "live/offsets/0" in on_nodes.checkpoint_files(name, "live/offsets")
    assert GRACEFUL in kubelet.wait_log(namespace, "colors-driver-2")


@pytest.mark.real_nodes
def test_exhausted_restarts_fail_then_restart_nonce_resumes(stack_env, nodes, kubectl, namespace, kubelet,
                                                            chart_operator, on_nodes, tmp_path):
    """A sink that is down exhausts the restart strategy; a nonce resumes once it is back; then a snapshot
    upgrade. The checkpoint is on a bound claim (a hostPath volume of this machine, which the real nodes'
    kubelet mounts: the stack runs no provisioner), which the operator reads only through probe Pods.

    As users run it: the operator is the chart's Deployment, and every Pod (the operator's, the drivers, the
    probe, snapshot and check Pods) is a container of the project's image on the real nodes, in a namespace
    that enforces the ``restricted`` Pod Security level."""
    operator = chart_operator
    diag = Diagnostics(kubectl, namespace, operator, kubelet)
    topics = ColorsTopics(stack_env["KAFKA_BOOTSTRAP"], create_sink=False)   # the sink is "down"
    name = "stuck"
    # The checkpoint on a claim (a hostPath volume the controller manager binds): only the stream's Pods mount
    # it, at a path this machine does not have; the operator reads it through its probe Pods.
    pv = host_claim(kubectl, namespace, "stuck-ckpt", tmp_path / "volume")
    # A hostPath volume keeps its owner (Kubernetes applies no fsGroup to it): the image's user must own it.
    os.chown(tmp_path / "volume", 10001, 10001)
    manifest = on_nodes.place(colors_stream(name, topics, tmp_path / "checkpoint", attempts=1, delay=1))
    manifest["spec"]["checkpoint"] = {"store": "pvc", "claimName": "stuck-ckpt", "path": f"/eos-e2e-claims/{namespace}"}
    manifest["spec"].update(upgradeMode="snapshot", upgradePreFlight=False)
    kubectl.apply(manifest, namespace)
    status = wait_until(lambda: (lambda s: s if s.get("lifecycleState") == "Failed" else None)(
        kubectl.status(namespace, name)), "restarts to be exhausted", 180, diag)
    ready = condition(status, "Ready")
    assert ready["status"] == "False" and ready["reason"] == "RestartsExhausted"
    assert status["restartCount"] == 1
    assert topics.counts in status["lastError"] or "sink" in status["lastError"].lower(), status["lastError"]
    assert status["lastError"] in ready["message"]
    reasons = kubectl.events(namespace, name)
    assert "RestartsExhausted" in reasons and reasons.count("DriverFailed") + reasons.count("ResolutionFailed") == 2
    # It stays Failed: nothing more is started, over a few reconcile periods.
    holds_for(lambda: kubectl.status(namespace, name)["lifecycleState"] == "Failed"
              and all(p["status"]["phase"] == "Failed" for p in kubectl.pods(namespace)
                      if p["metadata"]["name"].startswith(f"{name}-")),
              "Failed with no new driver", 6, diag, 1)

    # The failed driver's Pod is kept with its log, and the DriverFailed event says where.
    failed = status["failedDriver"]["pod"]
    assert failed == status["driverPod"] and f"kubectl logs -n {namespace} {failed}" in " ".join(
        kubectl.event_messages(namespace, name, "DriverFailed"))

    # The sink comes back; the user asks for a restart with a new nonce.
    topics.create_sink()
    expected = produce(topics.bootstrap, topics.events, 1000)
    kubectl.patch_spec(namespace, name, {"restartNonce": 1})
    wait_until(lambda: kubectl.status(namespace, name).get("driverPod") not in (None, failed),
               "the next driver to be created", 120, diag)
    # The failed Pod is still there while its successor starts (it ended: never two drivers), log and all.
    assert kubectl.json("get", "pod", failed, "-n", namespace)["status"]["phase"] == "Failed"
    assert kubelet.log_path(namespace, failed).stat().st_size > 0
    status = wait_until(lambda: (lambda s: s if s.get("lifecycleState") == "Running" else None)(
        kubectl.status(namespace, name)), "the stream to resume after the nonce", 120, diag)
    assert status["restartCount"] == 0 and status["observedRestartNonce"] == 1
    # Containers of the image, not processes: the driver's and the operator's (the chart's Deployment).
    for pod in (status["driverPod"], operator.pod):
        cid = kubectl.json("get", "pod", pod, "-n", namespace)["status"]["containerStatuses"][0].get("containerID")
        assert cid and cid.startswith("containerd://"), (pod, cid)
    assert [p["metadata"]["name"] for p in kubectl.pods(namespace) if "-driver-" in p["metadata"]["name"]
            and p["status"]["phase"] != "Failed"] == [status["driverPod"]]
    wait_until(lambda: audit_counts(topics.bootstrap, topics.counts).final == expected, "the output", 300, diag, 2)
    # The new driver committed batches: the failed Pod goes.
    wait_until(lambda: failed not in [p["metadata"]["name"] for p in kubectl.pods(namespace)]
               and kubectl.status(namespace, name).get("failedDriver") is None,
               f"{failed} to be removed after its successor committed", 120, diag, 2)
    assert_exactly_once(topics.bootstrap, topics.counts, topics.ledger(namespace, name), expected, (topics.dlq,))

    # A snapshot upgrade on the claim, to a user's job in an image of its own (examples/job-image: FROM the
    # project's image, the team's module my_colors added): the old driver stops with a snapshot, a check Pod
    # verifies it where the claim is mounted (the operator mounts nothing), and the new driver, a container of
    # the user's image, resumes from it; its resolution knows the restored checkpoint from the probe Pod's reading.
    local_image = "localhost/eos-examples/my-colors:e2e"
    build_on_project_image(Stack(), REPO / "examples" / "job-image", tag=local_image)
    job_image = registry.ensure_image(Stack(), local_image)   # the nodes' kubelet pulls it from the registry
    before = kubectl.status(namespace, name)
    committed, attempt = before["lastCommittedBatch"], before["driverAttempt"]
    kubectl.patch_spec(namespace, name, {"job": {"image": job_image, "module": "my_colors.job",
                                                 "args": {"version": "v2"}}})
    # A newer attempt than the running one: the status read right after the patch may not show the upgrade yet.
    status = wait_until(lambda: (lambda s: s if s.get("lifecycleState") == "Running"
                                 and s.get("driverAttempt", 0) > attempt and not s.get("upgrade") else None)(
                            kubectl.status(namespace, name)),
                        "the upgraded driver to run", 180, diag)
    events = kubectl.events(namespace, name)
    assert "SnapshotTaken" in events and "SnapshotUnverified" not in events, events
    res = status["resolution"]
    assert res["checkpointReadable"] is True and res["checkpointId"], res
    assert res["checkpointLastCommittedBatch"] is not None and res["checkpointLastCommittedBatch"] >= committed, res
    assert list((tmp_path / "volume" / "snapshots").iterdir()), "the snapshot is on the volume"
    driver = kubectl.json("get", "pod", status["driverPod"], "-n", namespace)
    assert driver["spec"]["containers"][0]["image"] == job_image, driver["spec"]["containers"][0]
    assert driver["status"]["containerStatuses"][0]["containerID"].startswith("containerd://")
    more = produce(topics.bootstrap, topics.events, 500, seed=9, start_id=1000)
    expected = {c: expected.get(c, 0) + more.get(c, 0) for c in expected.keys() | more.keys()}
    wait_until(lambda: audit_counts(topics.bootstrap, topics.counts).final == expected, "the output after the "
               "upgrade", 300, diag, 2)
    assert_exactly_once(topics.bootstrap, topics.counts, topics.ledger(namespace, name), expected, (topics.dlq,))
    print(f"\nsnapshot upgrade on the claim: {kubectl.event_messages(namespace, name, 'SnapshotTaken')[-1]}; "
          f"resolution: {res['summary']}")

    # `kubectl eos verify` on the live stream: exact across both runs (before and after the upgrade); then its
    # negative controls on the same sink: a planted duplicate and a planted loss, each named by batch and slot.
    eos = kubectl_eos(kubectl, namespace)
    ok = eos("-o", "json", "verify", name)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    report = json.loads(ok.stdout)
    assert report["exact"] and report["unlabelled"] == 0 and report["digestsChecked"] > 0, report
    doubled = plant_duplicate(topics.bootstrap, topics.counts)
    lost = plant_loss(topics.bootstrap, topics.counts)
    assert doubled != lost
    bad = eos("-o", "json", "verify", name)
    assert bad.returncode == 6, bad.stdout + bad.stderr
    found = {(f["kind"], f["run"], f["slot"], f["batch"]) for f in json.loads(bad.stdout)["findings"]}
    assert found == {("extra", *doubled), ("missing", *lost)}, found
    print(f"kubectl eos verify: {report['summary']}; planted: "
          f"{eos('verify', name).stdout.strip()}")
    kubectl.run("delete", "exactlyoncestream", name, "-n", namespace, "--timeout=120s")
    kubectl.run("delete", "pvc", "stuck-ckpt", "-n", namespace, "--timeout=60s")
    kubectl.run("delete", "pv", pv, "--timeout=60s")


@pytest.mark.real_nodes
def test_operator_killed_during_launch_leaves_exactly_one_driver(stack_env, kubectl, namespace, kubelet, on_nodes,
                                                                 tmp_path):
    """The operator killed (SIGKILL of its process) while resolving a launch, then right after creating the driver
    Pod: a healthy operator finds the Pod it created and adopts it; one driver Pod ever ran. The driver runs on the
    real nodes (kubelet + containerd), its checkpoint in the stack's bucket; ``kubelet.log_dir`` holds the log of
    every Pod whose container started."""
    log = tmp_path / "operator.log"
    topics = ColorsTopics(stack_env["KAFKA_BOOTSTRAP"])
    name = "colors"
    # 1. Killed while resolving: the launch is recorded, no Pod exists yet.
    slow = OperatorProcess(stack_env["KUBECONFIG"], namespace, log, EOS_TEST_RESOLVE_DELAY="30").start()
    diag = Diagnostics(kubectl, namespace, slow, kubelet)
    try:
        kubectl.apply(on_nodes.place(colors_stream(name, topics, tmp_path / "checkpoint")), namespace)
        status = wait_until(lambda: (lambda s: s if s.get("pendingLaunch") else None)(
            kubectl.status(namespace, name)), "the launch to be recorded", 60, diag, 0.2)
        assert status["pendingLaunch"]["pod"] == "colors-driver-0"
        wait_until(lambda: condition(kubectl.status(namespace, name), "Progressing")["reason"] == "Resolving",
                   "the launch to be resolving", 10, diag, 0.2)
    finally:
        slow.kill9()
    assert kubectl.pods(namespace) == []

    # 2. Killed right after creating the Pod, before recording it.
    crashing = OperatorProcess(stack_env["KUBECONFIG"], namespace, log, EOS_TEST_CRASH_AFTER_CREATE="1").start()
    diag.operator = crashing
    try:
        wait_until(lambda: not crashing.alive(), "the operator to die after the create", 90, diag)
    finally:
        crashing.kill9()
    assert crashing.proc.returncode == 137, crashing.tail()
    assert [p["metadata"]["name"] for p in kubectl.pods(namespace)] == ["colors-driver-0"]
    assert kubectl.status(namespace, name)["pendingLaunch"]["pod"] == "colors-driver-0"

    # 3. A healthy operator picks up where the status says it was: the same Pod, no second one.
    healthy = OperatorProcess(stack_env["KUBECONFIG"], namespace, log).start()
    diag.operator = healthy
    try:
        status = wait_until(lambda: (lambda s: s if s.get("lifecycleState") == "Running" else None)(
            kubectl.status(namespace, name)), "the stream to run", 120, diag)
        assert status["driverPod"] == "colors-driver-0" and "pendingLaunch" not in status
        assert status["restartCount"] == 0
        assert [p["metadata"]["name"] for p in kubectl.pods(namespace)] == ["colors-driver-0"]
        assert kubectl.events(namespace, name).count("Submitted") == 1
        assert [p.name for p in sorted(kubelet.log_dir.glob(f"{namespace}_*.log"))] == [
            f"{namespace}_colors-driver-0.log"]                     # one driver Pod ever ran
        expected = produce(topics.bootstrap, topics.events, 1000)
        wait_until(lambda: audit_counts(topics.bootstrap, topics.counts).final == expected, "the output", 300,
                   diag, 2)
        kubectl.run("delete", "exactlyoncestream", name, "-n", namespace, "--timeout=120s")
    finally:
        healthy.stop()
