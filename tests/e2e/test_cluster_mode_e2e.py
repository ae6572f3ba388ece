"""Executors on Kubernetes: the unique-id stream in ``deployMode: cluster`` with its checkpoint on S3.

The production shape, end to end on the local stack: the driver Pod (the job's ServiceAccount, its RBAC
rendered from the chart) runs Spark's Kubernetes scheduler against the API server as an in-cluster Pod does
(KUBERNETES_SERVICE_HOST/PORT and the ServiceAccount token the process kubelet mounts); Spark creates two
executor Pods owned by the driver Pod; the process kubelet runs them through the image's entrypoint
(``docker/entrypoint.sh executor``). In ``make test`` every Pod is a container of the image ``make image``
built (``containers`` mark: tests/harness/containers.py), so the image's entrypoint, user, jars and read-only
root are what runs. The checkpoint, state store included, lives in the S3 bucket.

First the job's Role lacks ``create pods``: the driver waits for an executor in vain and fails naming the
missing rule, which reaches the stream's status; the chart's Role is then applied and the restart strategy's
next driver runs. Kills: an executor SIGKILLed while batches run (Spark retries its tasks on the other executor or on the
replacement it requests), then the driver SIGKILLed (its executors lose their driver and end; the operator
resolves and restarts), then the S3 server stopped for 15 s while input arrives (S3A's retries are set short: the
query fails, and the restart strategy carries the stream through; the S3 server is the test's own, so the
tests running beside it keep theirs). At the end every id is in the sink exactly once (set equality, read_committed), and
deleting the stream collects every executor Pod through its owner reference.
"""
from __future__ import annotations

import base64
import subprocess
import time
from collections import Counter

import pytest
import yaml

from eos_job.memory import quantity
from eos_job.verify import audit_counts

from eos_stack import s3 as s3_server
from eos_stack.cluster import wait_until
from examples.colors.generator import expected_ids, produce
from tests.e2e.exactness import assert_exactly_once
from tests.e2e.streams import (REPO, ColorsTopics, Diagnostics, assert_ids_exactly_once, colors_stream,
                               wait_ids)

NAME = "colors"
# Split by the operator into spark.executor.memory and memoryOverhead adding up to it (eos_job.memory): the
# executor Pods Spark makes have it as their memory request and limit.
EXECUTOR_MEMORY = "1Gi"
OUTAGE_S = 15.0   # the S3 server away for dozens of triggers
SA = "spark-eos-driver"


def job_rbac(stack_env, kubectl, namespace: str, *, without_pod_create: bool = False) -> None:
    """The chart's job identity for ``namespace`` (ServiceAccount, Role, RoleBinding), rendered by helm;
    ``without_pod_create``: its Role with ``create pods`` taken out."""
    out = subprocess.run([stack_env["HELM"], "template", "eos", str(REPO / "charts" / "spark-eos-operator"),
                          "--namespace", namespace, "--set", "jobRbac.create=true",
                          "--set", f"jobRbac.namespaces={{{namespace}}}", "--show-only", "templates/job-rbac.yaml"],
                         capture_output=True, text=True, check=True).stdout
    for doc in yaml.safe_load_all(out):
        if doc and doc["kind"] == "Role" and without_pod_create:
            rules = []
            for rule in doc["rules"]:
                others = [r for r in rule["resources"] if r != "pods"]
                if others:
                    rules.append({**rule, "resources": others})
                if "pods" in rule["resources"]:
                    rules.append({**rule, "resources": ["pods"], "verbs": [v for v in rule["verbs"] if v != "create"]})
            doc = {**doc, "rules": rules}
        if doc:
            kubectl.apply(doc, namespace)


def executors(kubectl, namespace: str) -> list[dict]:
    return [p for p in kubectl.pods(namespace) if p["metadata"].get("labels", {}).get("spark-role") == "executor"]


def running_executors(kubectl, namespace: str, driver: str) -> list[dict]:
    return [p for p in executors(kubectl, namespace) if p.get("status", {}).get("phase") == "Running"
            and p["metadata"].get("ownerReferences", [{}])[0].get("name") == driver]


def committed(kubectl, namespace: str) -> int:
    return kubectl.status(namespace, NAME).get("lastCommittedBatch") or -1


