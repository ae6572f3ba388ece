"""Driver metrics (job.metrics, issue 30) on the real stack: a driver of the colors job with metrics on, a real
Prometheus scraping its /metrics/prometheus with the chart's driverPodMonitor rules (its metricRelabelings as
shipped, the target labels its relabelings give a driver Pod) at the address a driver Pod's UI binds (its own,
SPARK_LOCAL_IP, while RPC stays on loopback), and queries that find this stream's streaming
series under the query's name, every series the dashboard's driver row uses, and no raw Spark name left over."""
from __future__ import annotations

import contextlib
import hashlib
import json
import re

import pytest
import yaml

from eos_stack import prometheus
from eos_stack.cluster import wait_until
from eos_stack.common import free_port, port_open
from eos_operator.children import UI_BIND_ENV
from examples.colors.generator import produce

CHART = prometheus.REPO / "charts" / "spark-eos-operator"
RELABELINGS = CHART / "files" / "driver-metric-relabelings.yaml"
DASHBOARD = CHART / "files" / "dashboard.json"

pytestmark = pytest.mark.stack


def driver_row_series() -> set[str]:
    """The spark_* series the dashboard's panels query."""
    dash = json.loads(DASHBOARD.read_text())
    return {m for p in dash["panels"] for t in p.get("targets", []) for m in re.findall(r"\bspark_[A-Za-z_]+", t["expr"])}


def test_a_real_prometheus_scrapes_the_drivers_streaming_metrics_under_its_query_name(colors_run, tmp_path,
                                                                                        report_result):
    port = free_port()
    run = colors_run(max_offsets_per_trigger=500)
    run.setup()
    # As in a driver Pod with metrics on (eos_operator.children): the UI and its servlet on the Pod's own address
    # (here a loopback address of its own, not 127.0.0.1: all of 127.0.0.0/8 is this machine's), Spark's RPC on
    # loopback.
    digest = hashlib.sha256(run.run_id.encode()).digest()
    address = f"127.{1 + digest[0] % 250}.{digest[1]}.{1 + digest[2] % 254}"
    run.extra_env = {UI_BIND_ENV: address}
    manifest = yaml.safe_load(run.config_path.read_text())
    manifest["spec"]["job"]["metrics"] = {"enabled": True, "port": port}
    run.config_path.write_text(yaml.safe_dump(manifest))
    stream = manifest["metadata"]["name"]
    query = f"eos_local_{stream}".replace("-", "_")       # the query eos-local-<stream>, as Spark's names spell it
    sel = f'namespace="local", stream="{stream}", query="{query}"'
    dashboard = driver_row_series()
    assert {"spark_streaming_latency", "spark_streaming_processingRate_total", "spark_driver_jvm_heap_used"} <= dashboard

    with contextlib.ExitStack() as cleanup:
        # The target labels a driver Pod gets from the PodMonitor (its namespace; stream from its label).
        prom = cleanup.enter_context(prometheus.start(
            f"{address}:{port}", tmp_path / "prometheus", rules=[], metrics_path="/metrics/prometheus",
            labels={"namespace": "local", "stream": stream},
            metric_relabel_configs=prometheus.relabel_configs(yaml.safe_load(RELABELINGS.read_text()))))

        def diag() -> str:
            return f"prometheus:\n{prom.log_tail(10)}\njob:\n{run.log_tail(20)}"

        expected = produce(run.bootstrap, run.events, 1500)   # three batches: the first reports no input rate
        run.start()
        # Batches of up to 500 rows: rows were processed while Prometheus scraped every second.
        wait_until(lambda: prometheus.query(prom, f"max_over_time(spark_streaming_processingRate_total{{{sel}}}[10m]) > 0"),
                   "a processed-rows series of the stream's query", 240, diag, 1)
        run.wait_caught_up(expected)
        assert not port_open(port, "127.0.0.1"), f"the UI binds {UI_BIND_ENV} ({address}), not every address"
        latency = prometheus.query(prom, f"spark_streaming_latency{{{sel}}}")
        assert len(latency) == 1 and latency[0]["metric"]["job"] == "spark-eos-operator", latency
        assert prometheus.query(prom, f"max_over_time(spark_streaming_inputRate_total{{{sel}}}[10m]) > 0"), diag()
        # The colors job counts per color: its state store holds rows (one per color seen).
        rows = prometheus.query(prom, f"max_over_time(spark_streaming_states_rowsTotal{{{sel}}}[10m])")
        assert rows and float(rows[0]["value"][1]) >= 1, rows
        # Every series the dashboard's driver panels use exists for this stream.
        for name in sorted(dashboard):
            assert prometheus.query(prom, f'{name}{{namespace="local", stream="{stream}"}}'), f"no {name}\n{diag()}"
        # Nothing keeps Spark's raw name: the rules cover every driver series, and each gauge is there once.
        assert prometheus.query(prom, 'count({__name__=~"metrics_.*"})') == [], "raw Spark names left over"
        assert prometheus.query(prom, 'count({__name__=~"spark_.*_(Number|Value)"})') == []
        # Every gauge of the query's source is one the rules know (a new one would keep the query's name inside
        # its series name, spark_driver_spark_streaming_<query>_<gauge>).
        assert prometheus.query(prom, 'count({__name__=~"spark_driver_spark_streaming_.*"})') == [], \
            "a streaming gauge the relabelings do not list"
        assert run.stop() == 0, run.log_tail()
    report_result(f"driver metrics: a real Prometheus scraped /metrics/prometheus of a colors driver with "
                  f"job.metrics on; query {query}: batch duration, input and processed rows per second, "
                  f"{float(rows[0]['value'][1]):.0f} state rows, and all {len(dashboard)} dashboard series found")
