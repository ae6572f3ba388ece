"""Prometheus metrics of the operator itself, beside the per-stream ones (metrics.py), on the same /metrics:

* ``eos_operator_reconcile_duration_seconds{kind,outcome}``: how long one reconcile of a stream or a
  snapshot ran (waiting for the object's lock excluded); outcome ``ok``, ``requeue`` (a deletion still
  waiting: kopf is asked to call again) or ``error`` (the reconcile raised);
* ``eos_operator_reconciles_in_flight{kind,state}``: reconciles inside the operator now, ``running`` or
  ``waiting`` behind another reconcile of the same object. kopf owns the watch-event queue; what it has not
  yet handed to a handler is not counted;
* ``eos_operator_kube_requests_total{verb,resource}``: Kubernetes API requests the operator's adapters and
  informers made (kopf's own watches and patches are not counted); a watch counts once, when it starts;
* ``eos_operator_kube_api_errors_total{verb,resource,code}``: failed Kubernetes API calls of the operator's
  adapters (kube_api.py), by HTTP status or ``network`` (no answer);
* ``eos_operator_kafka_errors_total{operation}``: failed Kafka calls the operator makes (adapters.py).

No label carries a stream's or an object's name: their values are a few fixed words (and HTTP codes).
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

KINDS = ("stream", "snapshot")
OUTCOMES = ("ok", "requeue", "error")
STATES = ("running", "waiting")
# resolve: resolution before a (re)start (fences transactional ids, reads the ledger, lists end offsets);
# ledger-read: the ledger's last batch record (progress); replay-horizon: ledger, offsets, retention.
KAFKA_OPERATIONS = ("resolve", "ledger-read", "replay-horizon")
BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class OperatorMetrics:
    """The operator's own health; register on the per-stream metrics' registry to serve both."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.reconcile_seconds = Histogram(
            "eos_operator_reconcile_duration_seconds",
            "Seconds one reconcile ran, lock wait excluded; outcome ok, requeue (a deletion still waiting) or "
            "error (it raised)", ("kind", "outcome"), buckets=BUCKETS, registry=r)
        self.in_flight = Gauge(
            "eos_operator_reconciles_in_flight",
            "Reconciles in the operator now: running, or waiting behind another reconcile of the same object "
            "(kopf owns the watch-event queue: events it has not handed to a handler yet are not counted)",
            ("kind", "state"), registry=r)
        self.kube_requests = Counter(
            "eos_operator_kube_requests",
            "Kubernetes API requests of the operator's adapters and informers, by verb and resource (a watch "
            "counts when it starts; kopf's own watch and finalizer calls are not counted)", ("verb", "resource"),
            registry=r)
        self.kube_errors = Counter(
            "eos_operator_kube_api_errors",
            "Failed Kubernetes API calls of the operator's adapters, by verb, resource and HTTP status (network: "
            "no answer). 404 and 409 include answers the operator expects (gone, exists, changed meanwhile); "
            "kopf's own watch and finalizer calls are not counted", ("verb", "resource", "code"), registry=r)
        self.kafka_errors = Counter(
            "eos_operator_kafka_errors",
            "Failed Kafka calls of the operator, by operation: resolve (fence, ledger read, end offsets before a "
            "start), ledger-read (progress), replay-horizon", ("operation",), registry=r)
        for kind in KINDS:
            for state in STATES:
                self.in_flight.labels(kind, state)
        for operation in KAFKA_OPERATIONS:
            self.kafka_errors.labels(operation)

    def kube_request(self, verb: str, resource: str) -> None:
        self.kube_requests.labels(verb, resource).inc()

    def kube_api_error(self, verb: str, resource: str, status: int) -> None:
        """One failed API call; ``status`` 0: no HTTP answer (refused, reset, timed out)."""
        self.kube_errors.labels(verb, resource, str(status) if status else "network").inc()

    def kafka_error(self, operation: str) -> None:
        self.kafka_errors.labels(operation).inc()

    @contextmanager
    def in_state(self, kind: str, state: str) -> Iterator[None]:
        gauge = self.in_flight.labels(kind, state)
        gauge.inc()
        try:
            yield
        finally:
            gauge.dec()

    @contextmanager
    def timed(self, kind: str) -> Iterator[Timing]:
        """Count a reconcile as running and observe its duration; the caller sets ``outcome`` when it
        returns (a reconcile that raises stays ``error``)."""
        timing = Timing()
        start = time.monotonic()
        with self.in_state(kind, "running"):
            try:
                yield timing
            finally:
                self.reconcile_seconds.labels(kind, timing.outcome).observe(time.monotonic() - start)


class Timing:
    outcome: str = "error"
