"""The chart's RBAC is exactly what the operator needs.

1. The operator's own requests are the ones listed in rbac_model (recorded from the
   real adapter code, no server).
2. The chart's ServiceAccount, installed by helm, may make each of them
   (`kubectl auth can-i --as=system:serviceaccount:NS:SA`), in every namespace or only
   in the watched ones, and is refused what the operator never does.
3. Every verb of every rule is needed: with any one removed, the API server's
   authorizer refuses at least one listed call.
4. The operator itself runs under that identity (a TokenRequest token) and drives a
   stream through create, launch and delete without a single refused request.
"""
from __future__ import annotations

import asyncio
import copy
import json
import os
import signal
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import yaml

from eos_stack.common import free_port
from examples.colors.manifest import colors_manifest

from .helpers import (REPO, Helm, Kubectl, by_kind, can_i, install, one, sa_user, token_kubeconfig, unique,
                      wait_until)
from .rbac_model import (ADAPTER_CALLS, ALL_CALLS, CLUSTER_CALLS, FORBIDDEN, LEASE_CALLS, NAMESPACED_CALLS,
                         SECRET_CALLS, Call, call_of_request, refused_requests)

LEASES = sorted(LEASE_CALLS, key=str)


def lease_rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return one([r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith("-leader-election")],
               "Role")["rules"]


def secret_rules(docs: list[dict[str, Any]], namespace: str) -> list[dict[str, Any]]:
    return one([r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith("-secrets")
                and r["metadata"]["namespace"] == namespace], "Role")["rules"]


# ------------------------------------------------------------------ helpers
def rule_grants(rule: dict[str, Any], call: Call) -> bool:
    resource = f"{call.resource}/{call.subresource}" if call.subresource else call.resource
    return (call.group in rule.get("apiGroups", []) and resource in rule.get("resources", [])
            and call.verb in rule.get("verbs", []) and not rule.get("resourceNames"))


def granted(rules: list[dict[str, Any]], calls: list[Call]) -> set[Call]:
    return {c for c in calls if any(rule_grants(r, c) for r in rules)}


# --------------------------------------------------- 1. the adapter's requests
class _Response:
    def __init__(self, status: int, payload: Any):
        self.status = status
        self.data = json.dumps(payload).encode()

    def read(self) -> bytes:
        return self.data

    def stream(self, *_, **__):   # a watch that ends at once
        return iter(())

    def release_conn(self) -> None:
        pass


class RecordingApiClient:
    """Stands in for kubernetes.client.ApiClient under KubernetesApi: records each request."""

    def __init__(self, conflict_on_create: bool = False):
        self.conflict_on_create = conflict_on_create
        self.requests: list[tuple[str, str]] = []

    def param_serialize(self, method, resource_path, query_params=None, header_params=None, body=None, **_):
        from urllib.parse import urlencode
        query = urlencode(query_params or [])
        return method, resource_path + (f"?{query}" if query else ""), header_params, body, []

    def call_api(self, method, url, header_params=None, body=None, post_params=None, **_):
        self.requests.append((method, url))
        if method == "POST" and self.conflict_on_create and ("/configmaps" in url or "/services" in url
                                                               or "/exactlyoncesnapshots" in url):
            return _Response(409, {"message": "already exists"})
        # Every object read is the stream's ("uid-1"): delete_config_map and delete_service delete it.
        owned = {"name": "obj", "resourceVersion": "7", "uid": "obj-1", "ownerReferences": [{"uid": "uid-1"}]}
        return _Response(200, {"metadata": owned, "spec": {"clusterIP": "None"}, "items": []})