def in_cluster_mode_on_s3(manifest: dict, s3_env, kubectl, namespace: str, template: dict | None = None) -> dict:
    """``manifest`` with 2 executors on Kubernetes and its checkpoint in the bucket of ``s3_env`` (S3_ENDPOINT,
    S3_BUCKET, S3_ACCESS_KEY, S3_SECRET_KEY: the stack's server or a test's private one; keys in a Secret)."""
    kubectl.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ckpt-keys"}, "type": "Opaque",
                   "data": {k: base64.b64encode(s3_env[v].encode()).decode()
                            for k, v in (("id", "S3_ACCESS_KEY"), ("secret", "S3_SECRET_KEY"))}}, namespace)
    executor = {"instances": 2, "cpu": "1", "memory": EXECUTOR_MEMORY, "startTimeoutSeconds": 15}
    manifest["spec"]["job"].update({"deployMode": "cluster", "serviceAccountName": SA,
                                    "executor": {**executor, **({"podTemplate": template} if template else {})},
                                    **({"podTemplate": template} if template else {})})
    manifest["spec"]["checkpoint"] = {"store": "s3", "path": f"/e2e-cluster/{namespace}", "s3": {
        "bucket": s3_env["S3_BUCKET"], "endpoint": s3_env["S3_ENDPOINT"], "pathStyleAccess": True,
        "accessKeyId": {"name": "ckpt-keys", "key": "id"}, "secretAccessKey": {"name": "ckpt-keys", "key": "secret"}}}
    return manifest


@pytest.mark.soak   # make soak: the stateful variant (make test runs the unique-id stream above)
def test_colors_counts_in_cluster_mode_on_s3_survive_a_driver_kill(stack_env, kubectl, namespace, kubelet, operator,
                                                                   tmp_path, report_result):
    """The colors stream (a stateful aggregation: its state store written by the executors to the bucket) with
    2 executors: a driver SIGKILL mid-stream, then every count exact (final counts, no update emitted twice,
    none going back, the ledger monotone)."""
    diag = Diagnostics(kubectl, namespace, operator, kubelet)
    job_rbac(stack_env, kubectl, namespace)
    topics = ColorsTopics(stack_env["KAFKA_BOOTSTRAP"])
    manifest = in_cluster_mode_on_s3(colors_stream(NAME, topics, tmp_path, attempts=5, delay=1.0), stack_env,
                                     kubectl, namespace)
    expected = Counter(produce(topics.bootstrap, topics.events, 3000))
    kubectl.apply(manifest, namespace)
    d0 = wait_until(lambda: (lambda d: d if len(running_executors(kubectl, namespace, d or "")) == 2 else None)(
        kubectl.status(namespace, NAME).get("driverPod")), "a driver with two executors", 240, diag, 1)
    wait_until(lambda: committed(kubectl, namespace) >= 0, "a batch committed with executors", 240, diag, 1)
    expected.update(produce(topics.bootstrap, topics.events, 3000, seed=11, start_id=3000))
    time.sleep(2)
    before = committed(kubectl, namespace)
    assert kubelet.kill9(namespace, d0), diag()
    expected.update(produce(topics.bootstrap, topics.events, 2000, seed=12, start_id=6000))
    wait_until(lambda: audit_counts(topics.bootstrap, topics.counts).final == dict(expected), "the counts", 420,
               diag, 2)
    assert_exactly_once(topics.bootstrap, topics.counts, topics.ledger(namespace, NAME), dict(expected),
                        (topics.dlq,))
    status = kubectl.status(namespace, NAME)
    assert status["driverPod"] != d0 and status["checkpointDir"].startswith("s3a://"), status
    kubectl.run("delete", "exactlyoncestream", NAME, "-n", namespace, "--timeout=180s", timeout=240)
    report_result(f"cluster mode, colors counts (stateful) with 2 executors on S3: {d0} SIGKILLed after batch "
                  f"{before}, {status['driverPod']} resumed; {sum(expected.values())} counted events exact")


