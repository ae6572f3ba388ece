"""The chart's operator Deployment on the real nodes (issue 28): what the retired process kubelet (a test stand-in
node) never did, done by a real kubelet and relied on here.

``helm install`` of the chart into a ``restricted`` namespace (``watchNamespaces`` = it): two replicas with
leader election, the image from the stack's registry (as each node's containerd pulled it), placed on the real
nodes by the chart's ``schedulerName`` and ``tolerations``. The stack's API server listens on 127.0.0.1, which
the ``kubernetes`` Service's ClusterIP does not lead to from a Pod (no kube-proxy, no route to the Service
range: docs/local-stack.md), so the release names it as a Pod on the real nodes reaches it: ``hostAliases``
(``kubernetes.default.svc`` -> the services address) and ``KUBERNETES_SERVICE_HOST``/``PORT`` in
``operator.extraEnv``; and the ServiceAccount token the API server's ServiceAccount admission would mount (off in
this stack) comes from ``extraVolumes``. Everything else is the chart's defaults: its probes, its restart policy,
its PodDisruptionBudget.

- Both Pods Running and Ready, Ready only after the readiness probe's initial delay, and the kubelet's own
  counters (``/metrics/probes``, through the API server's node proxy) show readiness and liveness probes run
  against each Pod; the Lease has a holder; the leader sets an invalid stream's status (InvalidSpec): it talks
  to the API server from its Pod.
- The leader's container SIGKILLed (its processes, found through its cgroup): the kubelet restarts it in the same
  Pod (restartCount 1, last exit 137), and the other replica takes the Lease over.
- The PodDisruptionBudget: the first eviction (Eviction API) succeeds, a second one at once is refused (429).
  Negative control: the same release upgraded with ``podDisruptionBudget.enabled=false``, both Pods Ready again,
  the same two evictions both succeed: the check reports that both replicas could go at once.
"""
from __future__ import annotations

import os
import re
import signal
import time
from datetime import datetime

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from eos_job.spec import API_GROUP, API_VERSION, PLURAL
from eos_stack.cluster import Kubectl as StackKubectl
from eos_stack.common import Stack
from eos_stack.node_config import SCHEDULER_NAME
from examples.colors.manifest import colors_manifest

from .helpers import CHART, wait_until
from tests.harness.real_nodes import chart_values_on_nodes, container_processes, root_ca_config_map

pytestmark = pytest.mark.timeout(420)
RELEASE = "eos"
SELECTOR = f"app.kubernetes.io/instance={RELEASE}"


def release_values(ns: str, st: Stack, pdb: bool) -> dict:
    values = chart_values_on_nodes(st)
    values["operator"]["reconcileIntervalSeconds"] = 2
    return {**values, "watchNamespaces": [ns], "replicas": 2,
            "leaderElection": {"enabled": True, "leaseDurationSeconds": 10},
            "podDisruptionBudget": {"enabled": pdb}, "service": {"enabled": False}}


def ready(pod) -> bool:
    return pod.status.phase == "Running" and any(
        c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def ready_pods(v1, ns: str) -> list | None:
    pods = [p for p in v1.list_namespaced_pod(ns, label_selector=SELECTOR).items if not p.metadata.deletion_timestamp]
    return pods if len(pods) == 2 and all(ready(p) for p in pods) else None


def probe_counts(v1, node: str, ns: str, pod: str) -> dict[str, int]:
    """The kubelet's own counters of successful probes of the Pod (``prober_probe_total``), by probe type."""
    text = v1.connect_get_node_proxy_with_path(node, "metrics/probes")
    counts: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("prober_probe_total{") and f'pod="{pod}"' in line and f'namespace="{ns}"' in line \
                and 'result="successful"' in line:
            kind = re.search(r'probe_type="(\w+)"', line).group(1)
            counts[kind] = counts.get(kind, 0) + int(float(line.rsplit(" ", 1)[1]))
    return counts


def evict_two_at_once(v1, ns: str, pods: list[str]) -> list[int]:
    """The Eviction API for each Pod, one right after the other: the HTTP status of each (201 evicted, 429 refused
    by a disruption budget). Two replicas may not both go while the first is not back: ``[201, 429]``."""
    statuses = []
    for name in pods:
        body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=ns))
        try:
            v1.create_namespaced_pod_eviction(name, ns, body)
            statuses.append(201)
        except ApiException as exc:
            statuses.append(exc.status)
    return statuses


