"""Executors on Kubernetes: the unique-id stream in ``deployMode: cluster`` with its checkpoint on S3, every Pod a
container on the real nodes (stack/eos_stack/node.py: kubelet, containerd, CNI, cluster DNS).

The production shape, end to end on the local stack: the operator (a process on this machine, as in the other
operator e2e tests) makes the driver Pod; the stream's ``job.podTemplate`` and ``job.executor.podTemplate`` put
the driver and the executor Pods Spark creates on a real node (the real nodes' scheduler and the toleration of
their taint, ``real_nodes.stream_template``). The driver Pod (the job's ServiceAccount, its RBAC rendered from
the chart) runs Spark's Kubernetes scheduler against the API server. No Pod reaches the ``kubernetes`` Service
here (no kube-proxy: docs/local-stack.md), so the namespace gets what a cluster gives every Pod, the way a
Service without a selector names an endpoint outside the cluster: a headless Service ``kubernetes`` whose
EndpointSlice is the API server's forwarder on the stack's services address (``api_server_service``), and the
driver's ``job.podTemplate`` sets ``KUBERNETES_SERVICE_HOST=kubernetes`` (a name in the API server's
certificate, which the Pod's DNS search path resolves in its own namespace through the stack's CoreDNS),
``KUBERNETES_SERVICE_PORT``, and the ServiceAccount token the API server's admission would mount (off in this
stack) as a projected volume, as the chart's operator Pod has it (tests/chart/test_chart_on_real_nodes.py).
Spark creates two executor Pods owned by the driver Pod, containers of the image (its entrypoint's ``executor``
branch); they dial the driver by the operator's headless driver Service, ``<stream>-driver.<ns>.svc``, which the
stack's CoreDNS answers from its EndpointSlice (``SPARK_DRIVER_URL`` of each executor names it). Driver and
executors share one node (a node selector in both templates): Pods of two real nodes do not reach each other
here (docs/local-stack.md). Kafka and the checkpoint bucket are reached at the services address.

First the job's Role lacks ``create pods``: the driver waits for an executor in vain and fails naming the
missing rule, which reaches the stream's status; the chart's Role is then applied and the restart strategy's
next driver runs. Kills, each a SIGKILL of every process in the container's cgroup (``container_processes``,
whatever their process groups): an executor while batches run (its JVM, PySpark's Python workers and the
image's init, tini: seen as ``java, python, python, tini``; Spark retries its tasks on the other executor or on
the replacement it requests), then the driver (its JVM and the Python process that started it, ``java,
python``: in cluster mode the Python workers are the executors'; its executors lose their driver and end; the
operator resolves and restarts), then the
S3 server stopped for 15 s while input arrives (S3A's retries are set short: the query fails, and the restart
strategy carries the stream through). That S3 server is the test's own (``private_s3``) behind a forwarder of
its own on the services address, so the tests beside it keep the stack's MinIO. At the end every id is in the
sink exactly once (set equality, read_committed), and deleting the stream collects every executor Pod through
its owner reference.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from eos_job.memory import quantity
from eos_job.verify import audit_counts

from eos_stack import kube, node_services
from eos_stack import s3 as s3_server
from eos_stack.cluster import wait_until
from eos_stack.common import Stack
from eos_stack.node_config import SCHEDULER_NAME
from examples.colors.generator import expected_ids, produce
from examples.colors.manifest import colors_manifest
from tests.e2e.exactness import assert_exactly_once
from tests.e2e.streams import (IDS, REPO, ColorsTopics, Diagnostics, OperatorProcess, assert_ids_exactly_once,
                               wait_ids)
from tests.harness.private import Forwarder
from tests.harness.real_nodes import container_processes, keys_secret, node_image, stream_template

pytestmark = pytest.mark.timeout(1200)
NAME = "colors"
# Split by the operator into spark.executor.memory and memoryOverhead adding up to it (eos_job.memory): the
# executor Pods Spark makes have it as their memory request and limit.
EXECUTOR_MEMORY = "1Gi"
# The driver (1 CPU) and both executors fit one real node (2 CPUs allocatable): they must share it (see above).
EXECUTOR_CPU = "500m"
OUTAGE_S = 15.0   # the S3 server away for dozens of triggers
SA = "spark-eos-driver"
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
API_SERVICE = "kubernetes"   # the namespace's Service for the API server: a name in its certificate (kube.py)


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
    batch = kubectl.status(namespace, NAME).get("lastCommittedBatch")
    return -1 if batch is None else batch      # batch 0 counts


class RealNodeRig:
    """What the stream's Pods on the real nodes need of the test: the API server's CA in the namespace (the
    ``kube-root-ca.crt`` ConfigMap a cluster's publisher makes), the operator process, the Pod templates and a
    diagnosis with the driver's log."""

    def __init__(self, stack_env, kubectl, namespace: str, nodes, tmp_path):
        self.st, self.kubectl, self.ns = Stack(), kubectl, namespace
        self.pod_env = node_services.pod_env(self.st)     # not .stack/env: test workers rewrite it concurrently
        # One node for the driver and its executors (Pods of two nodes do not reach each other here): the one
        # whose running Pods ask for the least CPU now.
        self.node = roomiest(kubectl, [n.name for n in nodes])
        kubectl.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kube-root-ca.crt"},
                       "data": {"ca.crt": (kube.pki_dir(self.st) / "ca.crt").read_text()}}, namespace)
        self.api_port = urlparse(self.pod_env["POD_KUBE_APISERVER"]).port
        for doc in api_server_service(self.pod_env["EOS_SERVICES_IP"], self.api_port):
            kubectl.apply(doc, namespace)
        self.operator = OperatorProcess(stack_env["KUBECONFIG"], namespace, tmp_path / "operator.log").start()
        self.diag = Diagnostics(kubectl, namespace, self.operator)

    def templates(self, extra: dict | None = None) -> tuple[dict, dict]:
        """(driver, executor) Pod templates on ``self.node`` (``pod_templates``)."""
        return pod_templates(self.node, self.api_port, extra)

    def stream(self, topics: ColorsTopics, module: str | None, attempts: int) -> dict:
        """The colors stream as Pods on the real nodes reach the stack (Kafka's PODS listener), the image from
        the stack's registry, a 1-CPU 2Gi driver (as tests/e2e/test_real_node_stream.py's)."""
        return colors_manifest(NAME, self.pod_env["POD_KAFKA_BOOTSTRAP"], topics.events, topics.counts, "/unused",
                               dlq=topics.dlq, max_offsets_per_trigger=2000, trigger_interval_ms=500,
                               job={"module": module or "examples.colors.job", "image": node_image(),
                                    "driver": {"cpu": "1", "memory": "2Gi"}},
                               restartStrategy={"type": "fixed-delay",
                                                "fixedDelay": {"attempts": attempts, "delaySeconds": 1.0}},
                               upgradeMode="last-state")

    def diagnose(self) -> str:
        try:
            d = self.kubectl.status(self.ns, NAME).get("driverPod") or f"{NAME}-driver-0"
        except Exception as exc:  # noqa: BLE001 - diagnostics must not hide the failure
            return f"{self.diag()}\n(no stream: {exc})"
        log = self.kubectl.run("logs", "-n", self.ns, d, "--tail=40", check=False)
        return f"{self.diag()}\ndriver {d} log:\n{log.stdout}{log.stderr}"

    def stop(self) -> None:
        self.kubectl.run("delete", "exactlyoncestream", "--all", "-n", self.ns, "--timeout=180s", check=False,
                         timeout=240)
        self.operator.stop()


