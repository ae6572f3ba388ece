"""The operator on the real stack, continued: driver kills in one run, and GitOps behaviour
(re-apply and server-side apply change nothing; delete and re-create on the same checkpoint resumes
exactly once) with the operator installed by the Helm chart's RBAC and running as its ServiceAccount."""
from __future__ import annotations

import random
import time

import pytest

from eos_job.verify import audit_ids
from examples.colors.generator import expected_ids, produce
from eos_stack.cluster import holds_for, wait_until
from eos_stack.common import free_port
from examples.colors.manifest import colors_manifest
from tests.e2e.streams import (ColorsTopics, Diagnostics, OperatorProcess, assert_ids_exactly_once, colors_stream,
                               wait_ids)

pytestmark = pytest.mark.stack
KILLS = 3   # the lifecycle chaos kills drivers and the operator too, among its other operations


def running_as(kubectl, namespace, name, pod):
    return lambda: (lambda s: s if s.get("driverPod") == pod and s.get("lifecycleState") == "Running"
                    else None)(kubectl.status(namespace, name))


@pytest.mark.soak   # make soak (overlaps the lifecycle chaos driver kills and test_operator_e2e); make test deselects it
@pytest.mark.real_nodes   # the kills: kubelet.kill9, every process of the driver's container (NodePods)
def test_driver_kills_in_one_run_resolve_restart_and_stay_exact(stack_env, nodes, kubectl, namespace, kubelet,
                                                                      on_nodes, operator, tmp_path, report_result):
    diag = Diagnostics(kubectl, namespace, operator, kubelet)
    topics = ColorsTopics(stack_env["KAFKA_BOOTSTRAP"])
    name = "colors"
    rng = random.Random(5)
    produce(topics.bootstrap, topics.events, 2000)
    expected = expected_ids(2000)
    kubectl.apply(on_nodes.place(colors_stream(name, topics, tmp_path / "checkpoint", attempts=10, delay=1.0,
                                              module="examples.colors.ids")), namespace)
    sent = 2000
    for kill in range(KILLS):
        pod = f"colors-driver-{kill}"
        wait_until(running_as(kubectl, namespace, name, pod), f"{pod} to run", 180, diag)
        produce(topics.bootstrap, topics.events, 1000, seed=100 + kill, start_id=sent)
        expected |= expected_ids(1000, 100 + kill, sent)
        sent += 1000
        time.sleep(rng.uniform(2, 12))  # start-up, recovery or mid-batch: any moment
        assert kubelet.kill9(namespace, pod), f"{pod} had no process to kill (it exited on its own):\n{diag()}"
    status = wait_until(running_as(kubectl, namespace, name, f"colors-driver-{KILLS}"), "the last restart", 180,
                        diag)
    assert status["restartCount"] == KILLS
    wait_ids(topics.bootstrap, topics.counts, expected, diag)
    assert_ids_exactly_once(topics.bootstrap, topics.counts, topics.ledger(namespace, name), expected, (topics.dlq,))
    reasons = kubectl.events(namespace, name)
    assert reasons.count("DriverFailed") == KILLS and reasons.count("Restarting") == KILLS
    # Every start was preceded by its resolution.
    starts = [i for i, r in enumerate(reasons) if r == "Submitted"]
    assert len(starts) == KILLS + 1
    for i in starts:
        assert "Resolved" in reasons[:i][-3:], reasons
    report_result(f"operator: {KILLS} driver SIGKILLs in one run, each resolved and restarted; all {len(expected)} ids of "
                  "the unique-id stream exactly once")


