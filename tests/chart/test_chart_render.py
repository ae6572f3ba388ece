"""The chart renders, lints, passes the API server's own schema validation, refuses bad
values by name, carries the generated CRD unchanged and never grants a wildcard."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from .helpers import CHART, chart_version, REPO, VALUES_ALL, Helm, Kubectl, by_kind, one, values_all

INVALID = sorted((Path(__file__).parent / "invalid-values").glob("*.yaml"))
RBAC_KINDS = ("Role", "ClusterRole")


def expected_error(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name}: the first line must be '# expect: <error text>'"
    return first[len("# expect: "):].strip()


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    containers = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


# --------------------------------------------------------------------- static
def test_chart_crds_are_the_generated_crds():
    generated = {p.name: p.read_text() for p in (REPO / "crds").glob("*.yaml")}
    in_chart = {p.name: p.read_text() for p in (CHART / "crds").glob("*.yaml")}
    assert generated, "crds/ is empty: run `python -m eos_operator.crd`"
    assert in_chart.keys() == generated.keys(), (
        f"charts/spark-eos-operator/crds/ has {sorted(in_chart)}, crds/ has {sorted(generated)}: "
        "copy crds/*.yaml into the chart")
    for name, text in generated.items():
        assert in_chart[name] == text, (
            f"charts/spark-eos-operator/crds/{name} drifted from crds/{name}: "
            f"cp crds/{name} charts/spark-eos-operator/crds/")


def test_invalid_values_corpus_is_large_enough():
    assert len(INVALID) >= 10
    for path in INVALID:
        expected_error(path)


def test_templates_spell_out_every_rbac_rule():
    for path in (CHART / "templates").glob("*"):
        text = path.read_text()
        for bad in ('"*"', "'*'", "- *\n", "[*]"):
            assert bad not in text, f"{path.name} contains a wildcard ({bad.strip()})"


# ----------------------------------------------------------------- helm lint
def test_lint_default_values(helm: Helm):
    out = helm.run("lint", "--strict", str(CHART)).stdout
    assert "0 chart(s) failed" in out


def test_lint_every_option(helm: Helm, tmp_path):
    out = helm.run("lint", "--strict", str(CHART), "-f", str(values_all(tmp_path / "v.yaml", "team-a", "team-b")),
                   ).stdout
    assert "0 chart(s) failed" in out


# ------------------------------------------------------------- helm template
def test_default_render_watches_every_namespace_with_a_cluster_role(helm: Helm):
    docs = helm.template(namespace="ops")
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "Deployment", "PodDisruptionBudget", "Role", "RoleBinding",
                     "Service", "ServiceAccount"], kinds
    c = container(docs)
    assert c["args"][:4] == ["python", "-m", "eos_operator", "run"]
    assert "--all-namespaces" in c["args"] and not any(a.startswith("--namespace") for a in c["args"])
    assert "--liveness=http://0.0.0.0:8080/healthz" in c["args"]
    assert "--verbose" not in c["args"]
    assert "--allow-ambient-s3-credentials" not in c["args"]   # the operator's own identity: opt-in only
    assert "--log-format=text" in c["args"]
    binding = one(docs, "ClusterRoleBinding")
    sa = one(docs, "ServiceAccount")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": "ops"}]
    assert binding["roleRef"]["name"] == one(docs, "ClusterRole")["metadata"]["name"]
    assert c["image"] == f"ghcr.io/spark-eos/spark-eos-operator:{chart_version('appVersion')}"
    assert not [r for r in by_kind(docs, "Role") if not r["metadata"]["name"].endswith("-leader-election")], \
        "job RBAC is off by default (local deploy mode needs none)"


def test_deployment_is_two_hardened_replicas_electing_a_leader(helm: Helm):
    docs = helm.template()
    dep = one(docs, "Deployment")
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    args = container(docs)["args"]
    assert "--leader-election" in args and "--lease-duration=10" in args
    assert "--leader-election-id=eos-spark-eos-operator" in args
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in container(docs)["env"]}
    assert env["POD_NAME"] == "metadata.name" and env["POD_NAMESPACE"] == "metadata.namespace"
    spread = dep["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert spread["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]["topologyKey"] == \
        "kubernetes.io/hostname"
    lease_role = one([d for d in by_kind(docs, "Role") if d["metadata"]["name"].endswith("-leader-election")], "Role")
    assert lease_role["metadata"]["namespace"] == "eos-system"
    assert lease_role["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                                    "verbs": ["get", "create", "update"]}]
    # Without leader election: one replica, Recreate, no Lease RBAC; more replicas are refused by name.
    single = helm.template("--set", "leaderElection.enabled=false", "--set", "replicas=1")
    assert one(single, "Deployment")["spec"]["replicas"] == 1
    assert one(single, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    assert "--leader-election" not in container(single)["args"] and not by_kind(single, "Role")
    refused = helm.run("template", "x", str(CHART), "--set", "leaderElection.enabled=false", check=False)
    assert refused.returncode != 0 and "needs leaderElection.enabled=true" in refused.stderr
    # Two replicas: a drain takes them one at a time; one replica gets no budget (it would block every drain).
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": dep["spec"]["selector"]["matchLabels"]}}
    assert not by_kind(single, "PodDisruptionBudget")
    assert not by_kind(helm.template("--set", "podDisruptionBudget.enabled=false"), "PodDisruptionBudget")
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container(docs)["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 10001
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert {"name": "tmp", "mountPath": "/tmp"} in container(docs)["volumeMounts"]
    assert any(v["name"] == "tmp" and "emptyDir" in v for v in pod["volumes"])
    c = container(docs)
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["ports"] == [{"name": "health", "containerPort": 8080, "protocol": "TCP"},
                          {"name": "metrics", "containerPort": 9090, "protocol": "TCP"}]
    assert "--metrics-port=9090" in c["args"]
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    svc = one(docs, "Service")
    assert [(p["name"], p["targetPort"]) for p in svc["spec"]["ports"]] == [("health", "health"),
                                                                           ("metrics", "metrics")]
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]


def test_every_option_renders_where_it_belongs(helm: Helm, tmp_path):
    values = values_all(tmp_path / "v.yaml", "team-a", "team-b")
    docs = helm.template("-f", str(values), namespace="ops")
    assert not by_kind(docs, "ClusterRole") and not by_kind(docs, "ClusterRoleBinding"), (
        "watchNamespaces set: nothing cluster-wide")
    roles = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in by_kind(docs, "Role")}
    assert roles == {("team-a", "stream-operator"), ("team-b", "stream-operator"), ("team-a", "spark-driver"),
                     ("ops", "stream-operator-leader-election")}
    for rb in by_kind(docs, "RoleBinding"):
        if rb["metadata"]["name"] in ("stream-operator", "stream-operator-leader-election"):
            assert rb["subjects"] == [{"kind": "ServiceAccount", "name": "stream-operator-sa", "namespace": "ops"}]
        else:
            assert rb["subjects"] == [{"kind": "ServiceAccount", "name": "spark-driver",
                                       "namespace": rb["metadata"]["namespace"]}]
    sas = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in by_kind(docs, "ServiceAccount")}
    assert sas == {("ops", "stream-operator-sa"), ("team-a", "spark-driver")}
    c = container(docs)
    assert c["image"].endswith("@sha256:" + "0123456789abcdef" * 4)
    assert c["imagePullPolicy"] == "Always"
    assert [a for a in c["args"] if a.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]
    assert "--all-namespaces" not in c["args"]
    for arg in ("--verbose", "--interval=2.5", "--resolution-timeout=90", "--progress-interval=20",
                "--horizon-interval=120", "--liveness=http://0.0.0.0:9090/live", "--metrics-port=9464",
                "--allow-local-store", "--allow-ambient-s3-credentials", "--log-format=json"):
        assert arg in c["args"]
    assert {"name": "HTTPS_PROXY", "value": "http://proxy.example.com:3128"} in c["env"]
    pod = one(docs, "Deployment")["spec"]["template"]
    assert pod["metadata"]["labels"]["team"] == "streaming"
    assert pod["metadata"]["annotations"] == {"example.com/scrape": "no"}
    spec = pod["spec"]
    assert spec["imagePullSecrets"] == [{"name": "registry-pull"}, {"name": "registry-pull-backup"}]
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert spec["schedulerName"] == "streaming-scheduler"
    assert spec["hostAliases"] == [{"ip": "10.1.2.3", "hostnames": ["api.internal.example.com"]}]
    assert [v["name"] for v in spec["volumes"]] == ["tmp", "kafka-ca"]
    assert c["volumeMounts"][1:] == [{"name": "kafka-ca", "mountPath": "/etc/kafka-ca", "readOnly": True}]
    assert len(spec["tolerations"]) == 2
    assert set(spec["affinity"]) == {"nodeAffinity", "podAntiAffinity"}
    assert spec["priorityClassName"] == "system-cluster-critical"
    assert spec["terminationGracePeriodSeconds"] == 45
    assert c["livenessProbe"]["failureThreshold"] == 5 and c["readinessProbe"]["periodSeconds"] == 5
    assert c["resources"]["limits"] == {"cpu": "1", "memory": "1Gi"}
    svc = one(docs, "Service")
    assert svc["spec"]["type"] == "NodePort" and [p["port"] for p in svc["spec"]["ports"]] == [9090, 9464]
    assert svc["metadata"]["annotations"] == {"prometheus.io/scrape": "false"}
    assert one(docs, "Deployment")["metadata"]["name"] == "stream-operator"


def test_metrics_can_be_turned_off_and_need_their_own_port(helm: Helm):
    docs = helm.template("--set", "metrics.enabled=false")
    c = container(docs)
    assert not [a for a in c["args"] if a.startswith("--metrics")]
    assert [p["name"] for p in c["ports"]] == ["health"]
    assert [p["name"] for p in one(docs, "Service")["spec"]["ports"]] == ["health"]
    clash = helm.run("template", "x", str(CHART), "--set", "metrics.port=8080", check=False)
    assert clash.returncode != 0 and "metrics.port must differ from health.port" in clash.stderr


def test_every_values_all_key_is_a_chart_value():
    """values-all.yaml sets every option: its keys are exactly the chart's (plus `global`)."""
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    everything = yaml.safe_load(VALUES_ALL.read_text())

    def keys(node: Any, prefix: str = "", depth: int = 2) -> set[str]:
        if not isinstance(node, dict) or depth == 0:
            return set()
        out = set()
        for k, v in node.items():
            out.add(prefix + k)
            out |= keys(v, prefix + k + ".", depth - 1)
        return out

    assert keys(defaults) <= keys(everything), f"not exercised: {sorted(keys(defaults) - keys(everything))}"