def test_the_adapter_makes_exactly_the_listed_requests():
    from eos_operator.adapters import Kube, KubernetesApi
    from eos_operator.children import StreamRef
    from eos_operator.informer import WatchedKube
    from eos_operator.snapshots import SnapshotRef, snapshot_resource, snapshot_selector

    exercised = {"get_stream", "list_streams", "patch_stream_status", "list_driver_pods", "create_pod", "delete_pod",
                 "apply_config_map", "apply_service", "get_service", "delete_config_map", "delete_service", "post_event",
                 "list_snapshots", "get_snapshot", "create_snapshot", "delete_snapshot", "patch_snapshot_status",
                 "list_pods", "read_secret", "get_node"}
    protocol = {n for n, v in vars(Kube).items() if callable(v) and not n.startswith("_")}
    assert protocol == exercised, (
        f"the Kube protocol changed ({sorted(protocol ^ exercised)}): record the new calls here, "
        "list them in tests/chart/rbac_model.py and grant them in charts/spark-eos-operator/templates/_rbac.tpl")

    requests: list[tuple[str, str]] = []
    for conflict in (False, True):
        client = RecordingApiClient(conflict_on_create=conflict)
        api = KubernetesApi(client)

        async def drive() -> None:
            await api.get_stream("ns", "s")
            await api.list_streams("ns")
            await api.patch_stream_status("ns", "s", {"lifecycleState": "Running"}, "7")
            await api.list_driver_pods("ns", "s")
            await api.create_pod("ns", {"metadata": {"name": "s-driver-1"}})
            await api.delete_pod("ns", "s-driver-1", 60)
            await api.apply_config_map("ns", {"kind": "ConfigMap", "metadata": {"name": "s-run"}})
            await api.apply_service("ns", {"kind": "Service", "metadata": {"name": "s-driver"}, "spec": {}})
            await api.get_service("ns", "s-ui")
            await api.delete_config_map("ns", "s-run", "uid-1")
            await api.delete_service("ns", "s-driver", "uid-1")
            await api.post_event(StreamRef("s", "ns", "uid-1"), "Normal", "Started", "started")
            await api.post_event(StreamRef("s", "ns", "uid-1"), "Normal", "Started", "started")   # counted
            await api.list_snapshots("ns", "s")
            await api.get_snapshot("ns", "s-n1")
            await api.create_snapshot("ns", snapshot_resource("ns", "s", "s-n1", "nonce", max_retries=3,
                                                              dispose_on_delete=True))
            await api.patch_snapshot_status("ns", "s-n1", {"state": "InProgress"}, "7")
            await api.delete_snapshot("ns", "s-n1")
            await api.list_pods("ns", snapshot_selector("s-n1"))
            await api.read_secret("ns", "s3-keys")
            await api.get_node("node-1")
            await api.post_event(SnapshotRef("s-n1", "ns", "uid-2"), "Normal", "SnapshotStarted", "started")

        asyncio.run(drive())
        requests += client.requests
    # The informers (WatchedKube): one list and one watch per collection, here for one exact namespace.
    watched = WatchedKube(RecordingApiClient(), namespaces=("ns",), exact=True)
    for by_scope in watched.informers.values():
        for informer in by_scope.values():
            informer._list()
            informer._watch()
    requests += watched.api.requests
    made = {call_of_request(method, url) for method, url in requests}
    assert made == set(ADAPTER_CALLS), (
        f"requests not in rbac_model.ADAPTER_CALLS: {sorted(map(str, made - set(ADAPTER_CALLS)))}; "
        f"listed but never made: {sorted(map(str, set(ADAPTER_CALLS) - made))}")


def test_the_chart_rules_grant_exactly_the_listed_calls(helm: Helm):
    """Offline: the rendered rules grant every call, and no rule or verb grants anything unlisted."""
    cluster_rules = one(helm.template(), "ClusterRole")["rules"]
    assert granted(cluster_rules, ALL_CALLS) == set(ALL_CALLS) - set(SECRET_CALLS), "no Secret cluster-wide"
    opted_in = one(helm.template("--set", "rbac.secretsClusterWide=true"), "ClusterRole")["rules"]
    assert granted(opted_in, ALL_CALLS) == set(ALL_CALLS)
    listed = helm.template("--set", "rbac.secretNamespaces={a,b}")
    secrets = {ns: secret_rules(listed, ns) for ns in ("a", "b")}
    assert all(granted(rules, ALL_CALLS) == set(SECRET_CALLS) for rules in secrets.values()), secrets
    assert not [r for r in by_kind(helm.template("--set", "rbac.secretsClusterWide=true", "--set",
                                                 "rbac.secretNamespaces={a}"), "Role")
                if r["metadata"]["name"].endswith("-secrets")], "the opt-in makes the per-namespace Roles moot"
    role_rules = next(r for r in by_kind(helm.template("--set", "watchNamespaces={a}"), "Role")
                      if r["metadata"]["namespace"] == "a")["rules"]
    assert granted(role_rules, NAMESPACED_CALLS) == set(NAMESPACED_CALLS)
    assert not granted(role_rules, CLUSTER_CALLS), "namespaced mode grants nothing cluster-wide"
    leases = lease_rules(helm.template())
    assert granted(leases, LEASES) == set(LEASES) and not granted(leases, ALL_CALLS)
    assert not granted(cluster_rules + role_rules, LEASES), "the Lease only in the operator's namespace"
    for rules in (cluster_rules, opted_in, secrets["a"], role_rules, leases):
        for rule in rules:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    res, _, sub = resource.partition("/")
                    for verb in rule["verbs"]:
                        call = Call(verb, group, res, sub, cluster_scoped=group == "apiextensions.k8s.io"
                                    or res == "nodes")
                        assert call in ALL_CALLS + LEASES, f"the chart grants {call}, which the operator never does"


