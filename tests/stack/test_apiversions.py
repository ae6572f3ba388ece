"""The API versions on the stack's real API server (docs/api-policy.md): an object written under v1alpha1 before
the CRDs moved to v1beta1 is read as v1beta1 after, the operator's reconcile pass handles it, v1alpha1 requests
get the deprecation warning, and ``migrate-storage`` leaves etcd and ``status.storedVersions`` with v1beta1 only.

The CRDs are cluster-scoped and the API server is shared with tests running in parallel (some on older branches
that apply the v1alpha1-only CRDs): every CRD here is a copy of the generated ones under a group, kind and plural
of its own, deleted afterwards, so no other test sees it. The "before" CRD is the generated one cut back to what
v1alpha1-only releases shipped: v1alpha1 alone, stored, not deprecated (the schema is the same, as the policy
requires). etcd is read directly (its JSON gateway, read-only) to see which version each object is stored in.
"""
from __future__ import annotations

import asyncio
import base64
import copy
import json
import urllib.request
import uuid
from typing import Any

import pytest
import yaml

from eos_job.spec import API_GROUP
from eos_operator import kubectl_eos
from eos_operator.crd import build_crd, build_snapshot_crd
from eos_operator.kube_api import KubernetesApi
from eos_operator.reconciler import Deps, reconcile
from eos_operator.storage_migration import migrate_storage
from eos_operator.validation import allow_local_store
from eos_stack.cluster import Kubectl, wait_until
from eos_stack.common import Stack
from eos_stack.kube import load_ports

from ..operator.fake_adapters import FakeClock, FakeResolver
from ..operator.fakes import base_spec


class Scratch:
    """Both CRDs under a group of their own, in their generated (v1beta1) form or cut back to v1alpha1 only."""

    def __init__(self, kubectl: Kubectl):
        self.kubectl = kubectl
        tag = uuid.uuid4().hex[:8]
        self.group = f"v{tag}.api.eos.dev"
        self.crds = {"stream": build_crd(), "snapshot": build_snapshot_crd()}
        for part, crd in self.crds.items():
            kind = f"EosApi{tag}{part.capitalize()}"
            crd["spec"]["group"] = self.group
            crd["spec"]["names"] = {"kind": kind, "listKind": f"{kind}List", "plural": f"{kind.lower()}s",
                                    "singular": kind.lower()}
            crd["metadata"]["name"] = f"{kind.lower()}s.{self.group}"
            for version in crd["spec"]["versions"]:
                if "deprecationWarning" in version:
                    version["deprecationWarning"] = version["deprecationWarning"].replace(API_GROUP, self.group)

    def plural(self, part: str) -> str:
        return self.crds[part]["spec"]["names"]["plural"]

    def name(self, part: str) -> str:
        return self.crds[part]["metadata"]["name"]

    def kind(self, part: str) -> str:
        return self.crds[part]["spec"]["names"]["kind"]

    @staticmethod
    def only(crd: dict[str, Any], version: str) -> dict[str, Any]:
        """The CRD serving ``version`` alone, stored, not deprecated (what a release with only it ships)."""
        out = copy.deepcopy(crd)
        entry = next(v for v in out["spec"]["versions"] if v["name"] == version)
        entry.pop("deprecated", None)
        entry.pop("deprecationWarning", None)
        entry["storage"] = True
        out["spec"]["versions"] = [entry]
        return out

    def apply(self, crd: dict[str, Any], check: bool = True):
        proc = self.kubectl.run("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=yaml.safe_dump(crd),
                                check=check)
        if proc.returncode == 0:   # every version it serves is served (an update is not seen at once)
            plural = crd["spec"]["names"]["plural"]
            for version in crd["spec"]["versions"]:
                path = f"/apis/{self.group}/{version['name']}"
                wait_until(lambda: any(r["name"] == plural for r in json.loads(
                    self.kubectl.run("get", "--raw", path).stdout).get("resources") or []),
                    f"{plural} served at {path}", 60)
        return proc

    def stored_versions(self, part: str) -> list[str]:
        return self.kubectl.json("get", "crd", self.name(part))["status"]["storedVersions"]

    def delete(self) -> None:
        for part in self.crds:
            self.kubectl.run("delete", "crd", self.name(part), "--ignore-not-found", "--wait=false", check=False)


