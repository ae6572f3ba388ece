"""The chart's monitoring bundle: ServiceMonitor, PrometheusRule, Grafana dashboard and the drivers' PodMonitor.

The alerting rules are one file, files/alerts.yaml, that the PrometheusRule carries unchanged; promtool
(built by the stack, PROMTOOL in .stack/env) checks it and runs its unit tests (alerts_test.yaml: every
alert fires where it must and stays silent where it must not). The dashboard is files/dashboard.json, in
a ConfigMap for Grafana's sidecar. Every eos_* metric both use is one the operator exports; every spark_* one
is a name the drivers' PodMonitor gives Spark's driver metrics (files/driver-metric-relabelings.yaml; that a
real driver's series get those names: tests/e2e/test_driver_metrics_e2e.py).
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from .helpers import CHART, Helm, by_kind, one

HERE = Path(__file__).resolve().parent
ALERTS = CHART / "files" / "alerts.yaml"
DASHBOARD = CHART / "files" / "dashboard.json"
RELABELINGS = CHART / "files" / "driver-metric-relabelings.yaml"
ALERTS_TEST = HERE / "alerts_test.yaml"
ALL_ON = ["--set", "monitoring.serviceMonitor.enabled=true", "--set", "monitoring.prometheusRule.enabled=true",
          "--set", "monitoring.dashboard.enabled=true", "--set", "monitoring.driverPodMonitor.enabled=true"]
MONITORING_KINDS = ("ServiceMonitor", "PrometheusRule", "PodMonitor")
ROWS = ["Readiness and lifecycle", "Progress and batches", "Restarts and failures", "Replay horizon",
        "Snapshots and upgrades", "Operator health", "Driver (Spark metrics)"]


def alert_rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


def dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            q = var["query"]["query"]
            assert q.startswith("label_values(") and q.endswith(")"), q
            exprs.append(q[len("label_values("):q.rindex(",")])
    return exprs


def dashboard_docs(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in by_kind(docs, "ConfigMap") if d["metadata"].get("labels", {}).get("grafana_dashboard")]


@pytest.fixture
def promtool(stack_env) -> str:
    exe = stack_env.get("PROMTOOL")
    assert exe, ".stack/env has no PROMTOOL: `python -m eos_stack up prometheus` builds it"
    return exe


def run_promtool(promtool: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120)


# ------------------------------------------------------------------------------------ promtool
def test_promtool_checks_the_shipped_rules(promtool):
    proc = run_promtool(promtool, "check", "rules", str(ALERTS))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in proc.stdout, proc.stdout


def test_promtool_unit_tests_pass(promtool):
    """alerts_test.yaml feeds series to the shipped file and asserts each alert's labels and annotations."""
    proc = run_promtool(promtool, "test", "rules", str(ALERTS_TEST))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout, proc.stdout


def test_promtool_unit_tests_can_fail(promtool, tmp_path):
    """A negative control: the same tests against a rule file with the storm threshold lowered fail."""
    loosened = ALERTS.read_text()
    assert loosened.count(") >= 4") == 1
    (tmp_path / "alerts.yaml").write_text(loosened.replace(") >= 4", ") >= 3"))
    (tmp_path / "alerts_test.yaml").write_text(
        ALERTS_TEST.read_text().replace("../../charts/spark-eos-operator/files/alerts.yaml", "alerts.yaml"))
    proc = run_promtool(promtool, "test", "rules", str(tmp_path / "alerts_test.yaml"))
    assert proc.returncode != 0 and "EosStreamRestartStorm" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_the_unit_tests_use_the_shipped_file_and_cover_every_alert_both_ways():
    tests = yaml.safe_load(ALERTS_TEST.read_text())
    assert [(ALERTS_TEST.parent / f).resolve() for f in tests["rule_files"]] == [ALERTS.resolve()]
    fires, silent = set(), set()
    for group in tests["tests"]:
        for case in group.get("alert_rule_test", []):
            (fires if case.get("exp_alerts") else silent).add(case["alertname"])
    names = {r["alert"] for r in alert_rules()}
    assert names - fires == set(), f"no case where these fire: {sorted(names - fires)}"
    assert names - silent == set(), f"no case where these must stay silent: {sorted(names - silent)}"


