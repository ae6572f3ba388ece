"""KubernetesApi against the real API server: it never replaces or deletes an object it does not own.

Children are found by name (``<stream>-run``, ``<stream>-driver``, ...); an object of that name made by
someone else must survive a launch (apply, create: NameTaken) and a deletion (left, with a warning).
The "stream" here is a plain ConfigMap whose uid the bodies' ownerReferences name: the checks compare
uids only. The namespace has no Pod Security labels and the Pods never run (no kubelet needed).
"""
from __future__ import annotations

import asyncio
import uuid

import pytest
from kubernetes import client

from eos_operator.kube_api import KubernetesApi, NameTaken


@pytest.fixture
def namespace(api):
    """As conftest's, named t-ownership-... (the module's name has an underscore, invalid in a namespace)."""
    v1 = client.CoreV1Api(api)
    name = f"t-ownership-{uuid.uuid4().hex[:8]}"
    v1.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    v1.delete_namespace(name)


@pytest.fixture(scope="module")
def kube(stack_env):
    api = KubernetesApi.from_kubeconfig(stack_env["KUBECONFIG"])
    yield api
    api.api.close()


@pytest.fixture
def owner(api, namespace):
    """A real object standing in for the stream: its uid is what owned children name."""
    obj = client.CoreV1Api(api).create_namespaced_config_map(namespace, {"metadata": {"name": "the-stream"}})
    return {"apiVersion": "v1", "kind": "ConfigMap", "name": "the-stream", "uid": obj.metadata.uid,
            "controller": True}


def run(coro):
    return asyncio.run(coro)


def config_map(name: str, data: dict, owner: dict | None) -> dict:
    meta: dict = {"name": name}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def pod(name: str, owner: dict | None) -> dict:
    meta: dict = {"name": name}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"automountServiceAccountToken": False, "containers": [{"name": "c", "image": "eos:test"}]}}


def test_a_foreign_config_map_is_neither_replaced_nor_deleted(api, namespace, kube, owner):
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_config_map(namespace, config_map("payments-run", {"theirs": "1"}, None))
    with pytest.raises(NameTaken) as err:
        run(kube.apply_config_map(namespace, config_map("payments-run", {"run.json": "{}"}, owner)))
    assert err.value.status == 409
    assert err.value.message == (
        f"ConfigMap {namespace}/payments-run already exists and belongs to no owner, not to uid {owner['uid']}: "
        "delete or rename it; the operator never replaces an object it does not own")
    run(kube.delete_config_map(namespace, "payments-run", owner["uid"]))
    assert v1.read_namespaced_config_map("payments-run", namespace).data == {"theirs": "1"}

    # Owned by another object (a stream of the same name that was deleted and made again has another uid).
    other = v1.create_namespaced_config_map(namespace, {"metadata": {"name": "someone-else"}})
    theirs = {"apiVersion": "v1", "kind": "ConfigMap", "name": "someone-else", "uid": other.metadata.uid}
    v1.create_namespaced_config_map(namespace, config_map("payments-drain", {"theirs": "2"}, theirs))
    with pytest.raises(NameTaken, match=f"belongs to ConfigMap someone-else \\(uid {other.metadata.uid}\\)"):
        run(kube.apply_config_map(namespace, config_map("payments-drain", {}, owner)))
    run(kube.delete_config_map(namespace, "payments-drain", owner["uid"]))
    assert v1.read_namespaced_config_map("payments-drain", namespace).data == {"theirs": "2"}


def test_an_owned_config_map_is_replaced_and_deleted(api, namespace, kube, owner):
    v1 = client.CoreV1Api(api)
    run(kube.apply_config_map(namespace, config_map("payments-run", {"v": "1"}, owner)))
    run(kube.apply_config_map(namespace, config_map("payments-run", {"v": "2"}, owner)))   # a 409, then PUT
    assert v1.read_namespaced_config_map("payments-run", namespace).data == {"v": "2"}
    run(kube.delete_config_map(namespace, "payments-run", owner["uid"]))
    assert not [c for c in v1.list_namespaced_config_map(namespace).items if c.metadata.name == "payments-run"
                and not c.metadata.deletion_timestamp]
    run(kube.delete_config_map(namespace, "payments-run", owner["uid"]))                   # gone: no error


def test_a_delete_never_removes_an_object_replaced_since_it_was_read(api, namespace, kube, owner):
    """The uid precondition: the server refuses (409) to delete a newer object of the same name."""
    v1 = client.CoreV1Api(api)
    run(kube.apply_config_map(namespace, config_map("payments-run", {"v": "old"}, owner)))
    path = f"/api/v1/namespaces/{namespace}/configmaps/payments-run"
    stale = run(kube._get(path))
    v1.delete_namespaced_config_map("payments-run", namespace)
    v1.create_namespaced_config_map(namespace, config_map("payments-run", {"v": "new"}, owner))
    run(kube._delete_owned("ConfigMap", path, stale, owner["uid"]))
    assert v1.read_namespaced_config_map("payments-run", namespace).data == {"v": "new"}


def test_a_foreign_service_is_neither_replaced_nor_deleted(api, namespace, kube, owner):
    v1 = client.CoreV1Api(api)
    spec = {"clusterIP": "None", "ports": [{"name": "driver", "port": 7078}]}
    v1.create_namespaced_service(namespace, {"metadata": {"name": "payments-driver", "labels": {"theirs": "1"}},
                                             "spec": spec})
    ours = {"apiVersion": "v1", "kind": "Service", "spec": spec,
            "metadata": {"name": "payments-driver", "ownerReferences": [owner]}}
    with pytest.raises(NameTaken, match="Service .*/payments-driver already exists and belongs to no owner"):
        run(kube.apply_service(namespace, ours))
    run(kube.delete_service(namespace, "payments-driver", owner["uid"]))
    assert v1.read_namespaced_service("payments-driver", namespace).metadata.labels == {"theirs": "1"}


def test_create_pod_over_a_foreign_pod_raises_name_taken(api, namespace, kube, owner):
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_pod(namespace, pod("payments-driver-0", None))
    with pytest.raises(NameTaken, match="Pod .*/payments-driver-0 already exists and belongs to no owner"):
        run(kube.create_pod(namespace, pod("payments-driver-0", owner)))
    run(kube.delete_pod(namespace, "payments-driver-0", 0, owner_uid=owner["uid"]))
    assert v1.read_namespaced_pod("payments-driver-0", namespace).metadata.deletion_timestamp is None

    # Our own Pod: a repeated create is success (the deterministic name), an owned delete goes through.
    run(kube.create_pod(namespace, pod("payments-driver-1", owner)))
    run(kube.create_pod(namespace, pod("payments-driver-1", owner)))
    run(kube.delete_pod(namespace, "payments-driver-1", 0, owner_uid=owner["uid"]))
    left = [p.metadata.name for p in v1.list_namespaced_pod(namespace).items if not p.metadata.deletion_timestamp]
    assert left == ["payments-driver-0"]
    # Without an owner in the body (a snapshot's dispose Pod) a 409 stays success.
    run(kube.create_pod(namespace, pod("payments-driver-0", None)))