def test_job_rbac_defaults_to_the_watched_namespaces(helm: Helm):
    docs = helm.template("--set", "jobRbac.create=true", "--set", "watchNamespaces={a,b}")
    assert {d["metadata"]["namespace"] for d in by_kind(docs, "Role")
            if d["metadata"]["name"] == "spark-eos-driver"} == {"a", "b"}
    docs = helm.template("--set", "jobRbac.create=true", namespace="ops")
    roles = [r for r in by_kind(docs, "Role") if not r["metadata"]["name"].endswith("-leader-election")]
    assert [(r["metadata"]["namespace"], r["metadata"]["name"]) for r in roles] == [("ops", "spark-eos-driver")]
    (rule,) = roles[0]["rules"]
    assert rule["apiGroups"] == [""]
    assert sorted(rule["resources"]) == ["configmaps", "persistentvolumeclaims", "pods", "services"]


def test_existing_service_account_and_no_rbac(helm: Helm):
    docs = helm.template("--set", "serviceAccount.create=false", "--set", "serviceAccount.name=preexisting",
                         "--set", "rbac.create=false", "--set", "service.enabled=false")
    # no Lease Role either: you bind it; the operator's PodDisruptionBudget (two replicas) stays
    assert sorted(d["kind"] for d in docs) == ["Deployment", "PodDisruptionBudget"]
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "preexisting"