def test_every_alert_has_a_severity_and_says_what_to_do():
    rules = alert_rules()
    assert {r["alert"] for r in rules} >= {"EosStreamNotReady", "EosStreamRestartStorm",
                                           "EosStreamReplayHorizonShrinking", "EosStreamNondeterministicOutput",
                                           "EosStreamUpgradeBlocked", "EosStreamUpgradeRolledBack"}
    for rule in rules:
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert set(rule["annotations"]) == {"summary", "description"}, rule["alert"]
        assert "kubectl eos " in rule["annotations"]["description"], f"{rule['alert']}: no next step"
    not_ready = next(r for r in rules if r["alert"] == "EosStreamNotReady")
    assert not_ready["for"] == "10m"


def _exported_series() -> set[str]:
    """Every series name the operator's registries expose (metrics.py and op_metrics.py)."""
    from prometheus_client import CollectorRegistry

    from eos_operator.metrics import StreamMetrics
    from eos_operator.op_metrics import OperatorMetrics

    registry = CollectorRegistry()
    StreamMetrics(registry)
    OperatorMetrics(registry)
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"], "gauge": [""]}
    return {fam.name + s for fam in registry.collect() for s in suffixes[fam.type]}


def test_alerts_and_dashboard_use_only_series_the_operator_exports():
    exported = _exported_series()
    assert "eos_stream_events_total" in exported and "eos_operator_reconcile_duration_seconds_bucket" in exported
    alert_text = [r["expr"] for r in alert_rules()] + [v for r in alert_rules() for v in r["annotations"].values()]
    used_in_alerts = {m for t in alert_text for m in re.findall(r"\beos_[a-z_]+", t)}
    used_in_dashboard = {m for e in dashboard_exprs() for m in re.findall(r"\beos_[a-z_]+", e)}
    assert used_in_alerts - exported == set(), sorted(used_in_alerts - exported)
    assert used_in_dashboard - exported == set(), sorted(used_in_dashboard - exported)
    # Every per-stream series is on the dashboard; the labels the alerts group by exist.
    stream_series = {s for s in exported if s.startswith("eos_stream_")}
    missing = stream_series - used_in_dashboard
    assert missing == set(), f"not on the dashboard: {sorted(missing)}"


def streaming_metrics() -> set[str]:
    """The query metrics the drivers' PodMonitor renames spark_streaming_<metric> (its rules' alternatives)."""
    (regex,) = {r["regex"] for r in yaml.safe_load(RELABELINGS.read_text())
                if r.get("replacement") == "spark_streaming_$2"}
    return set(re.search(r"_\(([^()]*)\)_Value$", regex).group(1).split("|"))


def test_the_dashboards_driver_series_are_names_the_pod_monitor_gives():
    used = {m for e in dashboard_exprs() for m in re.findall(r"\bspark_[A-Za-z_]+", e)}
    assert {"spark_streaming_latency", "spark_streaming_inputRate_total", "spark_streaming_processingRate_total",
            "spark_streaming_states_rowsTotal", "spark_streaming_states_usedBytes", "spark_driver_jvm_heap_used"} <= used
    streaming = {m[len("spark_streaming_"):] for m in used if m.startswith("spark_streaming_")}
    assert streaming <= streaming_metrics(), streaming - streaming_metrics()
    assert all(m.startswith(("spark_streaming_", "spark_driver_")) for m in used), used
    # Every driver panel filters by the stream's namespace and name, as the operator's panels do.
    dash = json.loads(DASHBOARD.read_text())
    for p in dash["panels"]:
        for t in p.get("targets", []):
            if "spark_" in t["expr"]:
                assert 'namespace=~"$namespace", stream=~"$stream"' in t["expr"], p["title"]


