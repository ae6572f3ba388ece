"""The Prometheus metrics say what the status says, and forget deleted streams."""
from __future__ import annotations

import urllib.request

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from eos_job.status import PartitionLag, ReplayHorizon
from eos_stack.common import free_port
from eos_operator.metrics import LIFECYCLE_STATES, StreamMetrics

from .fakes import FakeProgress
from .test_reconciler import make, rec


def samples(metrics: StreamMetrics) -> dict[tuple[str, tuple], float]:
    text = generate_latest(metrics.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(metrics: StreamMetrics, name: str, **labels: str) -> float | None:
    labels = {"namespace": "default", "stream": "colors", **labels}
    return samples(metrics).get((name, tuple(sorted(labels.items()))))


def test_the_metrics_follow_the_status_of_a_stream():
    kube, resolver, clock, deps = make()
    deps.metrics = StreamMetrics()
    m = deps.metrics
    rec(deps)
    assert value(m, "eos_stream_lifecycle_state", state="Deploying") == 1
    assert sum(value(m, "eos_stream_lifecycle_state", state=s) for s in LIFECYCLE_STATES) == 1
    assert value(m, "eos_stream_ready") == 0
    assert value(m, "eos_stream_replay_horizon_seconds_left") is None      # not checked yet: no series
    assert value(m, "eos_stream_events_total", type="Normal", reason="Submitted") == 1

    deps.progress = FakeProgress(batch=41, horizon=ReplayHorizon(
        state="Shrinking", batch=41, checked_at="2026-01-01T00:00:00Z", backlog_records=900, seconds_left=120.5,
        message="soon", lag=[PartitionLag(topic="events", partition=0, records=600),
                             PartitionLag(topic="events", partition=1, records=300)]), nondeterministic=1)
    kube.set_pod_phase("colors-driver-0", "Running")
    rec(deps)
    assert value(m, "eos_stream_lifecycle_state", state="Running") == 1
    assert value(m, "eos_stream_lifecycle_state", state="Deploying") == 0
    assert (value(m, "eos_stream_ready"), value(m, "eos_stream_degraded")) == (1, 1)
    assert value(m, "eos_stream_last_committed_batch") == 41
    assert value(m, "eos_stream_nondeterministic_slots") == 1
    assert value(m, "eos_stream_replay_horizon_seconds_left") == 120.5
    assert value(m, "eos_stream_replay_horizon_backlog_records") == 900
    assert value(m, "eos_stream_events_total", type="Warning", reason="ReplayHorizonShrinking") == 1
    assert value(m, "eos_stream_source_lag_records", topic="events", partition="0") == 600
    assert value(m, "eos_stream_source_lag_records", topic="events", partition="1") == 300
    # Partition 1 caught up: its series goes (absent when caught up), partition 0's follows the status.
    deps.progress.horizon = deps.progress.horizon.model_copy(update={
        "lag": [PartitionLag(topic="events", partition=0, records=20)]})
    rec(deps)
    assert value(m, "eos_stream_source_lag_records", topic="events", partition="0") == 20
    assert value(m, "eos_stream_source_lag_records", topic="events", partition="1") is None

    kube.set_pod_phase("colors-driver-0", "Failed", exit_code=137, message="killed")
    rec(deps)
    assert value(m, "eos_stream_events_total", type="Warning", reason="DriverFailed") == 1

    del kube.streams[("default", "colors")]
    rec(deps)
    assert not [k for k in samples(m) if ("stream", "colors") in k[1]]


def test_the_endpoint_serves_them():
    port = free_port()
    m = StreamMetrics()
    m.serve(port, "127.0.0.1")
    m.event("default", "colors", "Warning", "ReplayHorizonExceeded")
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert ('eos_stream_events_total{namespace="default",reason="ReplayHorizonExceeded",stream="colors",'
            'type="Warning"} 1.0') in body