def pod_templates(node: str, api_port: int, extra: dict | None = None) -> tuple[dict, dict]:
    """(driver, executor) Pod templates: both on real node ``node`` by the real nodes' scheduler, plus ``extra``
    (tolerations added to the real nodes'); the driver's also reaches the API server as a Pod here can:
    KUBERNETES_SERVICE_HOST/PORT (``api_server_service`` on ``api_port``) and a projected ServiceAccount token
    (its namespace needs the ``kube-root-ca.crt`` ConfigMap). Also the executors benchmark's
    (benchmarks/executors_run.py)."""
    extra = dict(extra or {})
    base = {**stream_template(), "nodeSelector": {"kubernetes.io/hostname": node}}
    base["tolerations"] = [*base["tolerations"], *extra.pop("tolerations", [])]
    executor = {**base, **extra}
    token = {"name": "sa-token", "projected": {"sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1",
                                                                      "fieldPath": "metadata.namespace"}}]}}]}}
    driver = {**base, **extra,
              "env": [*extra.get("env", []), {"name": "KUBERNETES_SERVICE_HOST", "value": API_SERVICE},
                      {"name": "KUBERNETES_SERVICE_PORT", "value": str(api_port)}],
              "volumes": [*extra.get("volumes", []), token],
              "volumeMounts": [*extra.get("volumeMounts", []),
                               {"name": "sa-token", "mountPath": TOKEN_DIR, "readOnly": True}]}
    return driver, executor