@pytest.mark.parametrize("extra", [[], ["--set", "jobRbac.create=true"], ["-f", "ALL"]], ids=["default", "job", "all"])
def test_no_wildcard_in_any_rendered_rule(helm: Helm, tmp_path, extra):
    extra = [str(values_all(tmp_path / "v.yaml", "a", "b")) if e == "ALL" else e for e in extra]
    docs = helm.template(*extra)
    rules = [r for d in docs if d["kind"] in RBAC_KINDS for r in d["rules"]]
    assert rules
    for rule in rules:
        for field in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
            for item in rule.get(field) or []:
                assert "*" not in item, f"wildcard in {field}: {rule}"


def test_notes_say_what_to_apply_next(helm: Helm):
    out = helm.run("install", "eos", str(CHART), "--dry-run=client", "--namespace", "ops").stdout
    notes = out.split("NOTES:", 1)[1]
    assert "kubectl apply -n default -f examples/colors.yaml" in notes
    assert "rollout status deployment/eos-spark-eos-operator" in notes
    assert "kind: ExactlyOnceSnapshot" in notes and "kubectl get eoss -n default" in notes
    out = helm.run("install", "eos", str(CHART), "--dry-run=client", "--namespace", "ops",
                   "--set", "watchNamespaces={team-a}", "--set", "jobRbac.create=true").stdout
    notes = out.split("NOTES:", 1)[1]
    assert "kubectl apply -n team-a -f examples/colors.yaml" in notes
    assert "serviceAccountName: spark-eos-driver" in notes


