"""The local Kubernetes API (etcd + kube-apiserver + the controllers it needs: garbage collector, namespace, PV binder)."""
from __future__ import annotations

import json
import subprocess
import uuid

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from eos_stack.cluster import wait_until

GROUP = "test.eos.local"


def crd_manifest(plural: str) -> dict:
    kind = plural[:-1].capitalize()
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": plural[:-1], "kind": kind, "listKind": f"{kind}List"},
            "versions": [{
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {
                            "type": "object",
                            "required": ["size"],
                            "properties": {
                                "size": {"type": "integer", "minimum": 1, "maximum": 10},
                                "color": {"type": "string", "enum": ["red", "green", "blue"]},
                            },
                        },
                        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                    },
                }},
            }],
        },
    }


@pytest.fixture
def crd(api):
    """A fresh CRD (unique plural per test) that is Established; deleted afterwards."""
    ext = client.ApiextensionsV1Api(api)
    plural = f"widgets{uuid.uuid4().hex[:6]}s"
    manifest = crd_manifest(plural)
    ext.create_custom_resource_definition(manifest)

    def established():
        obj = json.loads(ext.read_custom_resource_definition(manifest["metadata"]["name"],
                                                             _preload_content=False).data)
        return any(c["type"] == "Established" and c["status"] == "True"
                   for c in (obj.get("status") or {}).get("conditions") or [])
    wait_until(established, "the CRD to be established", 30)
    yield manifest
    try:
        ext.delete_custom_resource_definition(manifest["metadata"]["name"])
    except ApiException as exc:
        if exc.status != 404:
            raise


def test_apiserver_version_and_env(stack_env, api):
    assert stack_env["KUBE_APISERVER"].startswith("https://127.0.0.1:")
    info = client.VersionApi(api).get_code()
    assert info.git_version.startswith("v1.35."), info


def test_namespace_crd_and_custom_object_with_python_client(api, namespace, crd):
    custom = client.CustomObjectsApi(api)
    plural = crd["spec"]["names"]["plural"]
    body = {"apiVersion": f"{GROUP}/v1", "kind": crd["spec"]["names"]["kind"],
            "metadata": {"name": "w1"}, "spec": {"size": 3, "color": "red"}}
    custom.create_namespaced_custom_object(GROUP, "v1", namespace, plural, body)
    got = custom.get_namespaced_custom_object(GROUP, "v1", namespace, plural, "w1")
    assert got["spec"] == {"size": 3, "color": "red"}
    # The status subresource works (the operator writes status through it).
    custom.patch_namespaced_custom_object_status(GROUP, "v1", namespace, plural, "w1",
                                                 {"status": {"phase": "Running"}},
                                                 _content_type="application/merge-patch+json")
    got = custom.get_namespaced_custom_object(GROUP, "v1", namespace, plural, "w1")
    assert got["status"] == {"phase": "Running"}
    listed = custom.list_namespaced_custom_object(GROUP, "v1", namespace, plural)
    assert [i["metadata"]["name"] for i in listed["items"]] == ["w1"]


def test_schema_violations_are_rejected(api, namespace, crd):
    custom = client.CustomObjectsApi(api)
    plural, kind = crd["spec"]["names"]["plural"], crd["spec"]["names"]["kind"]
    for i, spec in enumerate([{"size": 0}, {"size": "big"}, {"size": 2, "color": "purple"}, {"color": "red"}]):
        body = {"apiVersion": f"{GROUP}/v1", "kind": kind, "metadata": {"name": f"bad{i}"}, "spec": spec}
        with pytest.raises(ApiException) as err:
            custom.create_namespaced_custom_object(GROUP, "v1", namespace, plural, body)
        assert err.value.status == 422, (spec, err.value)
    assert custom.list_namespaced_custom_object(GROUP, "v1", namespace, plural)["items"] == []


