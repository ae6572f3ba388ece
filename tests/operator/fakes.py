"""In-memory fakes of the operator's adapters, with switches that inject faults.

``FakeKube`` keeps streams, snapshots, Pods, ConfigMaps, Services and events in
dicts and behaves like the API server where the operator depends on it:
resourceVersion preconditions on status patches (409), AlreadyExists on create
(409), deletion with a grace period (a Pod with a deletionTimestamp lingers until
the test "kubelet" finishes it), finalizers holding a deleted object, label
selection of Pods and snapshots, and the garbage collector removing the Pods an
object owns once it is gone (``collect_garbage``). Ownership as kube_api checks it:
a create or apply over an object of another owner raises NameTaken, a delete with
an owner uid leaves an object that uid does not own (recorded in ``kept``). The clock, resolver and
progress fakes are in fake_adapters.py.
"""
from __future__ import annotations

import copy
import itertools
import uuid
from datetime import datetime
from typing import Any

from eos_operator.adapters import Conflict, KubeError, event_kind
from eos_operator.kube_api import owner_uids, refuse_unless_ours
from eos_operator.timeutil import fmt

# The other adapters' fakes, importable from here as before.
from .fake_adapters import T0, Crash, FakeClock, FakeProgress, FakeResolver  # noqa: F401