def test_dashboard_queries_are_valid_promql(promtool, tmp_path):
    """Each panel's query, with the dashboard's variables filled in, passes promtool as a recording rule."""
    exprs = [e.replace("$namespace", ".*").replace("$stream", ".*") for e in dashboard_exprs()]
    assert not [e for e in exprs if "$" in e], "a variable the test does not fill in"
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"dashboard:query_{i}", "expr": e}
                                                        for i, e in enumerate(exprs)]}]}
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump(rules))
    proc = run_promtool(promtool, "check", "rules", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dashboard_has_one_row_per_concern():
    dash = json.loads(DASHBOARD.read_text())
    panels = dash["panels"]
    assert [p["title"] for p in panels if p["type"] == "row"] == ROWS
    assert panels[0]["type"] == "row"
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    rows_with_panels, current = set(), None
    for p in panels:
        pos = p["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24, p["title"]
        if p["type"] == "row":
            current = p["title"]
            continue
        rows_with_panels.add(current)
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"] and all(t["expr"] for t in p["targets"]), p["title"]
    assert rows_with_panels == set(ROWS)
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    assert {"namespace", "stream"} <= set(variables)
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36


# ------------------------------------------------------------------------------------ helm template
def test_nothing_of_it_renders_by_default(helm: Helm):
    docs = helm.template()
    assert not [d for d in docs if d["kind"] in MONITORING_KINDS]
    assert not dashboard_docs(docs)
    assert not [d for d in docs if d["apiVersion"].startswith("monitoring.coreos.com")]


def test_all_three_render_when_enabled(helm: Helm):
    docs = helm.template(*ALL_ON, namespace="ops")
    svc = one(docs, "Service")
    sm = one(docs, "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["namespace"] == "ops"
    selector = sm["spec"]["selector"]["matchLabels"]
    assert selector and selector.items() <= svc["metadata"]["labels"].items(), "it must select the chart's Service"
    assert selector == one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    assert sm["spec"]["namespaceSelector"] == {"matchNames": ["ops"]}
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] in [p["name"] for p in svc["spec"]["ports"]] and endpoint["port"] == "metrics"
    assert endpoint["path"] == "/metrics" and endpoint["interval"] == "30s"
    assert endpoint["honorLabels"] is True, "the series' namespace label is the stream's, not the operator's"

    rule = one(docs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["metadata"]["namespace"] == "ops"
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text()), "the PrometheusRule must carry alerts.yaml unchanged"
    assert rule["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]

    (cm,) = dashboard_docs(docs)
    assert cm["apiVersion"] == "v1" and cm["metadata"]["namespace"] == "ops"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    (key,) = cm["data"]
    assert key.endswith(".json")
    assert json.loads(cm["data"][key]) == json.loads(DASHBOARD.read_text())
    for d in (sm, rule, cm):
        assert d["metadata"]["labels"]["app.kubernetes.io/instance"] == "eos"


def test_extra_labels_and_options_apply_and_never_replace_the_charts(helm: Helm):
    docs = helm.template(*ALL_ON, "--set", "monitoring.serviceMonitor.labels.release=kps",
                         "--set", "monitoring.serviceMonitor.interval=15s",
                         "--set", "monitoring.prometheusRule.labels.release=kps",
                         "--set", "monitoring.dashboard.labels.team=streaming",
                         "--set-string", "monitoring.dashboard.labels.grafana_dashboard=0",
                         "--set", r"monitoring.prometheusRule.labels.app\.kubernetes\.io/instance=other",
                         "--set", "monitoring.dashboard.annotations.grafana_folder=Streaming")
    sm, rule, (cm,) = one(docs, "ServiceMonitor"), one(docs, "PrometheusRule"), dashboard_docs(docs)
    assert sm["metadata"]["labels"]["release"] == "kps" and sm["spec"]["endpoints"][0]["interval"] == "15s"
    assert rule["metadata"]["labels"]["release"] == "kps"
    assert rule["metadata"]["labels"]["app.kubernetes.io/instance"] == "eos"
    assert cm["metadata"]["labels"]["team"] == "streaming" and cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Streaming"}


def test_lint_with_everything_on(helm: Helm):
    out = helm.run("lint", "--strict", str(CHART), *ALL_ON).stdout
    assert "0 chart(s) failed" in out


@pytest.mark.parametrize("off", ["metrics.enabled=false", "service.enabled=false"])
def test_a_service_monitor_without_a_metrics_port_is_refused(helm: Helm, off):
    expected = "monitoring.serviceMonitor.enabled needs metrics.enabled and service.enabled"
    for command in (["template", "eos", str(CHART)], ["lint", "--strict", str(CHART)], ["lint", str(CHART)]):
        proc = helm.run(*command, "--set", "monitoring.serviceMonitor.enabled=true", "--set", off, check=False)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and expected in out, f"helm {command[0]} with {off}:\n{out}"
    # The rule file and dashboard need no metrics port of this release.
    docs = helm.template("--set", "monitoring.prometheusRule.enabled=true",
                         "--set", "monitoring.dashboard.enabled=true", "--set", off)
    assert one(docs, "PrometheusRule") and dashboard_docs(docs)


# ------------------------------------------------------------------------------------ the drivers' PodMonitor
def test_the_pod_monitor_scrapes_exactly_the_drivers_that_serve_metrics(helm: Helm):
    from eos_job import driver_metrics
    from eos_operator import children
    from eos_job.spec import ExactlyOnceStreamSpec
    from tests.operator.fakes import base_spec

    (pm,) = [d for d in helm.template(*ALL_ON, namespace="ops") if d["kind"] == "PodMonitor"]
    assert pm["apiVersion"] == "monitoring.coreos.com/v1" and pm["metadata"]["namespace"] == "ops"
    assert pm["spec"]["namespaceSelector"] == {"any": True}
    selector = pm["spec"]["selector"]["matchLabels"]
    ref = children.StreamRef("colors", "team-a", "uid")
    on = ExactlyOnceStreamSpec.model_validate(base_spec(job={"module": "m", "metrics": {"enabled": True}}))
    off = ExactlyOnceStreamSpec.model_validate(base_spec(job={"module": "m"}))
    driver = children.driver_pod(ref, on, attempt=1, tx_generation=0)
    assert selector.items() <= driver["metadata"]["labels"].items(), "it must select a driver with metrics on"
    assert not selector.items() <= children.driver_pod(ref, off, attempt=1, tx_generation=0)["metadata"]["labels"].items()
    aux = children.aux_pod(ref, on, component="preflight", attempt=1, tx_generation=0, args=["preflight"])
    assert not selector.items() <= aux["metadata"]["labels"].items(), "pre-flight Pods serve no metrics"
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    (port,) = driver["spec"]["containers"][0]["ports"]
    assert endpoint["port"] == port["name"] == "metrics" and endpoint["path"] == driver_metrics.METRICS_PATH
    assert endpoint["interval"] == "30s"
    # The stream's name from the driver's label, as Prometheus's Kubernetes discovery spells the label.
    label = "__meta_kubernetes_pod_label_" + re.sub(r"[^A-Za-z0-9]", "_", children.LABEL_STREAM)
    assert endpoint["relabelings"] == [{"sourceLabels": [label], "targetLabel": "stream"}]
    assert endpoint["metricRelabelings"] == yaml.safe_load(RELABELINGS.read_text())


def test_the_pod_monitor_takes_namespaces_labels_and_interval(helm: Helm):
    docs = helm.template(*ALL_ON, "--set", "monitoring.driverPodMonitor.namespaces={streams-a,streams-b}",
                         "--set", "monitoring.driverPodMonitor.labels.release=kps",
                         "--set", "monitoring.driverPodMonitor.interval=10s")
    (pm,) = [d for d in docs if d["kind"] == "PodMonitor"]
    assert pm["spec"]["namespaceSelector"] == {"matchNames": ["streams-a", "streams-b"]}
    assert pm["metadata"]["labels"]["release"] == "kps" and pm["metadata"]["labels"]["app.kubernetes.io/instance"] == "eos"
    assert pm["spec"]["podMetricsEndpoints"][0]["interval"] == "10s"


def test_with_network_policies_the_pod_monitors_prometheus_reaches_the_drivers_metrics_port(helm: Helm, tmp_path):
    """The streams' NetworkPolicy admits only their own namespace; with the driverPodMonitor it also admits
    networkPolicy.metricsFrom to the port named metrics (only drivers with job.metrics have one)."""
    values = tmp_path / "v.yaml"
    monitoring = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    values.write_text(yaml.safe_dump({"watchNamespaces": ["team-a"], "networkPolicy": {
        "enabled": True, "metricsFrom": monitoring}}))

    def stream_ingress(*args: str) -> list[dict[str, Any]]:
        (policy,) = [d for d in helm.template("-f", str(values), *args, namespace="ops")
                     if d["kind"] == "NetworkPolicy" and d["metadata"]["namespace"] == "team-a"]
        return policy["spec"]["ingress"]

    assert stream_ingress() == [{"from": [{"podSelector": {}}]}]
    assert stream_ingress("--set", "monitoring.driverPodMonitor.enabled=true") == [
        {"from": [{"podSelector": {}}]},
        {"ports": [{"port": "metrics", "protocol": "TCP"}], "from": monitoring}]