def kubectl(env: dict[str, str], *args: str, input: str | None = None, check: bool = True):
    proc = subprocess.run([env["KUBECTL"], "--kubeconfig", env["KUBECONFIG"], *args], input=input,
                          capture_output=True, text=True, timeout=120)
    if check:
        assert proc.returncode == 0, f"kubectl {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_kubectl_apply_crd_and_object(stack_env, api, namespace):
    plural = f"gadgets{uuid.uuid4().hex[:6]}s"
    crd = crd_manifest(plural)
    name = crd["metadata"]["name"]
    try:
        kubectl(stack_env, "apply", "-f", "-", input=json.dumps(crd))
        kubectl(stack_env, "wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
        obj = {"apiVersion": f"{GROUP}/v1", "kind": crd["spec"]["names"]["kind"],
               "metadata": {"name": "g1", "namespace": namespace}, "spec": {"size": 5}}
        kubectl(stack_env, "apply", "-f", "-", input=json.dumps(obj))
        out = kubectl(stack_env, "get", f"{plural}.{GROUP}", "g1", "-n", namespace, "-o", "json").stdout
        assert json.loads(out)["spec"] == {"size": 5}
        # Applying again with a change updates it in place.
        obj["spec"]["size"] = 6
        kubectl(stack_env, "apply", "-f", "-", input=json.dumps(obj))
        out = kubectl(stack_env, "get", f"{plural}.{GROUP}", "g1", "-n", namespace,
                      "-o", "jsonpath={.spec.size}").stdout
        assert out == "6"
        # The schema is enforced for kubectl as well.
        obj["spec"]["size"] = 99
        bad = kubectl(stack_env, "apply", "-f", "-", input=json.dumps(obj), check=False)
        assert bad.returncode != 0 and "spec.size" in bad.stderr, bad.stderr
    finally:
        kubectl(stack_env, "delete", "crd", name, "--ignore-not-found", "--wait=false", check=False)


def test_owner_reference_garbage_collection(api, namespace):
    v1 = client.CoreV1Api(api)
    owner = json.loads(v1.create_namespaced_config_map(
        namespace, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"},
                    "data": {"a": "1"}}, _preload_content=False).data)
    v1.create_namespaced_config_map(namespace, {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "child", "ownerReferences": [{
            "apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}]},
        "data": {"b": "2"}})
    v1.read_namespaced_config_map("child", namespace)
    v1.delete_namespaced_config_map("owner", namespace)

    def child_gone():
        try:
            v1.read_namespaced_config_map("child", namespace)
            return False
        except ApiException as exc:
            return exc.status == 404
    wait_until(child_gone, "the garbage collector to delete the child ConfigMap", 60)


def test_namespace_deletion_removes_its_content(api):
    v1 = client.CoreV1Api(api)
    name = f"t-kube-del-{uuid.uuid4().hex[:8]}"
    v1.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    v1.create_namespaced_config_map(name, {"apiVersion": "v1", "kind": "ConfigMap",
                                           "metadata": {"name": "x"}, "data": {"k": "v"}})
    v1.delete_namespace(name)

    def gone():
        try:
            v1.read_namespace(name)
            return False
        except ApiException as exc:
            return exc.status == 404
    wait_until(gone, "the namespace controller to finish deleting the namespace", 90)


def test_limited_identity_from_make_client_kubeconfig(api, namespace, tmp_path):
    from eos_stack import kube
    from eos_stack.common import Stack

    path = kube.make_client_kubeconfig(Stack(), "eos-test-user", ["eos:testers"], tmp_path / "user.kubeconfig")
    limited = config.new_client_from_config(config_file=str(path))
    try:
        v1 = client.CoreV1Api(limited)
        with pytest.raises(ApiException) as err:
            v1.list_namespaced_config_map(namespace)
        assert err.value.status == 403
        assert "eos-test-user" in str(err.value.body)
        rbac = client.RbacAuthorizationV1Api(api)
        rbac.create_namespaced_role(namespace, {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "cm-reader"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]})
        rbac.create_namespaced_role_binding(namespace, {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "testers"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-reader"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "eos:testers"}]})

        def allowed():
            try:
                v1.list_namespaced_config_map(namespace)
                return True
            except ApiException as exc:
                if exc.status == 403:
                    return False
                raise
        wait_until(allowed, "the RoleBinding to take effect", 30)
        # Still nothing beyond what the role grants.
        with pytest.raises(ApiException) as err:
            v1.list_namespaced_secret(namespace)
        assert err.value.status == 403
    finally:
        limited.close()


def test_restricted_namespaces_refuse_pods_that_break_pod_security(api):
    """The PodSecurity admission is on: the label the e2e and chart namespaces carry makes a Pod without
    the restricted security context a 403, so their passing Pods prove the operator's Pods comply."""
    from eos_stack.cluster import RESTRICTED

    v1 = client.CoreV1Api(api)
    name = f"t-kube-pss-{uuid.uuid4().hex[:8]}"
    labels = dict(label.split("=", 1) for label in RESTRICTED)
    v1.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
    try:
        bare = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bare"},
                "spec": {"containers": [{"name": "c", "image": "eos:test"}]}}
        with pytest.raises(ApiException) as err:
            v1.create_namespaced_pod(name, bare)
        assert err.value.status == 403 and "violates PodSecurity" in str(err.value.body), err.value.body
        restricted = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "restricted"},
                      "spec": {"securityContext": {"runAsNonRoot": True, "runAsUser": 10001,
                                                   "seccompProfile": {"type": "RuntimeDefault"}},
                               "containers": [{"name": "c", "image": "eos:test", "securityContext": {
                                   "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]}}
        v1.create_namespaced_pod(name, restricted)
    finally:
        v1.delete_namespace(name)