# ------------------------------------------------------------- invalid values
@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_invalid_values_are_refused_by_name(helm: Helm, path):
    expected = expected_error(path)
    for command in (["template", "eos", str(CHART)], ["lint", str(CHART)]):
        proc = helm.run(*command, "-f", str(path), check=False)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, f"helm {command[0]} accepted {path.name}:\n{out}"
        assert "values don't meet the specifications of the schema" in out, out
        assert expected in out, f"helm {command[0]} on {path.name} did not mention {expected!r}:\n{out}"


# Rules values.schema.json cannot say (they compare two values) are `fail`s in the templates; helm lint only logs a
# `fail` and renders on, so every one goes through the eos.fail helper, which stops lint too.
TEMPLATE_RULES = [(["--set", "metrics.port=8080"], "metrics.port must differ from health.port")]


@pytest.mark.parametrize("values,expected", TEMPLATE_RULES, ids=["metrics-port-is-health-port"])
def test_template_rules_stop_helm_lint_as_well_as_template(helm: Helm, values, expected):
    for command in (["template", "eos", str(CHART)], ["lint", "--strict", str(CHART)], ["lint", str(CHART)]):
        proc = helm.run(*command, *values, check=False)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, f"helm {command[0]} accepted {values}:\n{out}"
        assert expected in out, f"helm {command[0]} did not mention {expected!r}:\n{out}"


def test_every_template_rule_goes_through_eos_fail():
    calls = {path.name: len(re.findall(r"\{\{-?\s*fail\b", path.read_text()))
             for path in (CHART / "templates").glob("*")}
    assert calls.pop("_helpers.tpl") == 1                            # eos.fail itself
    assert not any(calls.values()), f"a bare `fail` passes helm lint; use include \"eos.fail\" \"<message>\": {calls}"


# ----------------------------------------- the API server's schema validation
def server_validate(kubectl: Kubectl, docs: list[dict[str, Any]]) -> str:
    manifest = yaml.safe_dump_all(docs)
    proc = kubectl.run("apply", "--dry-run=server", "--validate=strict", "-f", "-", stdin=manifest, check=False)
    assert proc.returncode == 0, f"the API server refused the rendered chart:\n{proc.stderr}\n{proc.stdout}"
    return proc.stdout


def test_default_render_passes_server_validation(helm: Helm, kubectl: Kubectl, namespaces):
    ns = namespaces("chart-dry")
    docs = helm.template(release="dry", namespace=ns)
    out = server_validate(kubectl, docs)
    assert out.count("(server dry run)") == len(docs), out