def api_server_service(services_ip: str, port: int) -> list[dict]:
    """A headless Service ``kubernetes`` without a selector and its EndpointSlice: the API server's forwarder on
    the services address. Cluster DNS answers ``kubernetes.<ns>.svc.cluster.local`` with that address, so a Pod
    of the namespace dials ``https://kubernetes:<port>`` and the API server's certificate (which names
    ``kubernetes``) matches."""
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": API_SERVICE},
               "spec": {"clusterIP": "None", "ports": [{"name": "https", "port": port, "targetPort": port}]}}
    endpoints = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                 "metadata": {"name": f"{API_SERVICE}-apiserver",
                              "labels": {"kubernetes.io/service-name": API_SERVICE,
                                         "endpointslice.kubernetes.io/managed-by": "eos-e2e"}},
                 "addressType": "IPv4", "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
                 "endpoints": [{"addresses": [services_ip], "conditions": {"ready": True}}]}
    return [service, endpoints]


def in_cluster_mode_on_s3(manifest: dict, s3_env: dict, endpoint: str, kubectl, namespace: str,
                          templates: tuple[dict, dict]) -> dict:
    """``manifest`` with 2 executors on Kubernetes and its checkpoint in the bucket of ``s3_env`` (S3_BUCKET and
    the keys, in Secret ``ckpt-keys``) at ``endpoint`` (as Pods and the operator reach it: the services address)."""
    kubectl.apply(keys_secret(s3_env), namespace)
    driver_template, executor_template = templates
    executor = {"instances": 2, "cpu": EXECUTOR_CPU, "memory": EXECUTOR_MEMORY, "startTimeoutSeconds": 15,
                "podTemplate": executor_template}
    manifest["spec"]["job"].update({"deployMode": "cluster", "serviceAccountName": SA, "executor": executor,
                                    "podTemplate": driver_template})
    manifest["spec"]["checkpoint"] = {"store": "s3", "path": f"/e2e-cluster/{namespace}", "s3": {
        "bucket": s3_env["S3_BUCKET"], "endpoint": endpoint, "pathStyleAccess": True,
        "accessKeyId": {"name": "ckpt-keys", "key": "id"}, "secretAccessKey": {"name": "ckpt-keys", "key": "secret"}}}
    return manifest


def roomiest(kubectl, nodes: list[str]) -> str:
    """The node whose Pods (not finished) request the least CPU: the driver and both executors must fit one."""
    asked = dict.fromkeys(nodes, 0.0)
    for pod in kubectl.json("get", "pods", "-A")["items"]:
        node = pod["spec"].get("nodeName")
        if node in asked and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            asked[node] += sum(quantity((c.get("resources", {}).get("requests") or {}).get("cpu", "0"))
                               for c in pod["spec"]["containers"])
    return min(nodes, key=lambda n: asked[n])


def cpu_throttled(kubectl, namespace: str, pod: str) -> str:
    """The Pod's (first) container's CPU throttling so far, from its cgroup v1 ``cpu.stat``: how often and how
    long its CPU limit held it back (the real node enforces ``cpu`` limits; the retired process kubelet did not)."""
    cid = kubectl.json("get", "pod", pod, "-n", namespace)["status"]["containerStatuses"][0]["containerID"]
    for pid in container_processes(cid):
        try:
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        except OSError:
            continue
        path = next((ln.split(":", 2)[2] for ln in lines if ln.split(":", 2)[1] in ("cpu", "cpu,cpuacct")), None)
        if path is None:
            continue
        try:
            stat = dict(ln.split() for ln in Path(f"/sys/fs/cgroup/cpu{path}/cpu.stat").read_text().splitlines())
        except OSError as exc:
            return f"{pod}: no cpu.stat ({exc})"
        return (f"{pod}: throttled in {stat['nr_throttled']} of {stat['nr_periods']} periods, "
                f"{int(stat['throttled_time']) / 1e9:.1f} s")
    return f"{pod}: no process"


def jvm_and_python(names: list[str]) -> bool:
    return "java" in names and any(n.startswith("python") for n in names)