# ------------------------------------------ 2. the installed identity, can-i
def test_cluster_wide_identity_can_do_exactly_its_job(helm: Helm, kubectl: Kubectl, namespaces, releases):
    ns = namespaces("chart-rbac")
    release = unique("rbac")
    tenant = namespaces("chart-rbac-tenant")
    manifest = install(helm, release, ns, "--set", f"rbac.secretNamespaces={{{tenant}}}")
    releases(release, ns)
    sa = one(manifest, "ServiceAccount")["metadata"]["name"]
    user = sa_user(ns, sa)
    elsewhere = unique("any-namespace")  # cluster-wide: any namespace, existing or not
    wait_until(lambda: can_i(kubectl, user, NAMESPACED_CALLS[0], elsewhere), "the new binding to take effect", 30)
    denied = [f"{c} in {where}" for c in ALL_CALLS for where in (ns, elsewhere)
              if c not in SECRET_CALLS and not can_i(kubectl, user, c, where)]
    assert not denied, f"{user} may not: {denied}"
    # Secrets only where listed (rbac.secretNamespaces): not in its own namespace, not anywhere else.
    wait_until(lambda: can_i(kubectl, user, SECRET_CALLS[0], tenant), "the Secret binding to take effect", 30)
    leaked = [f"{c} in {where}" for c in SECRET_CALLS for where in (ns, elsewhere) if can_i(kubectl, user, c, where)]
    assert not leaked, f"{user} may read Secrets outside rbac.secretNamespaces: {leaked}"
    allowed = [str(c) for c in FORBIDDEN if can_i(kubectl, user, c, elsewhere)]
    assert not allowed, f"{user} may, but never needs to: {allowed}"
    lease = [(str(c), can_i(kubectl, user, c, ns), can_i(kubectl, user, c, elsewhere)) for c in LEASES]
    assert all(here and not there for _, here, there in lease), f"the Lease, here and elsewhere: {lease}"


