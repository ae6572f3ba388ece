"""``kubectl eos migrate-storage`` (storage_migration.py) against a fake API server: what it rewrites, when it
refuses, and that it drops an older version from ``status.storedVersions`` only once every object is rewritten.
The real API server and etcd: tests/stack/test_apiversions.py."""
from __future__ import annotations

from typing import Any

import pytest

from eos_operator.kube_errors import Conflict, KubeError
from eos_operator.kubectl_eos import parser
from eos_operator.storage_migration import CRD_API, MigrationRefused, migrate_crd, migrate_storage

pytestmark = pytest.mark.unit
CRD = "exactlyoncestreams.streaming.eos.dev"
BASE = "/apis/streaming.eos.dev/v1beta1"


class FakeServer:
    def __init__(self, objects: list[str], stored=("v1alpha1", "v1beta1"), storage="v1beta1"):
        self.crd = {"spec": {"group": "streaming.eos.dev", "names": {"plural": "exactlyoncestreams"},
                             "versions": [{"name": "v1beta1", "storage": storage == "v1beta1"},
                                          {"name": "v1alpha1", "storage": storage == "v1alpha1"}]},
                    "status": {"storedVersions": list(stored)}}
        self.objects = {name: {"metadata": {"namespace": "team", "name": name, "resourceVersion": "1"}}
                        for name in objects}
        self.fail: dict[str, list[KubeError]] = {}    # errors the next PUTs of an object raise, in order
        self.calls: list[tuple[str, str]] = []

    def __call__(self, method: str, path: str, body: Any = None, query=None, content_type: str = "") -> Any:
        self.calls.append((method, path))
        if path == f"{CRD_API}/{CRD}":
            return self.crd
        if path == f"{CRD_API}/{CRD}/status":
            assert method == "PATCH"
            self.crd["status"].update(body["status"])
            return self.crd
        if path == f"{BASE}/exactlyoncestreams":   # pages of one object, as a server with limit=1 answers
            items = list(self.objects.values())
            at = int((query or {}).get("continue") or 0)
            more = {"continue": str(at + 1)} if at + 1 < len(items) else {}
            return {"items": items[at:at + 1], "metadata": more}
        name = path.rsplit("/", 1)[-1]
        if name not in self.objects:
            raise KubeError(404, "not found")
        if method == "PUT":
            if self.fail.get(name):
                raise self.fail[name].pop(0)
            assert body == self.objects[name]       # unchanged: what was read is written back
            return body
        return self.objects[name]


def test_every_object_is_rewritten_then_the_older_version_is_dropped():
    server = FakeServer(["a", "b"])
    result = migrate_crd(server, CRD)
    assert result.rewritten == ["team/a", "team/b"] and result.failed == [] and result.done
    assert server.crd["status"]["storedVersions"] == ["v1beta1"]
    puts = [p for m, p in server.calls if m == "PUT"]
    assert puts == [f"{BASE}/namespaces/team/exactlyoncestreams/a", f"{BASE}/namespaces/team/exactlyoncestreams/b"]
    assert server.calls[-1] == ("PATCH", f"{CRD_API}/{CRD}/status")


def test_a_conflict_is_read_again_and_a_deleted_object_is_skipped():
    server = FakeServer(["a", "gone"])
    server.fail["a"] = [Conflict(409, "changed")]
    server.fail["gone"] = [KubeError(404, "deleted meanwhile")]
    result = migrate_crd(server, CRD)
    assert result.rewritten == ["team/a", "team/gone"] and result.done
    assert [m for m, p in server.calls if p.endswith("/a")] == ["PUT", "GET", "PUT"]


def test_an_object_that_cannot_be_rewritten_keeps_the_older_version_listed():
    server = FakeServer(["a", "bad"])
    server.fail["bad"] = [KubeError(422, "spec.job.image: Invalid value")]
    result = migrate_crd(server, CRD)
    assert result.rewritten == ["team/a"] and result.failed == ["team/bad: spec.job.image: Invalid value"]
    assert not result.done and server.crd["status"]["storedVersions"] == ["v1alpha1", "v1beta1"]
    assert "PATCH" not in [m for m, _ in server.calls]
    assert "run `kubectl eos migrate-storage` again" in result.summary()


def test_nothing_to_do_when_only_the_storage_version_is_stored():
    server = FakeServer(["a"], stored=("v1beta1",))
    result = migrate_crd(server, CRD)
    assert result.done and result.rewritten == [] and [m for m, _ in server.calls] == ["GET"]
    assert "nothing to do" in result.summary()


def test_refused_until_the_new_crds_are_applied():
    with pytest.raises(MigrationRefused, match="stores v1alpha1, not v1beta1: apply the new CRDs"):
        migrate_crd(FakeServer(["a"], stored=("v1alpha1",), storage="v1alpha1"), CRD)

    def missing(method, path, *a, **kw):
        raise KubeError(404, "not found")
    with pytest.raises(MigrationRefused, match="is not installed"):
        migrate_storage(missing)


def test_the_plugin_has_the_command():
    args = parser().parse_args(["migrate-storage"])
    assert (args.command, args.crds) == ("migrate-storage", None)   # None: both of the project's CRDs
    assert parser().parse_args(["migrate-storage", "--crd", "a", "--crd", "b"]).crds == ["a", "b"]


def test_the_operator_refuses_to_start_on_crds_older_than_it():
    """`helm upgrade` alone leaves the old CRDs (Helm never upgrades crds/): the operator would watch v1beta1 and
    see nothing. It says what to apply instead; no CRD at all is left to kopf, which waits for it."""
    from eos_operator.cli import older_crds

    def serving(*versions):
        return lambda method, path, *a, **kw: {"versions": [{"version": v} for v in versions]}
    why = older_crds(serving("v1alpha1"))
    assert why and "serves streaming.eos.dev v1alpha1, not v1beta1" in why
    assert "kubectl apply --server-side -f charts/spark-eos-operator/crds/" in why and "migrate-storage" in why
    assert older_crds(serving("v1beta1", "v1alpha1")) is None

    def absent(method, path, *a, **kw):
        raise KubeError(404, "not found")
    assert older_crds(absent) is None
