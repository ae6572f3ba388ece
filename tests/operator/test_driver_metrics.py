"""job.metrics without a server: the Spark settings the runtime adds, the driver Pod's port, label and UI
address, what validation refuses, and that a change restarts the driver. The real servlet scraped by a real
Prometheus: tests/e2e/test_driver_metrics_e2e.py."""
from __future__ import annotations

from eos_job import driver_metrics
from eos_job.runtime import spark_conf_for
from eos_job.spec import ExactlyOnceStreamSpec
from eos_operator import children, upgrades
from eos_operator.children import StreamRef
from eos_operator.validation import validate_spec

from .fakes import base_spec

REF = StreamRef("colors", "team-a", "0f6c2a1e-1111-2222-3333-444455556666")
ON = {"module": "m", "metrics": {"enabled": True, "port": 4321}}


def spec(job: dict) -> ExactlyOnceStreamSpec:
    s = validate_spec(base_spec(job=job))
    assert isinstance(s, ExactlyOnceStreamSpec), s
    return s


def run_conf(s: ExactlyOnceStreamSpec) -> dict[str, str]:
    return spark_conf_for(children.run_config(REF, s, tx_generation=0))


def test_off_by_default_and_off_adds_nothing():
    default, off = spec({"module": "m"}), spec({"module": "m", "metrics": {"port": 4321}})
    assert default.job.metrics is None and "metrics" not in default.wire()["job"]   # existing specs hash the same
    for s in (default, off):
        conf = run_conf(s)
        assert not [k for k in conf if k.startswith(("spark.ui.", "spark.metrics."))], conf
        pod = children.driver_pod(REF, s, attempt=1, tx_generation=0)
        (c,) = pod["spec"]["containers"]
        assert "ports" not in c and children.LABEL_DRIVER_METRICS not in pod["metadata"]["labels"]
        assert children.UI_BIND_ENV not in {e["name"] for e in c["env"]}


def test_on_turns_on_the_ui_servlet_streaming_and_jvm_sources():
    conf = run_conf(spec(ON))
    assert conf["spark.ui.enabled"] == "true" and conf["spark.ui.port"] == "4321"
    assert conf["spark.metrics.conf.*.sink.prometheusServlet.class"] == \
        "org.apache.spark.metrics.sink.PrometheusServlet"
    assert conf["spark.metrics.conf.*.sink.prometheusServlet.path"] == "/metrics/prometheus"
    assert conf["spark.sql.streaming.metricsEnabled"] == "true"
    assert conf["spark.metrics.namespace"] == "eos"     # not the application id: names stable across drivers
    assert conf["spark.metrics.conf.driver.source.jvm.class"] == "org.apache.spark.metrics.source.JvmSource"
    assert conf["spark.ui.killEnabled"] == "false"    # reachable on the Pod's port: it shows, it does not kill


def test_the_driver_pod_gets_a_named_port_a_label_and_its_ui_on_every_pod_address():
    pod = children.driver_pod(REF, spec(ON), attempt=2, tx_generation=0)
    (c,) = pod["spec"]["containers"]
    assert c["ports"] == [{"name": "metrics", "containerPort": 4321}]
    assert pod["metadata"]["labels"][children.LABEL_DRIVER_METRICS] == "true"
    assert children.stream_selector("colors").items() <= pod["metadata"]["labels"].items()
    env = {e["name"]: e for e in c["env"]}
    # Every address of the Pod: its IP for Prometheus, loopback for kubectl port-forward (kubectl eos ui).
    assert env["SPARK_LOCAL_IP"] == {"name": "SPARK_LOCAL_IP", "value": "0.0.0.0"}
    # Cluster mode: the RPC ports stay, the metrics port joins them; the UI already binds every address there.
    cluster = children.driver_pod(REF, spec({**ON, "deployMode": "cluster"}), attempt=2, tx_generation=0)
    (cc,) = cluster["spec"]["containers"]
    assert [p["name"] for p in cc["ports"]] == ["driver-rpc", "blockmanager", "metrics"]
    assert "SPARK_LOCAL_IP" not in {e["name"] for e in cc["env"]}


def test_aux_pods_serve_no_metrics():
    aux = children.aux_pod(REF, spec(ON), component="preflight", attempt=1, tx_generation=0, args=["preflight"])
    (c,) = aux["spec"]["containers"]
    assert "ports" not in c and children.LABEL_DRIVER_METRICS not in aux["metadata"]["labels"]
    assert "SPARK_LOCAL_IP" not in {e["name"] for e in c["env"]}


def test_spark_conf_may_not_move_what_the_metrics_rely_on():
    pinned = driver_metrics.spark_conf(driver_metrics.DriverMetrics(enabled=True))
    assert "spark.ui.port" in pinned and "spark.metrics.namespace" in pinned
    for key in pinned:
        res = validate_spec(base_spec(job={**ON, "sparkConf": {key: "x"}}))
        assert not isinstance(res, ExactlyOnceStreamSpec), key
        assert any(e.startswith(f"spec.job.sparkConf.{key}:") and "job.metrics" in e and "remove it" in e
                   for e in res.errors), res.errors
    # Metrics off: the user's own UI settings are theirs.
    assert isinstance(validate_spec(base_spec(job={"module": "m", "sparkConf": {"spark.ui.port": "4050"}})),
                      ExactlyOnceStreamSpec)


def test_a_bad_port_names_the_field():
    res = validate_spec(base_spec(job={"module": "m", "metrics": {"enabled": True, "port": 80}}))
    assert not isinstance(res, ExactlyOnceStreamSpec)
    assert any("job.metrics.port" in e for e in res.errors), res.errors


def test_in_cluster_mode_the_port_may_not_be_the_drivers_rpc_port():
    for port in (children.DRIVER_PORT, children.BLOCK_MANAGER_PORT):
        res = validate_spec(base_spec(job={**ON, "deployMode": "cluster", "metrics": {"enabled": True, "port": port}}))
        assert not isinstance(res, ExactlyOnceStreamSpec), port
        assert any(e.startswith("spec.job.metrics.port:") and "pick another port" in e for e in res.errors), res.errors
    # Local mode keeps RPC on loopback: the port is free on the Pod's address there.
    assert isinstance(validate_spec(base_spec(job={**ON, "metrics": {"enabled": True, "port": children.DRIVER_PORT}})),
                      ExactlyOnceStreamSpec)


def test_a_metrics_change_restarts_on_the_live_checkpoint():
    old = upgrades.spec_json(spec({"module": "m"}))
    changes = upgrades.run_affecting_changes(old, spec(ON))
    assert changes and all(c.startswith("job.metrics") for c in changes), changes
    assert upgrades.plan_spec_change(changes, spec(ON)).kind == "restart"
