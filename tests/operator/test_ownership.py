"""The operator never replaces or deletes an object it does not own, though it finds its children by name.

Reconciles over FakeKube, which applies kube_api's ownership rules; and the request shapes of
KubernetesApi itself (uid precondition on delete, NameTaken on a 409 over a foreign object) with a
recording client, no server. tests/stack/test_kube_ownership.py checks the same against a real API server.
"""
from __future__ import annotations

import asyncio
import json

import pytest

from eos_operator.adapters import KubernetesApi, NameTaken

from .fakes import FakeKube
from .test_reconciler import make, rec, status

OTHER = "9d9d9d9d-0000-0000-0000-000000000000"


def refused_launch(kube, deps) -> str:
    """Reconcile a launch that meets a foreign object: the NameTaken message, recorded in status as the
    launch's refusal, or raised (kopf retries) if the reconciler does not record a 409 as a refusal."""
    try:
        rec(deps)
    except NameTaken as exc:
        return exc.message
    return status(kube)["pendingLaunch"]["refused"]


def test_deleting_a_stream_leaves_objects_of_its_children_names_that_it_does_not_own():
    kube, resolver, clock, deps = make()
    rec(deps)
    assert ("default", "colors-run") in kube.config_maps          # the stream's own
    drain = kube.add_foreign("ConfigMap", "colors-drain", owner_uid=OTHER)
    service = kube.add_foreign("Service", "colors-driver")      # no owner at all
    kube.mark_stream_deleted("colors")
    rec(deps)
    kube.finish_deletions()
    out = rec(deps)
    assert out.finished
    assert ("default", "colors-run") not in kube.config_maps
    assert kube.config_maps[("default", "colors-drain")] is drain
    assert kube.services[("default", "colors-driver")] is service
    assert sorted(kube.kept) == [("ConfigMap", "colors-drain"), ("Service", "colors-driver")]


def test_a_foreign_config_map_of_the_run_config_name_is_refused_not_replaced():
    kube, resolver, clock, deps = make()
    foreign = kube.add_foreign("ConfigMap", "colors-run", owner_uid=OTHER)
    foreign["data"] = {"theirs": "yes"}
    refused = refused_launch(kube, deps)
    assert kube.config_maps[("default", "colors-run")]["data"] == {"theirs": "yes"}
    assert kube.created_pods == []                                  # the ConfigMap comes before the Pod
    assert "ConfigMap default/colors-run already exists and belongs to ConfigMap someone-else " \
           f"(uid {OTHER})" in refused and "delete or rename it" in refused, refused
    # Its owner removes it: the launch goes on after the pause, resolved once.
    del kube.config_maps[("default", "colors-run")]
    clock.advance(31)
    rec(deps)
    assert kube.created_pods == ["colors-driver-0"] and len(resolver.calls) == 1
    assert kube.config_maps[("default", "colors-run")]["metadata"]["ownerReferences"][0]["uid"] == \
        kube.stream("colors")["metadata"]["uid"]


def test_a_foreign_pod_of_the_driver_name_is_refused_and_left_alone():
    kube, resolver, clock, deps = make()
    foreign = kube.add_foreign("Pod", "colors-driver-0")          # no stream labels: not observed as a driver
    refused = refused_launch(kube, deps)
    assert kube.pods[("default", "colors-driver-0")] is foreign and kube.created_pods == []
    assert "Pod default/colors-driver-0 already exists and belongs to no owner" in refused, refused


def test_an_owned_object_is_replaced_and_a_repeated_create_is_success():
    kube, resolver, clock, deps = make()
    rec(deps)
    rec(deps)                                                       # idempotent: no NameTaken over our own
    assert kube.created_pods == ["colors-driver-0"] and "Refused" not in kube.reasons()


def test_the_fake_applies_the_same_rules_to_a_pod_delete_with_an_owner():
    kube = FakeKube()
    kube.add_foreign("Pod", "p", owner_uid=OTHER)
    asyncio.run(kube.delete_pod("default", "p", 0, owner_uid="mine"))
    assert ("default", "p") in kube.pods and kube.kept == [("Pod", "p")]
    asyncio.run(kube.delete_pod("default", "p", 0, owner_uid=OTHER))
    assert ("default", "p") not in kube.pods
    kube.add_foreign("ConfigMap", "c", owner_uid=OTHER)
    with pytest.raises(NameTaken):
        asyncio.run(kube.apply_config_map("default", {"kind": "ConfigMap", "metadata": {
            "name": "c", "ownerReferences": [{"uid": "mine"}]}}))


