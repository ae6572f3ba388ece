"""The tests' plain reads without a kubectl process (eos_stack.kube_reads) answer exactly as kubectl does."""
from __future__ import annotations

import json

import pytest
from kubernetes import client

from eos_stack.cluster import Kubectl, KubectlError
from eos_stack.kube_reads import ApiReads
from tests.stack.test_kube import GROUP, crd_manifest

pytestmark = pytest.mark.stack


def test_plain_reads_are_told_apart_from_the_rest():
    assert ApiReads.plain(("get", "pods", "-n", "a")) == ("pods", None, "a")
    assert ApiReads.plain(("get", "pod", "p", "--namespace=a")) == ("pod", "p", "a")
    assert ApiReads.plain(("get", "nodes")) == ("nodes", None, None)
    for other in (("get", "pods", "-l", "a=b"), ("get", "pods", "-A"), ("get", "pods,svc"),
                  ("get", "streams.v1beta1.eos.dev"), ("get", "pod/p"), ("describe", "pod", "p"), ("get",),
                  ("get", "pod", "p", "q")):
        assert ApiReads.plain(other) is None, other


def test_the_api_answers_what_kubectl_prints(stack_env, api, namespace):
    kubectl = Kubectl(stack_env)
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_config_map(namespace, {"metadata": {"name": "one", "labels": {"a": "b"}}, "data": {"k": "v"}})
    v1.create_namespaced_service_account(namespace, {"metadata": {"name": "reader"}})

    def both(*args: str) -> dict:
        fast = kubectl.json(*args)
        assert kubectl.reads.answer(args) is not None, f"{args} went to kubectl"
        assert fast == json.loads(kubectl.run(*args, "-o", "json").stdout), args
        return fast

    assert both("get", "configmap", "one", "-n", namespace)["data"] == {"k": "v"}
    listed = both("get", "cm", "-n", namespace)
    assert "one" in [i["metadata"]["name"] for i in listed["items"]]
    assert both("get", "serviceaccounts", "-n", namespace)["items"]
    assert both("get", "nodes")["kind"] == "List"
    both("get", "events", "-n", namespace)
    both("get", "crd")

    # A resource the API server began to serve after the first discovery is found too.
    plural = f"reads{namespace.rsplit('-', 1)[-1]}s"
    ext = client.ApiextensionsV1Api(api)
    ext.create_custom_resource_definition(crd_manifest(plural))
    try:
        from eos_stack.cluster import wait_until
        wait_until(lambda: kubectl.run("get", plural, "-n", namespace, check=False).returncode == 0,
                   "the new CRD to be served", 60)
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            GROUP, "v1", namespace, plural, {"apiVersion": f"{GROUP}/v1", "kind": plural[:-1].capitalize(),
                                             "metadata": {"name": "x"}, "spec": {"size": 2}})
        assert both("get", plural[:-1], "x", "-n", namespace)["spec"] == {"size": 2}

        # A missing object fails as kubectl's does, with kubectl's words.
        with pytest.raises(KubectlError) as missing:
            kubectl.json("get", plural[:-1], "absent", "-n", namespace)
        said = kubectl.run("get", plural[:-1], "absent", "-n", namespace, check=False).stderr.strip()
        assert said in str(missing.value), (said, str(missing.value))
    finally:
        ext.delete_custom_resource_definition(f"{plural}.{GROUP}")
