"""Prometheus metrics of the streams the operator manages, served on ``--metrics-port``.

Every value is read from the stream's status right after the operator wrote it, so
the metrics say what ``kubectl get eos -o yaml`` says, in a form alerts can use:

* ``eos_stream_lifecycle_state{state}``: 1 for the current lifecycle state, 0 for the others;
* ``eos_stream_ready`` / ``eos_stream_degraded``: the conditions, 1 or 0;
* ``eos_stream_last_committed_batch``, ``eos_stream_restarts``, ``eos_stream_tx_generation``,
  ``eos_stream_nondeterministic_slots``;
* ``eos_stream_source_lag_records{topic,partition}``: records beyond the last committed batch, per source
  partition (absent when caught up).
* ``eos_stream_replay_horizon_seconds_left``, ``..._backlog_records``, ``..._lost_records`` (the replay
  horizon; absent until checked, and the first while there is no time limit);
* ``eos_stream_events_total{type,reason}``: the events the operator posted.

A deleted stream's series are removed. Nothing secret is a label or a value. The operator's own
metrics (reconcile time, reconciles in flight, failed API and Kafka calls) are in op_metrics.py, served
on the same registry.
"""
from __future__ import annotations

import logging
import typing

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from eos_job.status import ExactlyOnceStreamStatus

from .conditions import get_condition

log = logging.getLogger(__name__)

LIFECYCLE_STATES: tuple[str, ...] = typing.get_args(
    ExactlyOnceStreamStatus.model_fields["lifecycle_state"].annotation)
_STREAM = ("namespace", "stream")


class StreamMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry

        def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> Gauge:
            return Gauge(name, doc, _STREAM + extra, registry=r)

        self.state = gauge("eos_stream_lifecycle_state", "1 for the stream's current lifecycle state", ("state",))
        self.ready = gauge("eos_stream_ready", "Ready condition: 1 True, 0 otherwise")
        self.degraded = gauge("eos_stream_degraded", "Degraded condition: 1 True, 0 otherwise")
        self.batch = gauge("eos_stream_last_committed_batch", "Last batch committed to the sink")
        self.restarts = gauge("eos_stream_restarts", "Restarts since the last reset (status.restartCount)")
        self.generation = gauge("eos_stream_tx_generation", "Transactional-id generation of the running spec")
        self.nondet = gauge("eos_stream_nondeterministic_slots",
                            "Replayed slots whose output differed from the sink (a non-deterministic job)")
        self.horizon_left = gauge("eos_stream_replay_horizon_seconds_left",
                                  "Seconds before retention may delete a record the stream has not processed")
        self.backlog = gauge("eos_stream_replay_horizon_backlog_records", "Records retained but not processed")
        self.lost = gauge("eos_stream_replay_horizon_lost_records",
                          "Records retention deleted before the stream read them")
        self.lag = gauge("eos_stream_source_lag_records", "Records a source partition holds beyond the last "
                         "committed batch (status.replayHorizon.lag; absent when caught up)", ("topic", "partition"))
        self.events = Counter("eos_stream_events", "Events posted about the stream",
                              _STREAM + ("type", "reason"), registry=r)
        self._per_stream: tuple[Gauge, ...] = (self.ready, self.degraded, self.batch, self.restarts,
                                               self.generation, self.nondet, self.horizon_left, self.backlog,
                                               self.lost)
        self._event_labels: dict[tuple[str, str], set[tuple[str, str]]] = {}
        self._lag_labels: dict[tuple[str, str], set[tuple[str, str]]] = {}

    def record(self, namespace: str, stream: str, status: ExactlyOnceStreamStatus) -> None:
        for state in LIFECYCLE_STATES:
            self.state.labels(namespace, stream, state).set(1 if status.lifecycle_state == state else 0)
        for gauge, cond in ((self.ready, "Ready"), (self.degraded, "Degraded")):
            c = get_condition(status.conditions, cond)
            gauge.labels(namespace, stream).set(1 if c is not None and c.status == "True" else 0)
        self._set(self.batch, namespace, stream, status.last_committed_batch)
        self.restarts.labels(namespace, stream).set(status.restart_count)
        self.generation.labels(namespace, stream).set(status.tx_generation)
        self._set(self.nondet, namespace, stream, status.nondeterministic_slots)
        h = status.replay_horizon
        self._set(self.horizon_left, namespace, stream, h.seconds_left if h is not None else None)
        self._set(self.backlog, namespace, stream, h.backlog_records if h is not None else None)
        self._set(self.lost, namespace, stream, h.lost_records if h is not None else None)
        lags = {(x.topic, str(x.partition)): x.records for x in (h.lag if h is not None else [])}
        for gone in self._lag_labels.get((namespace, stream), set()) - set(lags):
            _remove(self.lag, namespace, stream, *gone)
        for (topic, part), records in lags.items():
            self.lag.labels(namespace, stream, topic, part).set(records)
        self._lag_labels[(namespace, stream)] = set(lags)

    def event(self, namespace: str, stream: str, type_: str, reason: str) -> None:
        self.events.labels(namespace, stream, type_, reason).inc()
        self._event_labels.setdefault((namespace, stream), set()).add((type_, reason))

    def forget(self, namespace: str, stream: str) -> None:
        """Remove every series of a stream that no longer exists."""
        for gauge in self._per_stream:
            _remove(gauge, namespace, stream)
        for state in LIFECYCLE_STATES:
            _remove(self.state, namespace, stream, state)
        for topic, part in self._lag_labels.pop((namespace, stream), set()):
            _remove(self.lag, namespace, stream, topic, part)
        for type_, reason in self._event_labels.pop((namespace, stream), set()):
            _remove(self.events, namespace, stream, type_, reason)

    @staticmethod
    def _set(gauge: Gauge, namespace: str, stream: str, value: float | None) -> None:
        if value is None:
            _remove(gauge, namespace, stream)
        else:
            gauge.labels(namespace, stream).set(value)

    def serve(self, port: int, address: str = "0.0.0.0") -> None:
        start_http_server(port, addr=address, registry=self.registry)
        log.info("metrics on http://%s:%d/metrics", address, port)


def _remove(metric: Gauge | Counter, *labels: str) -> None:
    try:
        metric.remove(*labels)
    except KeyError:
        pass
