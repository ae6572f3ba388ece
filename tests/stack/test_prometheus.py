"""The stack's Prometheus helper (eos_stack.prometheus.start/query/alerts/stop) against a real Prometheus.

A tiny HTTP server (http.server, in a thread) serves what the operator's own metrics registry
(eos_operator.metrics.StreamMetrics) exposes for three streams; the helper's Prometheus scrapes it every
second and evaluates the chart's shipped rule file every second. EosStreamNotReady has `for: 10m`, so
within a test it is only pending; the event and replay-horizon alerts have no `for` and really fire.
"""
from __future__ import annotations

import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator

import pytest
import yaml
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from eos_job.status import Condition, ExactlyOnceStreamStatus, ReplayHorizon
from eos_operator.metrics import StreamMetrics
from eos_stack import prometheus
from eos_stack.common import StackError, port_open

SHIPPED_ALERTS = [r["alert"] for g in yaml.safe_load(prometheus.RULES_FILE.read_text())["groups"] for r in g["rules"]]


def operator_metrics() -> StreamMetrics:
    """Three streams as the operator would record them: one Failed with records lost and an upgrade blocked,
    one healthy, one suspended (not Ready on purpose)."""
    m = StreamMetrics()
    now = "2026-01-01T00:00:00Z"

    def cond(type_: str, status: str, reason: str) -> Condition:
        return Condition(type=type_, status=status, reason=reason, last_transition_time=now)

    m.record("team-a", "colors", ExactlyOnceStreamStatus(
        lifecycle_state="Failed", restart_count=3, last_committed_batch=41,
        conditions=[cond("Ready", "False", "RestartsExhausted"), cond("Degraded", "True", "ReplayHorizonExceeded")],
        replay_horizon=ReplayHorizon(state="Exceeded", batch=41, checked_at=now, backlog_records=120,
                                     lost_records=50)))
    m.event("team-a", "colors", "Warning", "UpgradeBlocked")
    m.event("team-a", "colors", "Warning", "DriverFailed")
    m.record("team-a", "healthy", ExactlyOnceStreamStatus(
        lifecycle_state="Running", last_committed_batch=7, conditions=[cond("Ready", "True", "Running")],
        replay_horizon=ReplayHorizon(state="Safe", batch=7, checked_at=now, backlog_records=0, lost_records=0)))
    m.event("team-a", "healthy", "Normal", "Upgraded")
    m.record("team-b", "paused", ExactlyOnceStreamStatus(
        lifecycle_state="Suspended", conditions=[cond("Ready", "False", "Suspended")]))
    return m


@pytest.fixture
def metrics_target() -> Iterator[str]:
    """``host:port`` of a local /metrics endpoint serving the operator registry's exposition."""
    body = generate_latest(operator_metrics().registry)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def wait(check: Callable[[], Any], what: str, server: prometheus.Server, timeout: float = 45.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}\n"
                f"prometheus log:\n{server.log_tail()}")