def test_namespaced_identity_is_confined_to_the_watched_namespaces(helm: Helm, kubectl: Kubectl, namespaces,
                                                                   releases):
    ns, a, b = namespaces("chart-rbac"), namespaces("chart-rbac-a"), namespaces("chart-rbac-b")
    release = unique("rbac")
    manifest = install(helm, release, ns, "--set", f"watchNamespaces={{{a},{b}}}")
    releases(release, ns)
    assert not [d for d in manifest if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    user = sa_user(ns, one(manifest, "ServiceAccount")["metadata"]["name"])
    wait_until(lambda: can_i(kubectl, user, NAMESPACED_CALLS[0], b), "the new bindings to take effect", 30)
    denied = [f"{c} in {where}" for c in NAMESPACED_CALLS for where in (a, b) if not can_i(kubectl, user, c, where)]
    assert not denied, f"{user} may not: {denied}"
    leaked = [f"{c} in {where}" for c in ALL_CALLS for where in (ns, unique("other"))
              if can_i(kubectl, user, c, where)]
    assert not leaked, f"{user} may act outside the watched namespaces: {leaked}"
    allowed = [str(c) for c in FORBIDDEN if can_i(kubectl, user, c, a)]
    assert not allowed, f"{user} may, but never needs to: {allowed}"
    lease = [(str(c), can_i(kubectl, user, c, ns), can_i(kubectl, user, c, a)) for c in LEASES]
    assert all(here and not there for _, here, there in lease), f"the Lease, here and watched: {lease}"


def test_job_identity_gets_only_what_a_cluster_mode_driver_needs(helm: Helm, kubectl: Kubectl, namespaces,
                                                                 releases):
    ns, a = namespaces("chart-job"), namespaces("chart-job-a")
    release = unique("job")
    manifest = install(helm, release, ns, "--set", f"watchNamespaces={{{a}}}", "--set", "jobRbac.create=true")
    releases(release, ns)
    driver = sa_user(a, "spark-eos-driver")
    assert ("ServiceAccount", a, "spark-eos-driver") in {
        (d["kind"], d["metadata"]["namespace"], d["metadata"]["name"]) for d in manifest}
    needed = [Call(v, "", r) for r in ("pods", "services", "configmaps", "persistentvolumeclaims")
              for v in ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")]
    wait_until(lambda: can_i(kubectl, driver, needed[0], a), "the driver binding to take effect", 30)
    denied = [str(c) for c in needed if not can_i(kubectl, driver, c, a)]
    assert not denied, denied
    for call in (Call("get", "", "secrets"), Call("create", "", "pods", "exec"),
                 Call("get", "streaming.eos.dev", "exactlyoncestreams"), Call("create", "apps", "deployments")):
        assert not can_i(kubectl, driver, call, a), f"the driver may {call}"
    assert not can_i(kubectl, driver, Call("list", "", "pods"), ns), "the driver may act outside its namespace"


# ------------------------------------------- 3. every verb of every rule needed
def test_every_rule_and_every_verb_is_needed(helm: Helm, kubectl: Kubectl, stack_env):
    from kubernetes import client, config

    # The Lease Role's rules too (as if granted everywhere: what each verb is needed for is the same).
    rendered = helm.template("--set", "rbac.secretNamespaces={a}")
    rules = one(rendered, "ClusterRole")["rules"] + lease_rules(rendered) + secret_rules(rendered, "a")
    calls = ALL_CALLS + LEASES
    variants: list[tuple[str, list[dict[str, Any]]]] = []
    for i, rule in enumerate(rules):
        what = f"{','.join(rule['resources'])}"
        variants.append((f"without rule {i} ({what})", rules[:i] + rules[i + 1:]))
        if len(rule["verbs"]) > 1:
            for verb in rule["verbs"]:
                reduced = copy.deepcopy(rules)
                reduced[i]["verbs"].remove(verb)
                variants.append((f"without {verb} on {what}", reduced))
    variants.append(("the chart's rules", rules))

    # A label value, so never all digits and an "e": YAML 1.2 (kubectl) reads "81e171" as a number and
    # refused the manifest in a clean-clone run; PyYAML does not quote it.
    run = "r" + uuid.uuid4().hex[:6]
    label = f"eos-chart-test/run={run}"
    docs = []
    for k, (_, variant) in enumerate(variants):
        name = f"eos-chart-probe-{run}-{k}"
        meta = {"name": name, "labels": {"eos-chart-test/run": run}}
        docs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": meta,
                     "rules": variant})
        docs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": meta,
                     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                     "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": name}]})
    kubectl.run("apply", "-f", "-", stdin=yaml.safe_dump_all(docs))
    api = client.AuthorizationV1Api(config.new_client_from_config(config_file=stack_env["KUBECONFIG"]))

    def allowed(user: str, call: Call) -> bool:
        attrs = client.V1ResourceAttributes(verb=call.verb, group=call.group, resource=call.resource,
                                            subresource=call.subresource or None,
                                            namespace=None if call.cluster_scoped else "anywhere")
        review = client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
            user=user, groups=["system:authenticated"], resource_attributes=attrs))
        return bool(api.create_subject_access_review(review).status.allowed)

    try:
        expected = [granted(variant, calls) for _, variant in variants]
        # Each variant may only take effect after the authorizer's cache saw it: wait for
        # what it grants, then what it does not grant is refused for good.
        pending = set(range(len(variants)))

        def all_granted() -> bool:
            for k in sorted(pending):
                if all(allowed(f"eos-chart-probe-{run}-{k}", c) for c in expected[k]):
                    pending.discard(k)
            return not pending

        wait_until(all_granted, "every probe role to take effect", 60)
        assert expected[-1] == set(calls)
        for k, (what, _) in enumerate(variants[:-1]):
            user = f"eos-chart-probe-{run}-{k}"
            refused = {c for c in calls if not allowed(user, c)}
            assert refused, f"{what}: the operator would lose nothing, so the chart grants too much"
            assert refused == set(calls) - expected[k], (what, sorted(map(str, refused)))
    finally:
        kubectl.run("delete", "clusterrolebinding,clusterrole", "-l", label, "--wait=false", check=False)


# ----------------------------------- 4. the operator, under the chart identity
def stream(name: str, bootstrap: str, topic: str, checkpoint: Path) -> dict[str, Any]:
    # cluster deploy mode: the operator also creates the headless driver Service.
    return colors_manifest(name, bootstrap, topic, topic + "-out", checkpoint, parallelism=1,
                           job={"deployMode": "cluster", "serviceAccountName": "spark-eos-driver"})