@pytest.mark.containers   # driver and executor Pods are containers of the image (`make image`)
def test_cluster_mode_on_s3_survives_executor_and_driver_kills(stack_env, private_s3, kubectl, namespace, kubelet,
                                                              operator, tmp_path, report_result):
    diag = Diagnostics(kubectl, namespace, operator, kubelet)
    job_rbac(stack_env, kubectl, namespace, without_pod_create=True)
    topics = ColorsTopics(stack_env["KAFKA_BOOTSTRAP"])
    manifest = colors_stream(NAME, topics, tmp_path, attempts=8, delay=1.0, module="examples.colors.ids")
    toleration = {"key": "dedicated", "operator": "Equal", "value": "streaming", "effect": "NoSchedule"}
    template = {"labels": {"team": "payments"}, "env": [{"name": "TZ", "value": "UTC"}],
                "tolerations": [toleration], "volumes": [{"name": "scratch", "emptyDir": {}}],
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}
    # S3A gives up after two quick retries (its defaults retry for about a minute): an outage of OUTAGE_S fails
    # the query, so the restart strategy has to carry the stream through it.
    manifest["spec"]["job"].setdefault("sparkConf", {}).update({
        "spark.hadoop.fs.s3a.retry.limit": "2", "spark.hadoop.fs.s3a.retry.interval": "200ms",
        "spark.hadoop.fs.s3a.attempts.maximum": "1"})
    # The checkpoint's bucket is on an S3 server of this test alone: step 3 stops it.
    in_cluster_mode_on_s3(manifest, private_s3.env, kubectl, namespace, template)
    produce(topics.bootstrap, topics.events, 3000)
    expected, sent = expected_ids(3000), 3000
    journal = []

    def feed(n: int, seed: int) -> None:
        nonlocal expected, sent
        produce(topics.bootstrap, topics.events, n, seed=seed, start_id=sent)
        expected |= expected_ids(n, seed, sent)
        sent += n

    kubectl.apply(manifest, namespace)
    # 0. The job's ServiceAccount may not create Pods: the driver names that, in the stream's status.
    why = wait_until(lambda: (lambda e: e if "may not create pods" in e else None)(
        kubectl.status(namespace, NAME).get("lastError") or ""), "the missing RBAC rule in status", 180, diag, 1)
    assert f"{namespace}/{SA} may not create pods (RBAC forbids it)" in why, why
    assert not executors(kubectl, namespace)
    journal.append(f"without create pods: {why[:160]}...")
    job_rbac(stack_env, kubectl, namespace)   # the chart's Role: the restart strategy's next driver runs
    d0 = wait_until(lambda: (lambda d: d if running_executors(kubectl, namespace, d or "") else None)(
        kubectl.status(namespace, NAME).get("driverPod")), "a driver with executors", 240, diag, 1)
    attempt = int(d0.rsplit("-", 1)[1])
    d1 = f"{NAME}-driver-{attempt + 1}"
    first = wait_until(lambda: (lambda e: e if len(e) == 2 else None)(
        running_executors(kubectl, namespace, d0)), f"two executor Pods of {d0}", 240, diag)
    driver0 = kubectl.json("get", "pod", d0, "-n", namespace)
    for pod in [driver0, *first]:   # the pod templates: label, env and toleration on driver and executors
        assert pod["metadata"]["labels"]["team"] == "payments", pod["metadata"]["labels"]
        assert toleration in pod["spec"].get("tolerations", []), pod["spec"].get("tolerations")
        assert {"name": "TZ", "value": "UTC"} in pod["spec"]["containers"][0]["env"]
        assert {"name": "scratch", "emptyDir": {}} in pod["spec"]["volumes"], pod["spec"]["volumes"]
        assert any(m["mountPath"] == "/scratch" for m in pod["spec"]["containers"][0]["volumeMounts"])
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True   # restricted, executors included
        # A container of the image (its entrypoint's `executor` branch for the executors), not a process.
        assert pod["status"]["containerStatuses"][0]["containerID"].startswith("podman://"), pod["status"]
    for pod in first:
        resources = pod["spec"]["containers"][0]["resources"]
        # As the API server spells it (1024Mi, Spark's sum in MiB, reads back as 1Gi): compared as quantities.
        assert quantity(resources["limits"]["memory"]) == quantity(resources["requests"]["memory"]) \
            == quantity(EXECUTOR_MEMORY), resources
        owner = pod["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["uid"]) == ("Pod", driver0["metadata"]["uid"]), owner
    wait_until(lambda: committed(kubectl, namespace) >= 1, "batches committed with executors", 240, diag, 1)

    # 1. An executor SIGKILLed while batches run.
    feed(2000, 11)
    time.sleep(2)
    victim = first[0]["metadata"]["name"]
    before = committed(kubectl, namespace)
    assert kubelet.kill9(namespace, victim), f"{victim} had no process to kill:\n{diag()}"
    journal.append(f"executor {victim} SIGKILLed after batch {before}")
    feed(1000, 14)   # input for batches after the kill
    wait_ids(topics.bootstrap, topics.counts, expected, diag, timeout=300)
    replacements = [p["metadata"]["name"] for p in executors(kubectl, namespace)
                    if p["metadata"]["name"] not in {q["metadata"]["name"] for q in first}]
    journal.append(f"replacement executors requested by Spark: {replacements}")

    # 2. The driver SIGKILLed: its executors end (no driver), the operator resolves and restarts.
    feed(2000, 12)
    time.sleep(3)
    old = {p["metadata"]["name"] for p in executors(kubectl, namespace)}
    assert kubelet.kill9(namespace, d0), diag()
    wait_until(lambda: (lambda e: e if len(e) == 2 else None)(
        running_executors(kubectl, namespace, d1)), f"two executor Pods of {d1}", 300, diag)
    lingering = lambda: [p["metadata"]["name"] for p in executors(kubectl, namespace)   # noqa: E731
                         if p["metadata"]["name"] in old and p.get("status", {}).get("phase") == "Running"]
    wait_until(lambda: not lingering(), f"{d0}'s executors to end", 120, diag, 1)
    gone = old - {p["metadata"]["name"] for p in executors(kubectl, namespace)}
    journal.append(f"driver SIGKILLed; its {len(old)} executor Pods ended ({len(gone)} already collected with "
                   f"the driver Pod); {d1} runs with 2 new executors")
    feed(1000, 13)
    wait_ids(topics.bootstrap, topics.counts, expected, diag)

    # 3. The S3 server away for dozens of triggers while input arrives, then back on the same port with the same
    # data: the query fails on its checkpoint, the restart strategy applies (the operator's resolution waits for
    # the bucket), and nothing is lost or duplicated.
    before = kubectl.status(namespace, NAME).get("driverPod")
    st = private_s3.stack
    s3_server.stop_server(st, kill=True)
    t0 = time.monotonic()
    feed(1000, 15)   # batches to write while the bucket is away
    time.sleep(OUTAGE_S)
    s3_server.start_server(st)
    outage = time.monotonic() - t0
    feed(1000, 16)
    wait_ids(topics.bootstrap, topics.counts, expected, diag, timeout=300)
    after = kubectl.status(namespace, NAME).get("driverPod")
    failed = [m for m in kubectl.event_messages(namespace, NAME, "DriverFailed") if before in m]
    assert after != before and failed, f"{before} should have failed on S3 (retries are short):\n{diag()}"
    journal.append(f"S3 down {outage:.0f}s: {before} failed ({failed[0][:160]}...); the restart strategy started "
                   f"{after}")
    assert_ids_exactly_once(topics.bootstrap, topics.counts, topics.ledger(namespace, NAME), expected, (topics.dlq,))
    status = kubectl.status(namespace, NAME)
    assert status["resolution"]["checkpointLastCommittedBatch"] is not None, status["resolution"]
    assert status["checkpointDir"].startswith("s3a://"), status["checkpointDir"]

    # 4. Deleting the stream stops the driver; the garbage collector takes its executors with it.
    kubectl.run("delete", "exactlyoncestream", NAME, "-n", namespace, "--timeout=180s", timeout=240)
    wait_until(lambda: not executors(kubectl, namespace), "every executor Pod collected", 120, diag, 1)
    print("\n".join(journal))
    report_result(f"cluster mode: 2 executors per driver, checkpoint on S3; an executor SIGKILL, a driver SIGKILL "
                  f"and an S3 outage of {outage:.0f}s; {len(expected)} unique ids exactly once; executor Pods "
                  "collected with their driver")