def by_alert(active: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {(a["labels"]["alertname"], a["labels"].get("namespace", ""), a["labels"].get("stream", "")): a
            for a in active}


def test_the_tools_are_the_pinned_release(stack_env):
    for key in ("PROMTOOL", "PROMETHEUS"):
        out = subprocess.run([stack_env[key], "--version"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"version {prometheus.RELEASE}" in out.stdout, out.stdout
        assert f"tags:             {prometheus.BUILD_TAGS}" in out.stdout, out.stdout


def test_prometheus_scrapes_the_target_and_evaluates_the_shipped_rules(stack_env, metrics_target, tmp_path):
    assert stack_env.get("PROMETHEUS"), ".stack/env has no PROMETHEUS: the stack's prometheus part did not run"
    with prometheus.start(metrics_target, tmp_path / "prom", exe=stack_env["PROMETHEUS"]) as prom:
        assert prom.url.startswith("http://127.0.0.1:") and port_open(prom.port)
        assert (tmp_path / "prom" / "data").is_dir(), "the TSDB lives in the given directory"

        # Every shipped alert is loaded and evaluates without error.
        def evaluated() -> dict[str, dict[str, Any]] | None:
            loaded = {r["name"]: r for g in prometheus.rules(prom) for r in g["rules"]}
            return loaded if loaded and all(r["health"] == "ok" for r in loaded.values()) else None
        loaded = wait(evaluated, "every rule evaluated once with health ok", prom)
        assert sorted(loaded) == sorted(SHIPPED_ALERTS)
        assert {g["file"] for g in prometheus.rules(prom)} == {str(prometheus.RULES_FILE)}
        assert all(r["type"] == "alerting" and not r.get("lastError") for r in loaded.values())

        # The scrape works and the stream's own `namespace` label is kept (honor_labels).
        up = wait(lambda: prometheus.query(prom, f'up{{instance="{metrics_target}"}} == 1'), "the target up", prom)
        assert up[0]["metric"]["job"] == "spark-eos-operator"
        ready = {(s["metric"]["namespace"], s["metric"]["stream"]): s["value"][1]
                 for s in prometheus.query(prom, "eos_stream_ready")}
        assert ready == {("team-a", "colors"): "0", ("team-a", "healthy"): "1", ("team-b", "paused"): "0"}
        (failed,) = prometheus.query(prom, 'eos_stream_lifecycle_state{stream="colors", state="Failed"}')
        assert failed["value"][1] == "1"
        assert prometheus.query(prom, "eos_stream_replay_horizon_lost_records > 0")[0]["metric"]["stream"] == "colors"
        assert not prometheus.query(prom, "eos_stream_replay_horizon_seconds_left"), "no deadline was recorded"

        # Alerts without `for` fire at once; the not-Ready one waits out its 10 minutes as pending.
        def expected_alerts() -> dict | None:
            active = by_alert(prometheus.alerts(prom))
            want = {(name, "team-a", "colors") for name in
                    ("EosStreamUpgradeBlocked", "EosStreamReplayHorizonExceeded", "EosStreamNotReady")}
            return active if want <= set(active) else None
        active = wait(expected_alerts, "the colors stream's alerts", prom)
        blocked = active[("EosStreamUpgradeBlocked", "team-a", "colors")]
        assert blocked["state"] == "firing" and blocked["labels"]["severity"] == "warning"
        assert "`kubectl eos status colors -n team-a`" in blocked["annotations"]["description"]
        exceeded = active[("EosStreamReplayHorizonExceeded", "team-a", "colors")]
        assert exceeded["state"] == "firing" and exceeded["labels"]["severity"] == "critical"
        assert exceeded["annotations"]["summary"] == \
            "Stream team-a/colors: 50 source records deleted before they were read"
        not_ready = active[("EosStreamNotReady", "team-a", "colors")]
        assert not_ready["state"] == "pending", "for: 10m cannot have elapsed"
        assert "(lifecycle state: Failed)" in not_ready["annotations"]["description"]

        # And nothing else: the healthy and the suspended stream have none; one DriverFailed is no storm.
        time.sleep(3)  # a few more evaluations
        assert set(by_alert(prometheus.alerts(prom))) == set(active), prometheus.alerts(prom)
        assert not [k for k in active if k[2] in ("healthy", "paused") or k[0] == "EosStreamRestartStorm"]
    assert prom.proc.returncode == 0, f"prometheus did not stop cleanly:\n{prom.log_tail()}"
    assert not port_open(prom.port)


def test_a_rule_file_prometheus_refuses_fails_start_with_its_log(stack_env, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("groups:\n  - name: bad\n    rules:\n      - alert: Broken\n        expr: eos_stream_ready ==\n")
    with pytest.raises(StackError) as err:
        prometheus.start("127.0.0.1:9", tmp_path / "prom", rules=[bad], exe=stack_env["PROMETHEUS"], timeout=30)
    assert "exited" in str(err.value) and "bad.yaml" in str(err.value), str(err.value)


def test_query_errors_name_the_problem(stack_env, metrics_target, tmp_path):
    with prometheus.start(metrics_target, tmp_path / "prom", exe=stack_env["PROMETHEUS"]) as prom:
        with pytest.raises(StackError, match="bad_data"):
            prometheus.query(prom, "sum(")
        (scalar,) = prometheus.query(prom, "1 + 1")   # a scalar result comes back as one sample without labels
        assert scalar["metric"] == {} and scalar["value"][1] == "2"
        with urllib.request.urlopen(f"{prom.url}/-/healthy", timeout=5) as resp:
            assert resp.status == 200
