"""Fixtures of the stack tests that talk to the local API server directly (kubernetes client)."""
from __future__ import annotations

import uuid

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException


@pytest.fixture(scope="module")
def api(stack_env):
    api_client = config.new_client_from_config(config_file=stack_env["KUBECONFIG"])
    yield api_client
    api_client.close()


@pytest.fixture
def namespace(api, request):
    """A fresh namespace named after the test module (t-kube-..., t-kubelet-...), deleted afterwards."""
    v1 = client.CoreV1Api(api)
    name = f"t-{request.module.__name__.rsplit('.', 1)[-1].removeprefix('test_')}-{uuid.uuid4().hex[:8]}"
    v1.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    try:
        v1.delete_namespace(name)
    except ApiException as exc:
        if exc.status != 404:
            raise
