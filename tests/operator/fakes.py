"""In-memory fakes of the operator's adapters, with switches that inject faults.

``FakeKube`` keeps streams, Pods, ConfigMaps, Services and events in dicts and
behaves like the API server where the operator depends on it: resourceVersion
preconditions on status patches (409), AlreadyExists on create (409), deletion
with a grace period (a Pod with a deletionTimestamp lingers until the test
"kubelet" finishes it), label selection of driver Pods.
"""
from __future__ import annotations

import copy
import itertools
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from eos_job.spec import ResolutionReport, RunConfig
from eos_operator.adapters import Conflict, KubeError
from eos_operator.children import StreamRef

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)


class Crash(BaseException):
    """Simulates the operator process dying at an injected point (not an Exception: nothing catches it)."""


class FakeClock:
    def __init__(self, start: datetime = T0):
        self.t = start

    def now(self) -> datetime:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += timedelta(seconds=seconds)


@dataclass
class FakeResolver:
    calls: list[RunConfig] = field(default_factory=list)
    fail_next: int = 0                 # the next N calls raise
    error: str = "KafkaException: sink unreachable"
    crash_after: bool = False          # the operator dies right after resolution returns
    kube: "FakeKube | None" = None     # to assert invariants at resolution time

    async def resolve(self, config: RunConfig) -> ResolutionReport:
        self.calls.append(config)
        if self.kube is not None:
            alive = [p for p in self.kube.driver_pods(config.stream.namespace, config.stream.name)]
            assert not alive, f"resolution ran while driver Pods exist: {[p['metadata']['name'] for p in alive]}"
        if self.fail_next > 0:
            self.fail_next -= 1
            raise RuntimeError(self.error)
        report = ResolutionReport(stream_uid=config.stream.uid, generation=config.stream.generation,
                                  slots=config.spec.job.parallelism,
                                  fenced_transactional_ids=config.spec.job.parallelism,
                                  last_complete_batch=len(self.calls) - 1, summary=f"resolution #{len(self.calls)}")
        if self.crash_after:
            self.crash_after = False
            raise Crash("operator killed after resolution")
        return report


@dataclass
class FakeProgress:
    batch: int | None = None
    calls: int = 0

    async def last_committed_batch(self, config: RunConfig) -> int | None:
        self.calls += 1
        return self.batch


class FakeKube:
    def __init__(self) -> None:
        self.streams: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.config_maps: dict[tuple[str, str], dict[str, Any]] = {}
        self.services: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: list[tuple[str, str, str, str]] = []   # (stream, type, reason, message)
        self.created_pods: list[str] = []
        self.deleted_pods: list[tuple[str, int]] = []
        self._rv = itertools.count(1)
        # fault switches
        self.conflict_next_status_patch = 0
        self.fail_create_pod = 0
        self.crash_after_create_pod = False
        self.crash_after_status_patch_containing: str | None = None
        self.max_alive_drivers = 0

    # -- test helpers ---------------------------------------------------------
    def _bump(self, obj: dict[str, Any]) -> None:
        obj["metadata"]["resourceVersion"] = str(next(self._rv))

    def add_stream(self, name: str, spec: dict[str, Any], namespace: str = "default") -> dict[str, Any]:
        obj = {"apiVersion": "streaming.eos.dev/v1alpha1", "kind": "ExactlyOnceStream",
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
        return [p for (ns, _), p in self.pods.items() if ns == namespace
                and p["metadata"].get("labels", {}).get("streaming.eos.dev/stream") == stream]

    def alive_drivers(self, namespace: str, stream: str) -> list[str]:
        return [p["metadata"]["name"] for p in self.driver_pods(namespace, stream)
                if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]

    def reasons(self) -> list[str]:
        return [r for (_, _, r, _) in self.events]

    # -- the Kube protocol ----------------------------------------------------
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
        marker = self.crash_after_status_patch_containing
        if marker and marker in repr(status):
            self.crash_after_status_patch_containing = None
            raise Crash(f"operator killed after writing status with {marker}")
        return copy.deepcopy(obj)

    async def list_driver_pods(self, namespace: str, stream: str) -> list[dict[str, Any]]:
        return copy.deepcopy(self.driver_pods(namespace, stream))

    async def create_pod(self, namespace: str, body: dict[str, Any]) -> None:
        if self.fail_create_pod > 0:
            self.fail_create_pod -= 1
            raise KubeError(500, "injected create failure")
        key = (namespace, body["metadata"]["name"])
        if key in self.pods:
            return  # 409 AlreadyExists counts as success
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

    async def delete_pod(self, namespace: str, name: str, grace_seconds: int) -> None:
        pod = self.pods.get((namespace, name))
        if pod is None:
            return
        self.deleted_pods.append((name, grace_seconds))
        if grace_seconds == 0 or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            del self.pods[(namespace, name)]
            return
        pod["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"
        self._bump(pod)

    async def apply_config_map(self, namespace: str, body: dict[str, Any]) -> None:
        self.config_maps[(namespace, body["metadata"]["name"])] = copy.deepcopy(body)

    async def apply_service(self, namespace: str, body: dict[str, Any]) -> None:
        self.services[(namespace, body["metadata"]["name"])] = copy.deepcopy(body)

    async def delete_config_map(self, namespace: str, name: str) -> None:
        self.config_maps.pop((namespace, name), None)

    async def delete_service(self, namespace: str, name: str) -> None:
        self.services.pop((namespace, name), None)

    async def post_event(self, ref: StreamRef, type_: str, reason: str, message: str) -> None:
        self.events.append((ref.name, type_, reason, message))


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