def seconds(ts) -> float:
    return ts.timestamp() if isinstance(ts, datetime) else datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def test_the_charts_operator_on_real_nodes_probes_restarts_takeover_and_disruption_budget(
        stack_env, nodes, helm, kubectl, namespaces, releases, tmp_path, request):
    t0 = time.monotonic()
    st, ns = Stack(), namespaces("chart-nodes")

    def leave_no_stream_behind() -> None:
        # The operator first, then the finalizers it left on the test's streams, so the namespace can go.
        helm.run("uninstall", RELEASE, "-n", ns, "--wait", "--timeout", "60s", check=False)
        for s in kubectl.json("get", PLURAL, "-n", ns)["items"]:
            kubectl.run("patch", PLURAL, s["metadata"]["name"], "-n", ns, "--type=merge", "-p",
                        '{"metadata":{"finalizers":null}}', check=False)
    request.addfinalizer(leave_no_stream_behind)
    StackKubectl(stack_env).apply_crds()     # the operator refuses CRDs older than itself
    api = config.new_client_from_config(config_file=stack_env["KUBECONFIG"])
    v1, coord = client.CoreV1Api(api), client.CoordinationV1Api(api)
    co = client.CustomObjectsApi(api)
    v1.create_namespaced_config_map(ns, root_ca_config_map(st))
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(release_values(ns, st, pdb=True)))
    releases(RELEASE, ns)
    helm.run("install", RELEASE, str(CHART), "-n", ns, "-f", str(values))
    lease_name = kubectl.json("get", "deploy", "-n", ns, "-l", SELECTOR)["items"][0]["metadata"]["name"]

    def diag() -> str:
        got = kubectl.run("get", "deploy,rs,pods,pdb,lease,events", "-n", ns, "-o", "wide", check=False).stdout
        logs = kubectl.run("logs", "-n", ns, "-l", SELECTOR, "--tail=30", "--prefix", "--all-containers",
                           check=False)
        return f"{got}\n{logs.stdout}{logs.stderr}"

    pods = wait_until(lambda: ready_pods(v1, ns), "both operator Pods Running and Ready on the real nodes", 180,
                      diag, 1)
    installed = time.monotonic() - t0
    node_names = {n.name for n in nodes}
    for p in pods:
        assert p.spec.node_name in node_names and p.spec.scheduler_name == SCHEDULER_NAME, (p.metadata.name,
                                                                                            p.spec.node_name)
        assert p.spec.restart_policy == "Always"
        c = p.status.container_statuses[0]
        assert c.ready and c.restart_count == 0, c
        # Ready comes from the readiness probe: not before its initial delay after the container started.
        became_ready = next(x for x in p.status.conditions if x.type == "Ready").last_transition_time
        delay = yaml.safe_load((CHART / "values.yaml").read_text())["readinessProbe"]["initialDelaySeconds"]
        assert seconds(became_ready) >= seconds(c.state.running.started_at) + delay - 1, (became_ready, c)

    def holder() -> str | None:
        try:
            return coord.read_namespaced_lease(lease_name, ns).spec.holder_identity
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
    by_name = {p.metadata.name: p for p in pods}
    leader_name = wait_until(lambda: holder() if holder() in by_name else None, "the Lease to have a holder", 60,
                             diag, 0.5)
    standby_name = next(n for n in by_name if n != leader_name)
    transitions = coord.read_namespaced_lease(lease_name, ns).spec.lease_transitions or 0

    # The leader acts from its Pod: it reads the stream and writes its status through the API server.
    def invalid_stream_handled(name: str) -> dict:
        co.create_namespaced_custom_object(API_GROUP, API_VERSION, ns, PLURAL,
                                           colors_manifest(name, "unused:9092", "in", "out", "/nowhere"))

        def invalid_spec() -> dict | None:
            status = co.get_namespaced_custom_object(API_GROUP, API_VERSION, ns, PLURAL, name).get("status") or {}
            return next((c for c in status.get("conditions", []) if c.get("reason") == "InvalidSpec"), None)
        cond = wait_until(invalid_spec, f"the operator in its Pod to set stream {name} InvalidSpec", 60, diag, 0.5)
        assert "checkpoint.store" in cond["message"], cond
        return cond
    invalid_stream_handled("local-store")

    # The probes ran, as the kubelet counts them (liveness: after its 10 s initial delay).
    def probed() -> dict | None:
        counts = {n: probe_counts(v1, p.spec.node_name, ns, n) for n, p in by_name.items()}
        return counts if all(c.get("Readiness", 0) >= 1 and c.get("Liveness", 0) >= 1 for c in counts.values()) \
            else None
    probes = wait_until(probed, "the kubelets to count readiness and liveness probes of both Pods", 60, diag, 1)

    # SIGKILL every process of the leader's container (not the Pod's sandbox): the kubelet restarts it in place.
    leader = v1.read_namespaced_pod(leader_name, ns)
    cid = leader.status.container_statuses[0].container_id
    procs = container_processes(cid)
    assert procs, f"no process found in the cgroup of container {cid}"
    killed = time.monotonic()
    for pid in procs:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def restarted():
        p = v1.read_namespaced_pod(leader_name, ns)
        c = p.status.container_statuses[0]
        return p if c.restart_count >= 1 and c.state.running and p.metadata.uid == leader.metadata.uid else None
    again = wait_until(restarted, "the kubelet to restart the killed container in the same Pod", 60, diag, 0.5)
    restart_s = time.monotonic() - killed
    c = again.status.container_statuses[0]
    assert c.restart_count == 1 and c.last_state.terminated.exit_code == 137, c
    assert c.container_id != cid
    wait_until(lambda: holder() == standby_name, "the standby replica to take the Lease over", 60, diag, 0.2)
    takeover_s = time.monotonic() - killed
    assert coord.read_namespaced_lease(lease_name, ns).spec.lease_transitions == transitions + 1
    invalid_stream_handled("local-store-2")      # the new leader acts

    # The disruption budget: both Ready and the budget computed (the disruption controller), then two evictions.
    pdb_api = client.PolicyV1Api(api)

    def budget_allows_one():
        pdb = pdb_api.read_namespaced_pod_disruption_budget(lease_name, ns)
        ok = pdb.status and pdb.status.observed_generation == pdb.metadata.generation and \
            pdb.status.disruptions_allowed == 1 and pdb.status.current_healthy == 2
        return pdb if ok else None
    wait_until(lambda: ready_pods(v1, ns), "both Pods Ready again after the restart", 90, diag, 1)
    wait_until(budget_allows_one, "the PodDisruptionBudget to allow one disruption", 60, diag, 0.5)
    protected = evict_two_at_once(v1, ns, [standby_name, leader_name])
    assert protected == [201, 429], f"with the budget, evictions answered {protected}\n{diag()}"

    # Negative control: the same release without the budget; both Ready again, the same two evictions.
    values.write_text(yaml.safe_dump(release_values(ns, st, pdb=False)))
    helm.run("upgrade", RELEASE, str(CHART), "-n", ns, "-f", str(values))
    assert not kubectl.exists("pdb", "-n", ns, "-l", SELECTOR)
    pods = wait_until(lambda: ready_pods(v1, ns), "two Ready operator Pods again (the evicted one replaced)", 120,
                      diag, 1)
    unprotected = evict_two_at_once(v1, ns, [p.metadata.name for p in pods])
    assert unprotected == [201, 201], f"without the budget, evictions answered {unprotected}"
    print(f"\nchart on real nodes: both Ready {installed:.1f} s after install; probes {probes}; leader "
          f"{leader_name} SIGKILLed ({len(procs)} processes): restarted in {restart_s:.1f} s, Lease taken over by "
          f"{standby_name} after {takeover_s:.1f} s; evictions with the budget {protected}, without {unprotected}; "
          f"{time.monotonic() - t0:.1f} s in all")