def kill_container(kubectl, namespace: str, pod: str) -> list[str]:
    """SIGKILL every process of the Pod's (first) container, found through its cgroup (not the Pod's sandbox):
    what a kill on a real node takes, whatever their process groups. The processes killed, by name."""
    status = kubectl.json("get", "pod", pod, "-n", namespace)["status"]
    procs = container_processes(status["containerStatuses"][0]["containerID"])
    names = []
    for pid in procs:
        try:
            names.append(Path(f"/proc/{pid}/comm").read_text().strip())
        except OSError:
            names.append(str(pid))
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return sorted(names)


@pytest.mark.soak   # make soak: the stateful variant (make test runs the unique-id stream below)
def test_colors_counts_in_cluster_mode_on_s3_survive_a_driver_kill(stack_env, nodes, kubectl, namespace, tmp_path,
                                                                   report_result):
    """The colors stream (a stateful aggregation: its state store written by the executors to the stack's bucket)
    with 2 executors on a real node: a driver SIGKILL (every process of its container: the JVM and the Python
    process that started it) mid-stream, then every count exact (final counts, no update emitted twice,
    none going back, the ledger monotone)."""
    rig = RealNodeRig(stack_env, kubectl, namespace, nodes, tmp_path)
    try:
        job_rbac(stack_env, kubectl, namespace)
        topics = ColorsTopics(stack_env["KAFKA_BOOTSTRAP"])
        manifest = in_cluster_mode_on_s3(rig.stream(topics, None, attempts=5), stack_env,
                                         rig.pod_env["POD_S3_ENDPOINT"], kubectl, namespace, rig.templates())
        expected = Counter(produce(topics.bootstrap, topics.events, 3000))
        kubectl.apply(manifest, namespace)
        d0 = wait_until(lambda: (lambda d: d if len(running_executors(kubectl, namespace, d or "")) == 2 else None)(
            kubectl.status(namespace, NAME).get("driverPod")), "a driver with two executors", 300, rig.diagnose, 1)
        wait_until(lambda: committed(kubectl, namespace) >= 0, "a batch committed with executors", 300,
                   rig.diagnose, 1)
        expected.update(produce(topics.bootstrap, topics.events, 3000, seed=11, start_id=3000))
        time.sleep(2)
        before = committed(kubectl, namespace)
        killed = kill_container(kubectl, namespace, d0)
        assert jvm_and_python(killed), f"the driver container's processes: {killed}\n{rig.diagnose()}"
        expected.update(produce(topics.bootstrap, topics.events, 2000, seed=12, start_id=6000))
        wait_until(lambda: audit_counts(topics.bootstrap, topics.counts).final == dict(expected), "the counts", 420,
                   rig.diagnose, 2)
        assert_exactly_once(topics.bootstrap, topics.counts, topics.ledger(namespace, NAME), dict(expected),
                            (topics.dlq,))
        status = kubectl.status(namespace, NAME)
        assert status["driverPod"] != d0 and status["checkpointDir"].startswith("s3a://"), status
        kubectl.run("delete", "exactlyoncestream", NAME, "-n", namespace, "--timeout=180s", timeout=240)
        report_result(f"cluster mode on a real node, colors counts (stateful) with 2 executors on S3: {d0} SIGKILLed "
                      f"({', '.join(killed)}) after batch {before}, {status['driverPod']} resumed; "
                      f"{sum(expected.values())} counted events exact")
    finally:
        rig.stop()


def test_cluster_mode_on_s3_survives_executor_and_driver_kills(stack_env, nodes, private_s3, kubectl, namespace,
                                                              tmp_path, report_result):
    rig = RealNodeRig(stack_env, kubectl, namespace, nodes, tmp_path)
    forward = Forwarder(rig.pod_env["EOS_SERVICES_IP"], urlparse(private_s3.env["S3_ENDPOINT"]).netloc,
                        (tmp_path / "forward.log").open("w"))
    try:
        cluster_mode_through_kills(stack_env, private_s3, forward.url, kubectl, namespace, rig, report_result)
    finally:
        rig.stop()
        forward.stop()