@pytest.fixture
def scratch(stack_env):
    s = Scratch(Kubectl(stack_env))
    try:
        yield s
    finally:
        s.delete()


def etcd_api_version(group: str, plural: str, namespace: str, name: str) -> str:
    """The apiVersion an object is stored in: its etcd value (custom resources are stored as JSON)."""
    port = load_ports(Stack())["etcd_client"]
    key = base64.b64encode(f"/registry/{group}/{plural}/{namespace}/{name}".encode()).decode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v3/kv/range", data=json.dumps({"key": key}).encode())
    with urllib.request.urlopen(req, timeout=10) as resp:
        kvs = json.loads(resp.read()).get("kvs") or []
    assert len(kvs) == 1, f"etcd has no key for {namespace}/{name} of {plural}.{group}"
    return json.loads(base64.b64decode(kvs[0]["value"]))["apiVersion"]


def test_v1alpha1_objects_survive_the_move_to_v1beta1_and_the_storage_migration(scratch, namespace, stack_env,
                                                                                 capsys):
    kubectl, group = scratch.kubectl, scratch.group
    for part in ("stream", "snapshot"):
        scratch.apply(Scratch.only(scratch.crds[part], "v1alpha1"))
        assert scratch.stored_versions(part) == ["v1alpha1"]

    # Written under v1alpha1, before the upgrade.
    stream = {"apiVersion": f"{group}/v1alpha1", "kind": scratch.kind("stream"),
              "metadata": {"name": "colors", "namespace": namespace}, "spec": base_spec()}
    snapshot = {"apiVersion": f"{group}/v1alpha1", "kind": scratch.kind("snapshot"),
                "metadata": {"name": "colors-s1", "namespace": namespace}, "spec": {"stream": "colors"}}
    created = [json.loads(kubectl.run("create", "-o", "json", "-f", "-", stdin=json.dumps(doc)).stdout)
               for doc in (stream, snapshot)]
    stored = {part: etcd_api_version(group, scratch.plural(part), namespace, doc["metadata"]["name"])
              for part, doc in zip(("stream", "snapshot"), (stream, snapshot))}
    assert stored == {"stream": f"{group}/v1alpha1", "snapshot": f"{group}/v1alpha1"}

    # Migrating before the new CRDs are applied is refused, and changes nothing.
    capsys.readouterr()
    argv = ["--kubeconfig", stack_env["KUBECONFIG"], "-o", "json", "migrate-storage",
            "--crd", scratch.name("stream"), "--crd", scratch.name("snapshot")]
    assert kubectl_eos.main(argv) == 1
    assert "stores v1alpha1, not v1beta1: apply the new CRDs" in capsys.readouterr().err
    assert scratch.stored_versions("stream") == ["v1alpha1"]

    # The upgrade: the generated CRDs (v1beta1 stored, v1alpha1 served and deprecated).
    for part in ("stream", "snapshot"):
        scratch.apply(scratch.crds[part])
        assert sorted(scratch.stored_versions(part)) == ["v1alpha1", "v1beta1"]

    # Read as v1beta1: the same object, the same spec; nothing was rewritten by the upgrade itself.
    for part, doc in zip(("stream", "snapshot"), created):
        proc = kubectl.run("get", f"{scratch.plural(part)}.v1beta1.{group}", doc["metadata"]["name"], "-n",
                           namespace, "-o", "json")
        got = json.loads(proc.stdout)
        assert got["apiVersion"] == f"{group}/v1beta1"
        assert got["spec"] == doc["spec"] and got["metadata"]["uid"] == doc["metadata"]["uid"]
        assert got["metadata"]["resourceVersion"] == doc["metadata"]["resourceVersion"]
        assert "Warning" not in proc.stderr, proc.stderr
        old = kubectl.run("get", f"{scratch.plural(part)}.v1alpha1.{group}", doc["metadata"]["name"], "-n",
                          namespace, "-o", "json")
        assert f"Warning: {group}/v1alpha1 is deprecated" in old.stderr and f"use {group}/v1beta1" in old.stderr
        assert etcd_api_version(group, scratch.plural(part), namespace, doc["metadata"]["name"]) \
            == f"{group}/v1alpha1"

    # Dropping v1alpha1 now is refused by the API server: objects are still stored in it.
    refused = scratch.apply(Scratch.only(scratch.crds["stream"], "v1beta1"), check=False)
    assert refused.returncode != 0 and "storedVersions" in refused.stderr, refused.stderr

    # The operator's reconcile pass, speaking v1beta1, on the stream stored as v1alpha1.
    class ScratchApi(KubernetesApi):
        GROUP_VERSION = f"{group}/v1beta1"
        PLURAL, SNAPSHOT_PLURAL = scratch.plural("stream"), scratch.plural("snapshot")

    kube = ScratchApi.from_kubeconfig(stack_env["KUBECONFIG"], threads=2)
    allow_local_store(True)
    try:
        outcome = asyncio.run(reconcile(namespace, "colors", Deps(kube=kube, resolver=FakeResolver(),
                                                                  clock=FakeClock())))
    finally:
        allow_local_store(False)
    assert outcome.exists and outcome.lifecycle_state
    after = kubectl.json("get", f"{scratch.plural('stream')}.v1beta1.{group}", "colors", "-n", namespace)
    assert after["status"]["lifecycleState"] == outcome.lifecycle_state
    assert after["status"]["observedGeneration"] == after["metadata"]["generation"] == 1
    # It launched the driver (resolution, then the Pod). The Pod itself may be gone by now: its owner reference
    # names the real group's kind, where no object has this uid, so the garbage collector may delete it.
    assert (after["status"]["driverPod"], after["status"]["driverAttempt"]) == ("colors-driver-0", 1), after

    # The migration, as users run it (the plugin, with the kubeconfig): every object rewritten unchanged, then
    # storedVersions v1beta1 alone.
    capsys.readouterr()
    rc = kubectl_eos.main(argv)
    out = capsys.readouterr()
    assert rc == 0, out
    results = json.loads(out.out)["items"]
    assert [(r["rewritten"], r["failed"], r["storedVersionsAfter"]) for r in results] == [
        ([f"{namespace}/colors"], [], ["v1beta1"]), ([f"{namespace}/colors-s1"], [], ["v1beta1"])]
    for part, doc in zip(("stream", "snapshot"), created):
        assert scratch.stored_versions(part) == ["v1beta1"]
        assert etcd_api_version(group, scratch.plural(part), namespace, doc["metadata"]["name"]) \
            == f"{group}/v1beta1"
        now = kubectl.json("get", f"{scratch.plural(part)}.v1beta1.{group}", doc["metadata"]["name"], "-n",
                           namespace)
        assert now["spec"] == doc["spec"] and now["metadata"]["generation"] == doc["metadata"]["generation"]
    # Run again: nothing to do.
    again = migrate_storage(kube.request_sync, [scratch.name("stream"), scratch.name("snapshot")])
    assert [(r.rewritten, r.stored_after) for r in again] == [([], ["v1beta1"]), ([], ["v1beta1"])]
    # And the next release may stop serving v1alpha1: the API server accepts the CRD without it.
    scratch.apply(Scratch.only(scratch.crds["stream"], "v1beta1"))
    assert kubectl.json("get", f"{scratch.plural('stream')}.{group}", "colors", "-n", namespace)["apiVersion"] \
        == f"{group}/v1beta1"