# ------------------------------------------------------- KubernetesApi, no server
class _Response:
    def __init__(self, status: int, body: dict | None):
        self.status, self.data = status, json.dumps(body).encode() if body is not None else b""

    def read(self) -> None:
        pass


class _Server:
    """Answers KubernetesApi's requests from a table of (method, path prefix) -> (status, body)."""

    def __init__(self, answers: dict[tuple[str, str], tuple[int, dict | None]]):
        self.answers, self.requests = answers, []

    def param_serialize(self, method, resource_path, query_params, header_params, body, auth_settings):
        return method, resource_path, header_params, body, []

    def call_api(self, method, url, header_params, body, post_params, _request_timeout):
        self.requests.append((method, url, body))
        return _Response(*self.answers.get((method, url), (200, {})))


CM = "/api/v1/namespaces/ns/configmaps"


def cm(owner: str | None, uid: str = "cm-uid") -> dict:
    meta: dict = {"name": "s-run", "namespace": "ns", "uid": uid, "resourceVersion": "3"}
    if owner:
        meta["ownerReferences"] = [{"kind": "ExactlyOnceStream", "name": "s", "uid": owner, "controller": True}]
    return {"kind": "ConfigMap", "metadata": meta}


def test_delete_config_map_checks_the_owner_and_sends_a_uid_precondition():
    server = _Server({("GET", f"{CM}/s-run"): (200, cm("stream-uid"))})
    asyncio.run(KubernetesApi(server).delete_config_map("ns", "s-run", "stream-uid"))
    method, url, body = server.requests[-1]
    assert (method, url) == ("DELETE", f"{CM}/s-run") and body["preconditions"] == {"uid": "cm-uid"}

    server = _Server({("GET", f"{CM}/s-run"): (200, cm("someone-else"))})
    asyncio.run(KubernetesApi(server).delete_config_map("ns", "s-run", "stream-uid"))
    assert [m for m, _, _ in server.requests] == ["GET"]            # not ours: no DELETE

    # Replaced between the read and the delete: the precondition's 409 leaves the new one.
    server = _Server({("GET", f"{CM}/s-run"): (200, cm("stream-uid")),
                      ("DELETE", f"{CM}/s-run"): (409, {"message": "Precondition failed: UID in precondition"})})
    asyncio.run(KubernetesApi(server).delete_config_map("ns", "s-run", "stream-uid"))


def test_apply_over_a_foreign_object_raises_name_taken_and_never_puts():
    body = {"kind": "ConfigMap", "metadata": {"name": "s-run", "ownerReferences": [{"uid": "stream-uid"}]}}
    server = _Server({("POST", CM): (409, {"message": "already exists"}), ("GET", f"{CM}/s-run"): (200, cm(None))})
    with pytest.raises(NameTaken) as err:
        asyncio.run(KubernetesApi(server).apply_config_map("ns", body))
    assert err.value.status == 409 and "PUT" not in [m for m, _, _ in server.requests]
    assert err.value.message == ("ConfigMap ns/s-run already exists and belongs to no owner, not to uid stream-uid: "
                                 "delete or rename it; the operator never replaces an object it does not own")
    server = _Server({("POST", CM): (409, {"message": "already exists"}),
                      ("GET", f"{CM}/s-run"): (200, cm("stream-uid"))})
    asyncio.run(KubernetesApi(server).apply_config_map("ns", body))
    assert server.requests[-1][0] == "PUT"                          # ours: replaced


def test_create_pod_409_is_success_only_over_our_own_pod():
    pods = "/api/v1/namespaces/ns/pods"
    body = {"kind": "Pod", "metadata": {"name": "s-driver-0", "ownerReferences": [{"uid": "stream-uid"}]}}
    for owner, ok in (("stream-uid", True), ("other", False)):
        server = _Server({("POST", pods): (409, {"message": "already exists"}),
                          ("GET", pods): (200, {"items": [cm(owner)]})})
        if ok:
            asyncio.run(KubernetesApi(server).create_pod("ns", body))
        else:
            with pytest.raises(NameTaken, match="belongs to ExactlyOnceStream s \\(uid other\\)"):
                asyncio.run(KubernetesApi(server).create_pod("ns", body))
    # A Pod without an owner (a snapshot's dispose Pod): 409 is success, nothing read.
    server = _Server({("POST", pods): (409, {"message": "already exists"})})
    asyncio.run(KubernetesApi(server).create_pod("ns", {"kind": "Pod", "metadata": {"name": "d"}}))
    assert [m for m, _, _ in server.requests] == ["POST"]