def assert_healthy_to_gitops(stack_env, kubectl, namespace, name):
    """The live stream as GitOps tools see it: `kubectl wait` as the chart README shows it, then Argo CD's health
    (the chart's Lua in gopher-lua) and kstatus (Flux) of the object the API server returns."""
    from eos_stack.gitops import check
    for condition in ("--for=condition=Ready", "--for=condition=Reconciling=false", "--for=condition=Stalled=false",
                      "--for=jsonpath={.status.lifecycleState}=Running"):
        kubectl.run("wait", condition, f"exactlyoncestream/{name}", "-n", namespace, "--timeout=120s", timeout=180)
    (result,) = check(stack_env["GITOPS_CHECK"], [kubectl.stream(namespace, name)])
    assert (result["argocd"]["status"], result["kstatus"]["status"]) == ("Healthy", "Current"), result


@pytest.mark.real_nodes   # no Pod runs; the operator's Pods would go to the real nodes
def test_gitops_health_of_what_the_operator_writes_without_a_driver(stack_env, nodes, kubectl, namespace, operator,
                                                                     tmp_path):
    """Real documents that need no Spark: the operator's status for a stream created suspended, for one only the
    operator finds invalid (its default ledger topic would pass Kafka's 249 characters in this namespace), and
    for a snapshot that fails (its stream never ran). kubectl wait as the chart README shows it, and both GitOps
    tools on what the API server returns."""
    from eos_stack.gitops import check
    diag = Diagnostics(kubectl, namespace, operator)
    bootstrap = stack_env["KAFKA_BOOTSTRAP"]
    parked = colors_manifest("parked", bootstrap, "gitops-events", "gitops-counts", tmp_path / "parked",
                             job={"state": "suspended"})
    long_name = "l" * 50   # 50 + 179 fits the CRD's 235; with ".eos-ledger.<namespace>." the ledger topic does not
    too_long = colors_manifest(long_name, bootstrap, "gitops-events", "t" * 179, tmp_path / "long")
    for manifest in (parked, too_long):
        kubectl.apply(manifest, namespace)
    kubectl.apply({"apiVersion": "streaming.eos.dev/v1beta1", "kind": "ExactlyOnceSnapshot",
                   "metadata": {"name": "parked-now"}, "spec": {"stream": "parked", "maxRetries": 0}}, namespace)
    waits = [("exactlyoncestream/parked", "--for=jsonpath={.status.lifecycleState}=Suspended"),
             ("exactlyoncestream/parked", "--for=condition=Stalled=false"),
             (f"exactlyoncestream/{long_name}", "--for=condition=Stalled"),
             ("exactlyoncesnapshot/parked-now", "--for=condition=Stalled"),
             ("exactlyoncesnapshot/parked-now", "--for=jsonpath={.status.state}=Failed")]
    for ref, condition in waits:
        proc = kubectl.run("wait", condition, ref, "-n", namespace, "--timeout=120s", check=False, timeout=180)
        assert proc.returncode == 0, f"kubectl wait {condition} {ref}: {proc.stderr}\n{diag()}"
    docs = [kubectl.stream(namespace, "parked"), kubectl.stream(namespace, long_name),
            kubectl.json("get", "exactlyoncesnapshot", "parked-now", "-n", namespace)]
    verdicts = [(r["argocd"]["status"], r["kstatus"]["status"]) for r in check(stack_env["GITOPS_CHECK"], docs)]
    assert verdicts == [("Suspended", "InProgress"), ("Degraded", "Failed"), ("Degraded", "Failed")], (verdicts, docs)
    invalid = next(c for c in docs[1]["status"]["conditions"] if c["type"] == "Stalled")
    assert invalid["reason"] == "InvalidSpec" and "249" in invalid["message"], invalid


@pytest.fixture
def chart_operator(stack_env, namespace, kubelet, tmp_path):
    """`helm install` of the chart for this namespace; the operator runs with its ServiceAccount's token."""
    from tests.chart.e2e_under_chart_identity import chart_identity
    sa_kubeconfig = chart_identity(namespace, tmp_path)
    op = OperatorProcess(str(sa_kubeconfig), namespace, tmp_path / "operator.log", liveness_port=free_port())
    op.switches = {**op.switches, "KUBECONFIG": str(sa_kubeconfig)}
    yield op.start()
    op.stop()


