"""Fixtures of the stack tests that talk to the local API server directly (kubernetes client)."""
from __future__ import annotations

import uuid

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kubernetes import client, config
from kubernetes.client.rest import ApiException


@pytest.fixture(scope="module")
def api(stack_env):
    api_client = config.new_client_from_config(config_file=stack_env["KUBECONFIG"])
    yield api_client
    api_client.close()


def fresh_namespace(api, prefix: str, labels: dict[str, str] | None = None):
    """A namespace ``t-<prefix>-<random>`` with ``labels``, deleted after the fixture that yields from this."""
    v1 = client.CoreV1Api(api)
    name = f"t-{prefix}-{uuid.uuid4().hex[:8]}"
    v1.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}})
    yield name
    try:
        v1.delete_namespace(name)
    except ApiException as exc:
        if exc.status != 404:
            raise


@pytest.fixture
def namespace(api, request):
    """A fresh namespace named after the test module (t-kube-..., t-kubelet-...), deleted afterwards."""
    yield from fresh_namespace(api, request.module.__name__.rsplit('.', 1)[-1].removeprefix('test_'))


KAFKA_TIMEOUT = 60.0


@pytest.fixture
def bootstrap(stack_env) -> str:
    return stack_env["KAFKA_BOOTSTRAP"]


@pytest.fixture
def topic(bootstrap):
    """A fresh single-partition topic (the broker does not auto-create topics), deleted afterwards."""
    name = f"test-txn-{uuid.uuid4().hex[:10]}"
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        for fut in admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)],
                                       operation_timeout=30).values():
            fut.result(timeout=KAFKA_TIMEOUT)
        yield name
        for fut in admin.delete_topics([name], operation_timeout=30).values():
            fut.result(timeout=KAFKA_TIMEOUT)


@pytest.fixture
def restricted_ns(api, nodes):
    """A namespace that enforces the restricted Pod Security level, deleted afterwards."""
    from tests.harness.real_nodes import RESTRICTED_LABELS

    yield from fresh_namespace(api, "node", RESTRICTED_LABELS)


def sink_and_ledger(bootstrap: str, kind: str, slots: int = 2):
    """A two-partition sink topic and a ledger for ``slots`` slots of a run of its own (``test-<kind>-out-<run>``),
    the run, the stream's uid and transactional prefix; both topics deleted after the fixture that yields from this."""
    from eos_job.ledger_topic import Durability, ensure_ledger_topic
    run = uuid.uuid4().hex[:10]
    names = {"run": run, "out": f"test-{kind}-out-{run}", "ledger": f"test-{kind}-ledger-{run}", "uid": uuid.uuid4().hex,
             "prefix": f"eos-test-{kind}-{run}"}
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        for fut in admin.create_topics([NewTopic(names["out"], num_partitions=2, replication_factor=1)],
                                       operation_timeout=30).values():
            fut.result(timeout=60)
        ensure_ledger_topic(admin, names["ledger"], slots, Durability(1, 1), timeout_s=60)
        yield names
        for fut in admin.delete_topics([names["out"], names["ledger"]], operation_timeout=30).values():
            fut.result(timeout=60)