def test_the_operator_works_under_the_chart_identity(helm: Helm, kubectl: Kubectl, namespaces, releases,
                                                     stack_env, tmp_path):
    from examples.colors.local_run import create_topics

    ns, watched = namespaces("chart-op"), namespaces("chart-op-w")
    release = unique("op")
    manifest = install(helm, release, ns, "--set", f"watchNamespaces={{{watched}}}", "--set", "jobRbac.create=true",
                       "--set", "operator.reconcileIntervalSeconds=1",
                       "--set", "operator.allowLocalStore=true")   # the stream below keeps its checkpoint locally
    releases(release, ns)
    kubectl.run("wait", "--for=condition=Established", "crd/exactlyoncestreams.streaming.eos.dev", "--timeout=60s")
    sa = one(manifest, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    kubeconfig = token_kubeconfig(kubectl, stack_env["KUBECONFIG"], ns, sa, tmp_path / "operator.kubeconfig")
    as_operator = Kubectl(stack_env, str(kubeconfig))
    assert as_operator.run("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}").stdout == sa_user(ns, sa)
    wait_until(lambda: as_operator.run("get", "exactlyoncestreams", "-n", watched, check=False).returncode == 0,
               "the operator's Role to take effect", 30)

    # The Deployment's own command line, with the liveness port moved to a free local one.
    args = one(manifest, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "python"
    port = free_port()
    argv = [sys.executable, *args[1:], f"--kubeconfig={kubeconfig}"]
    argv = [f"--liveness=http://127.0.0.1:{port}/healthz" if a.startswith("--liveness=") else a for a in argv]
    log_path = tmp_path / "operator.log"
    # $KUBECONFIG too: kopf logs in through the kubernetes client, which fixes its default
    # kubeconfig path when it is first imported, before `run --kubeconfig` takes effect.
    # No other credentials are reachable from this process.
    # The downward API's POD_NAMESPACE and POD_NAME: the Lease is in the release's namespace.
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "POD_NAMESPACE": ns, "POD_NAME": f"{release}-op-0"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "operator"), str(REPO / "jobs"), str(REPO)])
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    name = "colors"

    def diagnostics() -> str:
        state = kubectl.run("get", "exactlyoncestreams,pods,configmaps,services,events", "-n", watched,
                            check=False).stdout
        return f"{state}\noperator log:\n" + "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])

    try:
        health = wait_until(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2).status,
                            "the operator's liveness endpoint", 90, diagnostics)
        assert health == 200
        lease_name = one(manifest, "Deployment")["metadata"]["name"]
        lease = kubectl.json("get", "lease", lease_name, "-n", ns)
        assert lease["spec"]["holderIdentity"] == f"{release}-op-0", lease
        topic = unique("chart-rbac-events")
        create_topics(stack_env["KAFKA_BOOTSTRAP"], {topic: 1, topic + "-out": 1})
        kubectl.run("apply", "-n", watched, "-f", "-",
                    stdin=yaml.safe_dump(stream(name, stack_env["KAFKA_BOOTSTRAP"], topic, tmp_path / "ckpt")))

        def launched() -> dict[str, Any] | None:
            pods = kubectl.json("get", "pods", "-n", watched, "-l", f"streaming.eos.dev/stream={name}")["items"]
            have = (kubectl.exists("configmap", f"{name}-run", "-n", watched)
                    and kubectl.exists("service", f"{name}-driver", "-n", watched))
            return pods[0] if pods and have else None

        pod = wait_until(launched, "the operator to create the run ConfigMap, driver Service and driver Pod",
                         150, diagnostics)
        assert pod["spec"]["serviceAccountName"] == "spark-eos-driver"
        obj = kubectl.json("get", "exactlyoncestream", name, "-n", watched)
        assert obj["status"].get("lifecycleState"), obj["status"]
        assert "streaming.eos.dev/finalizer" in obj["metadata"].get("finalizers", [])
        events = kubectl.json("get", "events", "-n", watched)["items"]
        assert any(e["source"].get("component") == "eos-operator" for e in events), "no event from the operator"

        kubectl.run("delete", "exactlyoncestream", name, "-n", watched, "--wait=false")
        wait_until(lambda: not kubectl.exists("exactlyoncestream", name, "-n", watched),
                   "the operator to stop the driver and release the finalizer", 120, diagnostics)
        leftovers = kubectl.run("get", "pods,configmaps,services", "-n", watched, "-l",
                                f"streaming.eos.dev/stream={name}", "-o", "name").stdout.split()
        assert not leftovers, leftovers
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        for s in kubectl.json("get", "exactlyoncestreams", "-n", watched)["items"]:
            kubectl.run("patch", "exactlyoncestream", s["metadata"]["name"], "-n", watched, "--type=merge", "-p",
                        '{"metadata":{"finalizers":null}}', check=False)
    refused = refused_requests(log_path.read_text(errors="replace"))
    assert not refused, "the operator was refused requests under the chart identity:\n" + "\n".join(refused)
