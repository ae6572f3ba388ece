"""Shared pieces of the operator-level stream tests: a namespace per test, a steady event
trickle with its expected counts, and a rig of topics, process kubelet and (restartable) operator."""
from __future__ import annotations

import contextlib
import json
import threading
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from confluent_kafka import Producer

from eos_job.verify import audit_counts
from eos_stack.cluster import Kubectl, wait_until
from examples.colors.generator import events
from tests.e2e.exactness import assert_exactly_once
from tests.e2e.test_operator_e2e import PYTHONPATH, ColorsTopics, Diagnostics, OperatorProcess, colors_stream
from tests.harness.kubelet import ProcessKubelet

NAME = "colors"


class Trickle(threading.Thread):
    """Events keep arriving: a small chunk every ``period`` seconds; the expected counts follow."""

    def __init__(self, bootstrap: str, topic: str, chunk: int = 10, period: float = 0.25, start_id: int = 0):
        super().__init__(daemon=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                                  "linger.ms": 5})
        self.topic, self.chunk, self.period, self.next_id = topic, chunk, period, start_id
        self.expected: Counter = Counter()
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def send(self, n: int, seed: int) -> None:
        for i, color in events(n, seed=seed, start_id=self.next_id):
            self.producer.produce(self.topic, key=str(i).encode(), value=json.dumps({"id": i, "color": color}).encode())
            if color != "orange":
                self.expected[color] += 1
        self.next_id += n
        if self.producer.flush(30):
            raise RuntimeError("events not delivered")

    def run(self) -> None:
        seed = 1000
        try:
            while not self.halt.wait(self.period):
                seed += 1
                self.send(self.chunk, seed)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def stop(self) -> dict[str, int]:
        self.halt.set()
        self.join(30)
        assert self.error is None, self.error
        return dict(sorted(self.expected.items()))


@pytest.fixture
def kubectl(stack_env) -> Kubectl:
    k = Kubectl(stack_env)
    k.apply_crds()
    return k


@pytest.fixture
def namespace(kubectl: Kubectl):
    ns = f"eos-st-{uuid.uuid4().hex[:6]}"
    kubectl.run("create", "namespace", ns)
    yield ns
    for kind in ("exactlyoncestreams", "exactlyoncesnapshots"):
        for s in kubectl.json("get", kind, "-n", ns)["items"]:
            kubectl.run("patch", kind, s["metadata"]["name"], "-n", ns, "--type=merge", "-p",
                        '{"metadata":{"finalizers":null}}', check=False)
    kubectl.run("delete", "namespace", ns, "--wait=false", check=False)


class Rig:
    """Topics, a process kubelet and a (restartable) operator for one namespace."""

    def __init__(self, stack_env: dict[str, str], kubectl: Kubectl, namespace: str, tmp_path: Path,
                 kubelet: ProcessKubelet):
        self.env, self.kubectl, self.ns, self.tmp = stack_env, kubectl, namespace, tmp_path
        self.bootstrap = stack_env["KAFKA_BOOTSTRAP"]
        self.topics = ColorsTopics(self.bootstrap)
        self.kubelet = kubelet
        self.operator: OperatorProcess | None = None
        self.diag = Diagnostics(kubectl, namespace, None, kubelet)

    def start_operator(self, metrics_port: int | None = None, **switches: str) -> OperatorProcess:
        self.operator = OperatorProcess(self.env["KUBECONFIG"], self.ns, self.tmp / "operator.log",
                                        metrics_port=metrics_port, **switches).start()
        self.diag.operator = self.operator
        return self.operator

    def run_stream(self, doc: dict[str, Any], *, seed: int, first_output: bool = True,
                   metrics_port: int | None = None) -> Trickle:
        """Start the operator, a backlog of 1000 events, the stream; once it runs (and wrote its first
        output), a steady trickle of events. Returns the trickle (its ``stop()`` gives the expected counts)."""
        self.start_operator(metrics_port=metrics_port)
        trickle = Trickle(self.bootstrap, self.topics.events)
        trickle.send(1000, seed=seed)
        self.kubectl.apply(doc, self.ns)
        self.wait_status(lambda s: s.get("lifecycleState") == "Running", "the stream to run")
        if first_output:
            wait_until(lambda: self.counts_total() > 0, "first output", 240, self.diag, 2)
        trickle.start()
        return trickle

    def status(self, name: str = NAME) -> dict[str, Any]:
        return self.kubectl.status(self.ns, name)

    def wait_status(self, pred: Callable[[dict[str, Any]], bool], what: str, timeout: float = 240,
                    name: str = NAME) -> dict[str, Any]:
        return wait_until(lambda: (lambda s: s if pred(s) else None)(self.status(name)), what, timeout,
                          self.diag, 0.5)

    def pod_phase(self, pod: str) -> str | None:
        for p in self.kubectl.pods(self.ns):
            if p["metadata"]["name"] == pod:
                return (p.get("status") or {}).get("phase")
        return None

    def counts_total(self, topic: str | None = None) -> int:
        return sum(audit_counts(self.bootstrap, topic or self.topics.counts).final.values())

    def stream(self, **spec_changes: Any) -> dict[str, Any]:
        doc = colors_stream(NAME, self.topics, self.tmp / "checkpoint", attempts=10, delay=2)
        del doc["spec"]["upgradeMode"]          # snapshot, the default
        doc["spec"].update(spec_changes)
        return doc


@contextlib.contextmanager
def rig(stack_env, kubectl, namespace, tmp_path, env_for=None) -> Iterator[Rig]:
    with ProcessKubelet(stack_env["KUBECONFIG"], namespace=namespace, log_dir=tmp_path / "kubelet",
                        extra_env={"PYTHONPATH": PYTHONPATH}, env_for=env_for) as kubelet:
        r = Rig(stack_env, kubectl, namespace, tmp_path, kubelet)
        try:
            yield r
        finally:
            kubectl.run("delete", "exactlyoncestream", "--all", "-n", namespace, "--timeout=120s", check=False)
            if r.operator is not None:
                r.operator.stop()


def finish_exact(r: Rig, trickle: Trickle, name: str = NAME, counts: str | None = None) -> dict[str, int]:
    expected = trickle.stop()
    counts = counts or r.topics.counts
    wait_until(lambda: audit_counts(r.bootstrap, counts).final == expected, "the output to catch up", 300,
               r.diag, 2)
    assert_exactly_once(r.bootstrap, counts, f"{counts}.eos-ledger.{r.ns}.{name}", expected, (r.topics.dlq,))
    return expected


