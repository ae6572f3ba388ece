"""Fixtures of the end-to-end tests: the API server with the CRDs, a namespace per test, the real nodes' Pods,
the operator, and drivers of the colors job that never outlive their test. Helpers are in streams.py; placing
streams on the real nodes in on_nodes.py."""
from __future__ import annotations

import uuid

import pytest

from eos_stack.cluster import RESTRICTED, Kubectl
from eos_stack.common import free_port
from examples.colors.local_run import ColorsRun
from tests.e2e.chart_operator import ChartOperator
from tests.e2e.on_nodes import NodeStreams
from tests.e2e.streams import OperatorProcess


@pytest.fixture(scope="module")
def kubectl(stack_env) -> Kubectl:
    """Every CRD, before any operator starts (it discovers the resources it serves once, at start)."""
    k = Kubectl(stack_env)
    k.apply_crds()
    return k


@pytest.fixture
def namespace(kubectl: Kubectl):
    ns = f"eos-e2e-{uuid.uuid4().hex[:6]}"
    kubectl.run("create", "namespace", ns)
    # Every e2e namespace enforces the restricted Pod Security level, as production namespaces do: a Pod
    # of the operator (driver, executors, pre-flight, drain, snapshots) that breaks it is refused.
    kubectl.run("label", "namespace", ns, *RESTRICTED)
    yield ns
    # The operator is gone by now: release what still carries its finalizer, then drop the namespace.
    for kind in ("exactlyoncestreams", "exactlyoncesnapshots"):
        for s in kubectl.json("get", kind, "-n", ns)["items"]:
            kubectl.run("patch", kind, s["metadata"]["name"], "-n", ns, "--type=merge", "-p",
                        '{"metadata":{"finalizers":null}}', check=False)
    kubectl.run("delete", "namespace", ns, "--wait=false", check=False)


@pytest.fixture
def kubelet(nodes, on_nodes: NodeStreams, tmp_path):
    """What runs the namespace's Pods, as the test sees it (``kill9``, ``log_dir``, ``log_path``): the real nodes
    (tests/harness/node_pods.py ``NodePods``, following every Pod's log into ``log_dir``); the test's streams go
    through ``on_nodes``. Asking for ``nodes`` starts them if need be and holds their lock (tests/harness/node_lock.py)
    for any test with an operator, marked ``real_nodes`` or not."""
    with on_nodes.pods(tmp_path / "kubelet") as pods:
        yield pods


@pytest.fixture
def on_nodes(stack_env, kubectl, namespace) -> NodeStreams:
    """Places the test's streams on the real nodes (tests/e2e/on_nodes.py): the bucket's keys Secret and the test
    job modules' ConfigMap made in the namespace; ``on_nodes.place(doc)`` rewrites a manifest."""
    return NodeStreams(stack_env, kubectl, namespace).setup()


@pytest.fixture
def operator(stack_env, namespace, kubelet, tmp_path):
    op = OperatorProcess(stack_env["KUBECONFIG"], namespace, tmp_path / "operator.log",
                         liveness_port=free_port()).start()
    yield op
    op.stop()


@pytest.fixture
def chart_operator(stack_env, kubectl, namespace, kubelet, tmp_path):
    """The chart's operator Deployment in the namespace, its Pod on the real nodes (mark the test
    ``real_nodes``)."""
    op = ChartOperator(stack_env, kubectl, namespace, kubelet, tmp_path).start()
    yield op
    op.stop()


@pytest.fixture
def colors_run(stack_env, tmp_path):
    """Makes ColorsRuns (a local driver of the colors job) on the stack's broker, or on ``bootstrap=`` (a test's
    private broker); whatever driver one of them still runs at the end is SIGKILLed with its process group, so
    a failed assertion never leaves a JVM behind."""
    runs: list[ColorsRun] = []

    def make(**options) -> ColorsRun:
        run = ColorsRun(options.pop("bootstrap", stack_env["KAFKA_BOOTSTRAP"]), options.pop("work_dir", tmp_path),
                        **options)
        runs.append(run)
        return run

    yield make
    for run in runs:
        if run.proc is not None and run.proc.poll() is None:
            run.kill9()