def test_every_option_passes_server_validation(helm: Helm, kubectl: Kubectl, namespaces, tmp_path):
    ns, a, b = namespaces("chart-dry"), namespaces("chart-dry-a"), namespaces("chart-dry-b")
    docs = helm.template("-f", str(values_all(tmp_path / "v.yaml", a, b)), release="dry", namespace=ns)
    out = server_validate(kubectl, docs)
    assert out.count("(server dry run)") == len(docs), out


def test_the_server_validation_does_catch_mistakes(helm: Helm, kubectl: Kubectl, namespaces):
    """The dry run is a real check: a field the API does not know is refused."""
    ns = namespaces("chart-dry")
    docs = helm.template(release="dry", namespace=ns)
    one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["securityContext"]["runAsNonroot"] = True
    proc = kubectl.run("apply", "--dry-run=server", "--validate=strict", "-f", "-", stdin=yaml.safe_dump_all(docs),
                       check=False)
    assert proc.returncode != 0 and "runAsNonroot" in proc.stderr, proc.stderr


# ------------------------------------------------- the operator's command line
@pytest.mark.parametrize("extra", [[], ["-f", "ALL"]], ids=["default", "all"])
def test_the_operator_cli_accepts_the_rendered_arguments(helm: Helm, tmp_path, extra):
    """Every flag the Deployment passes exists in `python -m eos_operator run`, with a valid value."""
    from eos_operator.cli import _parser

    extra = [str(values_all(tmp_path / "v.yaml", "team-a", "team-b")) if e == "ALL" else e for e in extra]
    args = container(helm.template(*extra))["args"]
    assert args[:3] == ["python", "-m", "eos_operator"]
    parsed = _parser().parse_args(args[3:])  # argparse exits (SystemExit) on an unknown flag or bad value
    assert parsed.command == "run" and parsed.standalone and parsed.peering is None
    assert parsed.liveness.startswith("http://0.0.0.0:")
    if extra:
        assert parsed.namespace == ["team-a", "team-b"] and parsed.verbose and parsed.allow_ambient_s3_credentials
        assert parsed.log_format == "json"
        assert (parsed.interval, parsed.resolution_timeout, parsed.progress_interval,
                parsed.horizon_interval) == (2.5, 90.0, 20.0, 120.0)
    else:
        assert parsed.all_namespaces and parsed.namespace == [] and not parsed.verbose
        assert not parsed.allow_ambient_s3_credentials and parsed.log_format == "text"


def test_network_policies_are_opt_in_and_confine_the_operator_and_the_stream_pods(helm: Helm, tmp_path):
    """Off by default; with every option (values-all.yaml, which the API server also validates above): the
    operator's Pods take health and metrics only from the listed peers and reach only DNS, the API server and
    the listed egress; each watched namespace's stream Pods reach those and their own namespace."""
    assert not by_kind(helm.template(), "NetworkPolicy")
    docs = helm.template("-f", str(values_all(tmp_path / "v.yaml", "team-a", "team-b")), namespace="ops")
    policies = {(p["metadata"]["namespace"], p["metadata"]["name"]): p["spec"] for p in by_kind(docs, "NetworkPolicy")}
    assert set(policies) == {("ops", "stream-operator"), ("team-a", "stream-operator-streams"),
                             ("team-b", "stream-operator-streams")}
    op = policies[("ops", "stream-operator")]
    assert op["podSelector"]["matchLabels"] == one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    assert op["policyTypes"] == ["Ingress", "Egress"]
    assert [p["port"] for p in op["ingress"][0]["ports"]] == ["health", "metrics"]
    assert op["ingress"][0]["from"] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "monitoring"}}}]
    assert op["egress"] == [
        {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]},
        {"to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}], "ports": [{"port": 9093, "protocol": "TCP"}]},
        {"to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}], "ports": [{"port": 6443, "protocol": "TCP"}]}]
    streams = policies[("team-a", "stream-operator-streams")]
    assert streams["podSelector"] == {"matchLabels": {"app.kubernetes.io/managed-by": "eos-operator"}}
    assert streams["ingress"] == [{"from": [{"podSelector": {}}]}]
    assert streams["egress"] == [{"to": [{"podSelector": {}}]}] + op["egress"]