def cluster_mode_through_kills(stack_env, private_s3, s3_endpoint: str, kubectl, namespace: str, rig: RealNodeRig,
                               report_result) -> None:
    diag = rig.diagnose
    job_rbac(stack_env, kubectl, namespace, without_pod_create=True)
    topics = ColorsTopics(stack_env["KAFKA_BOOTSTRAP"])
    manifest = rig.stream(topics, IDS, attempts=8)
    toleration = {"key": "dedicated", "operator": "Equal", "value": "streaming", "effect": "NoSchedule"}
    extra = {"labels": {"team": "payments"}, "env": [{"name": "TZ", "value": "UTC"}],
             "tolerations": [toleration], "volumes": [{"name": "scratch", "emptyDir": {}}],
             "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}
    # S3A gives up after two quick retries (its defaults retry for about a minute): an outage of OUTAGE_S fails
    # the query, so the restart strategy has to carry the stream through it.
    manifest["spec"]["job"].setdefault("sparkConf", {}).update({
        "spark.hadoop.fs.s3a.retry.limit": "2", "spark.hadoop.fs.s3a.retry.interval": "200ms",
        "spark.hadoop.fs.s3a.attempts.maximum": "1"})
    # The checkpoint's bucket is on an S3 server of this test alone (behind its own forwarder): step 3 stops it.
    in_cluster_mode_on_s3(manifest, private_s3.env, s3_endpoint, kubectl, namespace, rig.templates(extra))
    produce(topics.bootstrap, topics.events, 3000)
    expected, sent = expected_ids(3000), 3000
    journal = []

    def feed(n: int, seed: int) -> None:
        nonlocal expected, sent
        produce(topics.bootstrap, topics.events, n, seed=seed, start_id=sent)
        expected |= expected_ids(n, seed, sent)
        sent += n

    kubectl.apply(manifest, namespace)
    t0 = time.monotonic()
    at = lambda: f"[{time.monotonic() - t0:.0f} s]"   # noqa: E731 - each journal line's seconds since the apply
    # 0. The job's ServiceAccount may not create Pods: the driver names that, in the stream's status.
    why = wait_until(lambda: (lambda e: e if "may not create pods" in e else None)(
        kubectl.status(namespace, NAME).get("lastError") or ""), "the missing RBAC rule in status", 240, diag, 1)
    assert f"{namespace}/{SA} may not create pods (RBAC forbids it)" in why, why
    assert not executors(kubectl, namespace)
    journal.append(f"{at()} without create pods: {why[:160]}...")
    job_rbac(stack_env, kubectl, namespace)   # the chart's Role: the restart strategy's next driver runs
    d0 = wait_until(lambda: (lambda d: d if running_executors(kubectl, namespace, d or "") else None)(
        kubectl.status(namespace, NAME).get("driverPod")), "a driver with executors", 300, diag, 1)
    attempt = int(d0.rsplit("-", 1)[1])
    d1 = f"{NAME}-driver-{attempt + 1}"
    first = wait_until(lambda: (lambda e: e if len(e) == 2 else None)(
        running_executors(kubectl, namespace, d0)), f"two executor Pods of {d0}", 240, diag)
    driver0 = kubectl.json("get", "pod", d0, "-n", namespace)
    driver_host = f"{NAME}-driver.{namespace}.svc"
    for pod in [driver0, *first]:   # the pod templates: label, env and toleration on driver and executors
        assert pod["metadata"]["labels"]["team"] == "payments", pod["metadata"]["labels"]
        assert toleration in pod["spec"].get("tolerations", []), pod["spec"].get("tolerations")
        assert {"name": "TZ", "value": "UTC"} in pod["spec"]["containers"][0]["env"]
        assert {"name": "scratch", "emptyDir": {}} in pod["spec"]["volumes"], pod["spec"]["volumes"]
        assert any(m["mountPath"] == "/scratch" for m in pod["spec"]["containers"][0]["volumeMounts"])
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True   # restricted, executors included
        # A container on the real node, placed by the real nodes' scheduler.
        assert (pod["spec"]["schedulerName"], pod["spec"]["nodeName"]) == (SCHEDULER_NAME, rig.node), pod["spec"]
        assert pod["status"]["containerStatuses"][0]["containerID"].startswith("containerd://"), pod["status"]
    for pod in first:
        resources = pod["spec"]["containers"][0]["resources"]
        # As the API server spells it (1024Mi, Spark's sum in MiB, reads back as 1Gi): compared as quantities.
        assert quantity(resources["limits"]["memory"]) == quantity(resources["requests"]["memory"]) \
            == quantity(EXECUTOR_MEMORY), resources
        owner = pod["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["uid"]) == ("Pod", driver0["metadata"]["uid"]), owner
        # The executors dial their driver by the headless Service's name, which cluster DNS answers.
        url = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}["SPARK_DRIVER_URL"]
        assert f"@{driver_host}:" in url, url
    service = kubectl.json("get", "service", f"{NAME}-driver", "-n", namespace)
    assert service["spec"]["clusterIP"] == "None", service["spec"]
    wait_until(lambda: committed(kubectl, namespace) >= 1, "batches committed with executors", 300, diag, 1)
    journal.append(f"{at()} {d0} and its executors on {rig.node}; executors registered with {driver_host}")

    # 1. An executor SIGKILLed while batches run: every process of its container (its JVM).
    feed(2000, 11)
    time.sleep(2)
    victim = first[0]["metadata"]["name"]
    before = committed(kubectl, namespace)
    journal += [f"{at()} CPU so far: " + "; ".join(cpu_throttled(kubectl, namespace, p["metadata"]["name"])
                                                  for p in [driver0, *first])]
    killed = kill_container(kubectl, namespace, victim)
    assert killed, f"{victim} had no process to kill:\n{diag()}"
    journal.append(f"{at()} executor {victim} SIGKILLed ({', '.join(killed)}) after batch {before}")
    feed(1000, 14)   # input for batches after the kill
    wait_ids(topics.bootstrap, topics.counts, expected, diag, timeout=300)
    replacements = [p["metadata"]["name"] for p in executors(kubectl, namespace)
                    if p["metadata"]["name"] not in {q["metadata"]["name"] for q in first}]
    journal.append(f"{at()} every id so far once; replacement executors requested by Spark: {replacements}")

    # 2. The driver SIGKILLed (its JVM, the Python process that started it and PySpark's workers): its executors
    # end (no driver), the operator resolves and restarts.
    feed(2000, 12)
    time.sleep(3)
    old = {p["metadata"]["name"] for p in executors(kubectl, namespace)}
    journal += [f"{at()} CPU so far: " + "; ".join(cpu_throttled(kubectl, namespace, p) for p in [d0, *sorted(
        p["metadata"]["name"] for p in running_executors(kubectl, namespace, d0))])]
    killed = kill_container(kubectl, namespace, d0)
    assert jvm_and_python(killed), f"the driver container's processes: {killed}\n{diag()}"
    wait_until(lambda: (lambda e: e if len(e) == 2 else None)(
        running_executors(kubectl, namespace, d1)), f"two executor Pods of {d1}", 300, diag)
    lingering = lambda: [p["metadata"]["name"] for p in executors(kubectl, namespace)   # noqa: E731
                         if p["metadata"]["name"] in old and p.get("status", {}).get("phase") == "Running"]
    wait_until(lambda: not lingering(), f"{d0}'s executors to end", 120, diag, 1)
    gone = old - {p["metadata"]["name"] for p in executors(kubectl, namespace)}
    journal.append(f"{at()} driver SIGKILLed ({', '.join(killed)}); its {len(old)} executor Pods ended ({len(gone)} already "
                   f"collected with the driver Pod); {d1} runs with 2 new executors")
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
    journal.append(f"{at()} S3 down {outage:.0f}s: {before} failed ({failed[0][:160]}...); the restart strategy started "
                   f"{after}")
    assert_ids_exactly_once(topics.bootstrap, topics.counts, topics.ledger(namespace, NAME), expected, (topics.dlq,))
    status = kubectl.status(namespace, NAME)
    assert status["resolution"]["checkpointLastCommittedBatch"] is not None, status["resolution"]
    assert status["checkpointDir"].startswith("s3a://"), status["checkpointDir"]

    # 4. Deleting the stream stops the driver; the garbage collector takes its executors with it.
    kubectl.run("delete", "exactlyoncestream", NAME, "-n", namespace, "--timeout=180s", timeout=240)
    wait_until(lambda: not executors(kubectl, namespace), "every executor Pod collected", 120, diag, 1)
    journal.append(f"{at()} every executor Pod collected")
    print("\n".join(journal))
    report_result(f"cluster mode on a real node ({rig.node}): 2 executors per driver dialling {driver_host}, "
                  f"checkpoint on S3; an executor SIGKILL, a driver SIGKILL and an S3 outage of {outage:.0f}s; "
                  f"{len(expected)} unique ids exactly once; executor Pods collected with their driver")
