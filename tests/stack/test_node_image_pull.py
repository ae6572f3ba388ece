"""Image pulls on the real nodes from the stack's registry (stack/eos_stack/registry.py, node_images.py): the real
kubelet asks its containerd (``hosts.toml`` under the CRI's ``config_path``, plain HTTP) for the project's image
as ``$EOS_NODE_IMAGE`` and a Pod with ``imagePullPolicy: Always`` runs it; a tag missing from the registry is
``ErrImagePull``/``ImagePullBackOff`` from the real kubelet, and the operator's reading of a Pending Pod
(``eos_operator.observed.start_blocker``, what status and events say of a driver that cannot start) names it
with the image. Seconds each, no Spark."""
from __future__ import annotations

import uuid

import pytest
from kubernetes import client

from eos_operator.observed import start_blocker
from tests.harness.real_nodes import finished, node_image, real_pod, wait_pod

pytestmark = pytest.mark.timeout(900)   # the first test also waits for the nodes when they are not up yet


def waiting_reason(pod) -> str | None:
    for c in pod.status.container_statuses or []:
        if c.state and c.state.waiting:
            return c.state.waiting.reason
    return None


def test_a_pod_pulls_the_project_image_from_the_local_registry(api, nodes, restricted_ns):
    v1 = client.CoreV1Api(api)
    body = real_pod("pull-always", ["/bin/sh", "-c", "echo pulled"])
    body["spec"]["containers"][0]["imagePullPolicy"] = "Always"     # the kubelet asks the registry every time
    v1.create_namespaced_pod(restricted_ns, body)
    pod = wait_pod(v1, restricted_ns, "pull-always", finished, "the Pod pulled from the registry to finish")
    assert pod.status.phase == "Succeeded", pod.status
    assert pod.status.container_statuses[0].image.endswith(node_image().split("/", 1)[1]), pod.status
    events = v1.list_namespaced_event(restricted_ns, field_selector="involvedObject.name=pull-always").items
    assert any(e.reason == "Pulled" and node_image() in e.message for e in events), [e.message for e in events]


def test_a_tag_missing_from_the_registry_is_err_image_pull_named_by_the_operator(api, nodes, restricted_ns):
    v1 = client.CoreV1Api(api)
    missing = f"{node_image().rpartition(':')[0]}:missing-{uuid.uuid4().hex[:8]}"
    body = real_pod("missing-tag", ["/bin/true"])
    body["spec"]["containers"][0].update(image=missing, imagePullPolicy="IfNotPresent")
    v1.create_namespaced_pod(restricted_ns, body)
    pod = wait_pod(v1, restricted_ns, "missing-tag",
                   lambda p: waiting_reason(p) in ("ErrImagePull", "ImagePullBackOff"),
                   "the real kubelet to report the missing tag", timeout=120)
    assert pod.status.phase == "Pending", pod.status
    waiting = pod.status.container_statuses[0].state.waiting
    # The registry answered: not found (not a TLS or connection failure: containerd spoke plain HTTP to it).
    assert "not found" in (waiting.message or "").lower() or waiting.reason == "ImagePullBackOff", waiting

    blocker = start_blocker(api.sanitize_for_serialization(pod)["status"])
    assert blocker is not None and blocker.startswith(waiting.reason), blocker
    assert missing in blocker, blocker
    events = v1.list_namespaced_event(restricted_ns, field_selector="involvedObject.name=missing-tag").items
    failed = [e.message for e in events if e.reason == "Failed" and missing in (e.message or "")]
    assert failed and any("not found" in m for m in failed), [e.message for e in events]