@pytest.mark.real_nodes
def test_gitops_reapply_server_side_apply_and_recreate(stack_env, nodes, kubectl, namespace, kubelet, chart_operator,
                                                       on_nodes, tmp_path):
    """The unique-id stream with its driver Pods on the real nodes and its checkpoint in the bucket (keys in a
    Secret the chart's operator reads with its own identity)."""
    operator = chart_operator
    diag = Diagnostics(kubectl, namespace, operator, kubelet)
    assert "system:serviceaccount" in kubectl.run("auth", "whoami", "--kubeconfig",
                                                  str(operator.kubeconfig)).stdout
    topics = ColorsTopics(stack_env["KAFKA_BOOTSTRAP"])
    name = "colors"
    manifest = on_nodes.place(colors_stream(name, topics, tmp_path / "checkpoint", module="examples.colors.ids"))
    produce(topics.bootstrap, topics.events, 3000)
    expected = expected_ids(3000)
    kubectl.apply(manifest, namespace)
    wait_until(running_as(kubectl, namespace, name, "colors-driver-0"), "the stream to run", 180, diag)
    assert_healthy_to_gitops(stack_env, kubectl, namespace, name)
    wait_until(lambda: len(audit_ids(topics.bootstrap, topics.counts, expected).missing) < len(expected),
               "first output", 240, diag, 2)

    before = kubectl.stream(namespace, name)
    pod_uid = kubectl.json("get", "pod", "colors-driver-0", "-n", namespace)["metadata"]["uid"]
    events_before = kubectl.events(namespace, name)
    # The same manifest again, client-side and server-side: nothing changes, nothing restarts.
    out = kubectl.apply(manifest, namespace).stdout
    assert "unchanged" in out, out
    import yaml
    kubectl.run("apply", "--server-side", "--field-manager=gitops", "--force-conflicts", "-n", namespace, "-f", "-",
                stdin=yaml.safe_dump(manifest))
    # Several reconcile periods, the driver Pod the same one all along.
    holds_for(lambda: kubectl.json("get", "pod", "colors-driver-0", "-n", namespace)["metadata"]["uid"] == pod_uid,
              "the same driver Pod", 15, interval=1)
    after = kubectl.stream(namespace, name)
    assert after["metadata"]["generation"] == before["metadata"]["generation"]  # nobody wrote spec
    assert after["spec"] == before["spec"]
    assert kubectl.json("get", "pod", "colors-driver-0", "-n", namespace)["metadata"]["uid"] == pod_uid
    new_events = kubectl.events(namespace, name)[len(events_before):]
    assert not {"Submitted", "Restarting", "Resolved", "Upgrading"} & set(new_events), new_events
    # The only writers of spec are the two appliers; the operator owns status and metadata only.
    spec_writers = {f["manager"] for f in after["metadata"].get("managedFields", [])
                    if "f:spec" in str(f.get("fieldsV1")) and f.get("subresource") != "status"}
    assert spec_writers <= {"kubectl-client-side-apply", "kubectl", "gitops"}, spec_writers

    # Delete (graceful stop, checkpoint kept), more input, re-create with the same name and checkpoint.
    kubectl.run("delete", "exactlyoncestream", name, "-n", namespace, "--timeout=120s")
    wait_until(lambda: not kubectl.pods(namespace), "the driver to go", 120, diag)
    produce(topics.bootstrap, topics.events, 2000, seed=21, start_id=3000)
    expected |= expected_ids(2000, 21, 3000)
    kubectl.apply(manifest, namespace)
    wait_ids(topics.bootstrap, topics.counts, expected, diag)
    status = kubectl.status(namespace, name)
    assert status["resolution"]["checkpointLastCommittedBatch"] is not None  # it resumed, not restarted
    assert_healthy_to_gitops(stack_env, kubectl, namespace, name)
    assert_ids_exactly_once(topics.bootstrap, topics.counts, topics.ledger(namespace, name), expected, (topics.dlq,))