class FakeKube:
    def __init__(self) -> None:
        self.streams: dict[tuple[str, str], dict[str, Any]] = {}
        self.snapshots: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.config_maps: dict[tuple[str, str], dict[str, Any]] = {}
        self.services: dict[tuple[str, str], dict[str, Any]] = {}
        self.secrets: dict[tuple[str, str], dict[str, Any]] = {}
        self.secret_reads: list[tuple[str, str]] = []
        self.nodes: dict[str, dict[str, Any]] = {}             # Node objects by name (get_node)
        self.node_reads: list[str] = []
        self.events: list[tuple[str, str, str, str]] = []   # (object name, type, reason, message)
        self.event_kinds: list[str] = []                      # involvedObject kind of each of self.events
        self.created_pods: list[str] = []
        self.deleted_pods: list[tuple[str, int]] = []
        self.kept: list[tuple[str, str]] = []   # (kind, name) a delete left: not owned by the uid it named
        self._rv = itertools.count(1)
        # fault switches
        self.conflict_next_status_patch = 0
        self.conflict_next_snapshot_patch = 0
        self.fail_create_pod = 0
        self.fail_create_status = 500          # 403: the API server refuses the Pod (Pod Security, quota)
        self.fail_create_message = "injected create failure"   # what the API server says (KubeError.message)
        self.crash_after_create_pod = False
        self.crash_after_status_patch_containing: str | None = None
        self.max_alive_drivers = 0
        self.fail_apply_service = 0            # the next n Service applies are refused (403)

    # -- test helpers ---------------------------------------------------------
    def _bump(self, obj: dict[str, Any]) -> None:
        obj["metadata"]["resourceVersion"] = str(next(self._rv))

    def add_stream(self, name: str, spec: dict[str, Any], namespace: str = "default") -> dict[str, Any]:
        obj = {"apiVersion": "streaming.eos.dev/v1beta1", "kind": "ExactlyOnceStream",
               "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()), "generation": 1},
               "spec": copy.deepcopy(spec)}
        self._bump(obj)
        self.streams[(namespace, name)] = obj
        return obj

    def stream(self, name: str, namespace: str = "default") -> dict[str, Any]:
        return self.streams[(namespace, name)]

    def update_spec(self, name: str, mutate, namespace: str = "default") -> None:
        obj = self.streams[(namespace, name)]
        mutate(obj["spec"])
        obj["metadata"]["generation"] += 1
        self._bump(obj)

    def mark_stream_deleted(self, name: str, namespace: str = "default") -> None:
        obj = self.streams[(namespace, name)]
        obj["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"
        self._bump(obj)

    def set_pod_phase(self, name: str, phase: str, *, exit_code: int | None = None, message: str | None = None,
                      namespace: str = "default") -> None:
        pod = self.pods[(namespace, name)]
        status: dict[str, Any] = {"phase": phase}
        if phase in ("Failed", "Succeeded"):
            status["containerStatuses"] = [{"name": "driver", "state": {"terminated": {
                "exitCode": exit_code if exit_code is not None else (0 if phase == "Succeeded" else 1),
                "reason": "Completed" if phase == "Succeeded" else "Error", "message": message}}}]
        elif phase == "Running":
            status["containerStatuses"] = [{"name": "driver", "state": {"running": {"startedAt": "x"}}}]
        pod["status"] = status
        self._bump(pod)

    def finish_deletions(self) -> None:
        """The kubelet confirms every pending Pod deletion."""
        for key in [k for k, p in self.pods.items() if p["metadata"].get("deletionTimestamp")]:
            del self.pods[key]

    def driver_pods(self, namespace: str, stream: str) -> list[dict[str, Any]]:
        # As children.stream_selector: the stream's *driver* Pods (its snapshot Pods carry the stream label too).
        return [p for (ns, _), p in self.pods.items() if ns == namespace
                and p["metadata"].get("labels", {}).get("streaming.eos.dev/stream") == stream
                and p["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "driver"]

    def alive_drivers(self, namespace: str, stream: str) -> list[str]:
        return [p["metadata"]["name"] for p in self.driver_pods(namespace, stream)
                if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]

    def reasons(self) -> list[str]:
        return [r for (_, _, r, _) in self.events]

    def reasons_for(self, kind: str, name: str | None = None) -> list[str]:
        return [r for k, (n, _, r, _) in zip(self.event_kinds, self.events) if k == kind and name in (None, n)]

    def messages_for(self, kind: str, reason: str) -> list[str]:
        return [m for k, (_, _, r, m) in zip(self.event_kinds, self.events) if k == kind and r == reason]

    # -- snapshots, test side -------------------------------------------------
    def add_snapshot(self, body: dict[str, Any], *, finalizer: bool = True) -> dict[str, Any]:
        """As kubectl apply, then kopf adding its finalizer."""
        obj = copy.deepcopy(body)
        meta = obj["metadata"]
        meta.setdefault("namespace", "default")
        meta.update(uid=str(uuid.uuid4()), generation=1)
        if finalizer:
            meta["finalizers"] = ["streaming.eos.dev/finalizer"]
        self._bump(obj)
        self.snapshots[(meta["namespace"], meta["name"])] = obj
        return obj

    def snapshot(self, name: str, namespace: str = "default") -> dict[str, Any]:
        return self.snapshots[(namespace, name)]

    def snapshot_status(self, name: str, namespace: str = "default") -> dict[str, Any]:
        return self.snapshots[(namespace, name)].get("status") or {}

    def release_finalizers(self, name: str, namespace: str = "default") -> None:
        """kopf removes its finalizer: a deleted snapshot goes, and the Pods it owns after it."""
        obj = self.snapshots[(namespace, name)]
        obj["metadata"]["finalizers"] = []
        if obj["metadata"].get("deletionTimestamp"):
            del self.snapshots[(namespace, name)]
            self.collect_garbage()

    def collect_garbage(self) -> None:
        """The garbage collector: Pods whose controlling owner no longer exists go."""
        alive = {o["metadata"]["uid"] for o in [*self.streams.values(), *self.snapshots.values()]}
        for key, pod in list(self.pods.items()):
            owners = [o["uid"] for o in pod["metadata"].get("ownerReferences") or []]
            if owners and not any(uid in alive for uid in owners):
                del self.pods[key]

    def set_snapshot_pod(self, name: str, phase: str, *, exit_code: int | None = None, message: str | None = None,
                         finished_at: str = "2026-01-01T12:00:00Z", namespace: str = "default") -> None:
        """The kubelet's view of a snapshot Pod (container "snapshot")."""
        pod = self.pods[(namespace, name)]
        status: dict[str, Any] = {"phase": phase}
        if phase in ("Failed", "Succeeded"):
            term = {"exitCode": exit_code if exit_code is not None else (0 if phase == "Succeeded" else 1),
                    "reason": "Completed" if phase == "Succeeded" else "Error", "finishedAt": finished_at}
            if message is not None:
                term["message"] = message
            status["containerStatuses"] = [{"name": "snapshot", "state": {"terminated": term}}]
        pod["status"] = status
        self._bump(pod)

    def block_pod(self, name: str, reason: str, message: str, *, created_at: datetime = T0,
                  namespace: str = "default") -> None:
        """The Pod (created at ``created_at``) cannot start: reason Unschedulable is the scheduler's PodScheduled
        condition, any other (ErrImagePull, CreateContainerConfigError, ...) its container's waiting reason."""
        pod = self.pods[(namespace, name)]
        pod["metadata"]["creationTimestamp"] = fmt(created_at)
        if reason == "Unschedulable":
            pod["status"] = {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": reason, "message": message}]}
        else:
            container = pod["spec"]["containers"][0]["name"]
            pod["status"] = {"phase": "Pending", "containerStatuses": [
                {"name": container, "state": {"waiting": {"reason": reason, "message": message}}}]}
        self._bump(pod)

    def add_foreign(self, kind: str, name: str, owner_uid: str | None = None,
                    namespace: str = "default") -> dict[str, Any]:
        """An object someone else made ("Pod", "ConfigMap" or "Service"), owned by ``owner_uid`` (or by nothing)."""
        meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()), "labels": {}}
        if owner_uid is not None:
            meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap", "name": "someone-else",
                                        "uid": owner_uid, "controller": True}]
        obj: dict[str, Any] = {"apiVersion": "v1", "kind": kind, "metadata": meta}
        if kind == "Pod":
            obj["status"] = {"phase": "Running"}
        self._bump(obj)
        self._store(kind)[(namespace, name)] = obj
        return obj

    def _store(self, kind: str) -> dict[tuple[str, str], dict[str, Any]]:
        return {"Pod": self.pods, "ConfigMap": self.config_maps, "Service": self.services}[kind]

    def _owned_by(self, kind: str, namespace: str, name: str, owner_uid: str | None) -> dict[str, Any] | None:
        """The object to delete: None if absent, or if ``owner_uid`` is given and does not own it (kept)."""
        obj = self._store(kind).get((namespace, name))
        if obj is not None and owner_uid is not None and owner_uid not in owner_uids(obj):
            self.kept.append((kind, name))
            return None
        return obj

    def _apply(self, kind: str, namespace: str, body: dict[str, Any]) -> None:
        key = (namespace, body["metadata"]["name"])
        current = self._store(kind).get(key)
        if current is not None:
            refuse_unless_ours(kind, namespace, body, current)
        self._store(kind)[key] = copy.deepcopy(body)

    def pods_labelled(self, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        return [p for (ns, _), p in self.pods.items() if ns == namespace
                and all(p["metadata"].get("labels", {}).get(k) == v for k, v in labels.items())]

    # -- the Kube protocol ----------------------------------------------------
    async def list_streams(self, namespace: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(o) for (ns, _), o in sorted(self.streams.items()) if ns == namespace]

    async def get_stream(self, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self.streams.get((namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    async def patch_stream_status(self, namespace: str, name: str, status: dict[str, Any],
                                  resource_version: str | None) -> dict[str, Any]:
        obj = self.streams.get((namespace, name))
        if obj is None:
            raise KubeError(404, "not found")
        if self.conflict_next_status_patch > 0:
            self.conflict_next_status_patch -= 1
            self._bump(obj)  # someone else wrote meanwhile
            raise Conflict(409, "the object has been modified")
        self._merge_status(obj, status, resource_version)
        marker = self.crash_after_status_patch_containing
        if marker and marker in repr(status):
            self.crash_after_status_patch_containing = None
            raise Crash(f"operator killed after writing status with {marker}")
        return copy.deepcopy(obj)

    def _merge_status(self, obj: dict[str, Any], status: dict[str, Any], resource_version: str | None) -> None:
        """A status merge patch with a resourceVersion precondition, as the API server does it."""
        if resource_version is not None and resource_version != obj["metadata"]["resourceVersion"]:
            raise Conflict(409, "the object has been modified")
        merged = dict(obj.get("status") or {})
        for k, v in status.items():
            if v is None:
                merged.pop(k, None)
            else:
                merged[k] = copy.deepcopy(v)
        obj["status"] = merged
        self._bump(obj)

    async def get_node(self, name: str) -> dict[str, Any] | None:
        self.node_reads.append(name)
        return copy.deepcopy(self.nodes.get(name))

    async def list_driver_pods(self, namespace: str, stream: str) -> list[dict[str, Any]]:
        return copy.deepcopy(self.driver_pods(namespace, stream))

    async def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.secret_reads.append((namespace, name))
        return copy.deepcopy(self.secrets.get((namespace, name)))

    async def list_pods(self, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        return copy.deepcopy(self.pods_labelled(namespace, labels))

    async def list_snapshots(self, namespace: str, stream: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(o) for (ns, _), o in sorted(self.snapshots.items()) if ns == namespace
                and o["metadata"].get("labels", {}).get("streaming.eos.dev/stream") == stream]

    async def get_snapshot(self, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self.snapshots.get((namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    async def create_snapshot(self, namespace: str, body: dict[str, Any]) -> None:
        if (namespace, body["metadata"]["name"]) in self.snapshots:
            return  # 409 AlreadyExists counts as success
        self.add_snapshot({**body, "metadata": {**body["metadata"], "namespace": namespace}})

    async def delete_snapshot(self, namespace: str, name: str) -> None:
        obj = self.snapshots.get((namespace, name))
        if obj is None:
            return  # 404 counts as success
        if obj["metadata"].get("finalizers"):
            obj["metadata"].setdefault("deletionTimestamp", "2026-01-01T12:00:00Z")
            self._bump(obj)
            return
        del self.snapshots[(namespace, name)]
        self.collect_garbage()

    async def patch_snapshot_status(self, namespace: str, name: str, status: dict[str, Any],
                                    resource_version: str | None) -> dict[str, Any]:
        obj = self.snapshots.get((namespace, name))
        if obj is None:
            raise KubeError(404, "not found")
        if self.conflict_next_snapshot_patch > 0:
            self.conflict_next_snapshot_patch -= 1
            self._bump(obj)
            raise Conflict(409, "the object has been modified")
        self._merge_status(obj, status, resource_version)
        return copy.deepcopy(obj)

    async def create_pod(self, namespace: str, body: dict[str, Any]) -> None:
        if self.fail_create_pod > 0:
            self.fail_create_pod -= 1
            raise KubeError(self.fail_create_status, self.fail_create_message)
        key = (namespace, body["metadata"]["name"])
        if key in self.pods:
            refuse_unless_ours("Pod", namespace, body, self.pods[key])
            return  # 409 AlreadyExists over our own Pod counts as success
        pod = copy.deepcopy(body)
        pod["metadata"]["uid"] = str(uuid.uuid4())
        pod["status"] = {"phase": "Pending"}
        self._bump(pod)
        self.pods[key] = pod
        self.created_pods.append(key[1])
        stream = body["metadata"]["labels"]["streaming.eos.dev/stream"]
        self.max_alive_drivers = max(self.max_alive_drivers, len(self.alive_drivers(namespace, stream)))
        if self.crash_after_create_pod:
            self.crash_after_create_pod = False
            raise Crash("operator killed right after creating the Pod")

    async def delete_pod(self, namespace: str, name: str, grace_seconds: int, owner_uid: str | None = None) -> None:
        pod = self._owned_by("Pod", namespace, name, owner_uid)
        if pod is None:
            return
        self.deleted_pods.append((name, grace_seconds))
        if grace_seconds == 0 or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            del self.pods[(namespace, name)]
            return
        pod["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"
        self._bump(pod)

    async def apply_config_map(self, namespace: str, body: dict[str, Any]) -> None:
        self._apply("ConfigMap", namespace, body)

    async def apply_service(self, namespace: str, body: dict[str, Any]) -> None:
        if self.fail_apply_service:
            self.fail_apply_service -= 1
            raise KubeError(403, "services is forbidden: injected")
        self._apply("Service", namespace, body)

    async def get_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.services.get((namespace, name))

    async def delete_config_map(self, namespace: str, name: str, owner_uid: str) -> None:
        if self._owned_by("ConfigMap", namespace, name, owner_uid) is not None:
            del self.config_maps[(namespace, name)]

    async def delete_service(self, namespace: str, name: str, owner_uid: str) -> None:
        if self._owned_by("Service", namespace, name, owner_uid) is not None:
            del self.services[(namespace, name)]

    async def post_event(self, ref: Any, type_: str, reason: str, message: str, *,
                         kind: str | None = None) -> None:
        self.events.append((ref.name, type_, reason, message))
        self.event_kinds.append(event_kind(ref, kind))


def base_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "job": {"module": "tests.e2e.jobs.sleeper", "parallelism": 2},
        "source": {"bootstrapServers": "localhost:9092", "topics": ["in"]},
        "sink": {"bootstrapServers": "localhost:9092", "topic": "out"},
        "checkpoint": {"store": "local", "path": "/tmp/eos-test"},
        "restartStrategy": {"type": "fixed-delay", "fixedDelay": {"attempts": 2, "delaySeconds": 10}},
    }
    for key, value in overrides.items():
        spec[key] = value
    return spec
