"""One ExactlyOnceSnapshot: observe -> plan -> write status -> act.

Level-based like reconciler.py: the snapshot, its stream and its Pods are read
afresh on every pass; the status (the write-ahead log: attempt counter, Pod name,
path) is written with the observed resourceVersion *before* a Pod is created or
deleted, so a stale view is refused with a 409 and observed again, and an
operator killed between the two finds the same Pod name recorded.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

from eos_job.spec import ExactlyOnceSnapshotStatus, SnapshotSpec

from .adapters import Clock, Conflict, Kube
from .planner import CreatePod, DeletePod, Event
from .snapshots import (POLL_SECONDS, SnapshotObserved, SnapshotPlan, SnapshotRef, parse_snapshot_spec,
                        parse_snapshot_status, plan_snapshot, snapshot_pod_view, snapshot_selector)

log = logging.getLogger(__name__)


class SnapshotDeps(Protocol):
    """The part of reconciler.Deps a snapshot needs."""
    kube: Kube
    clock: Clock


@dataclass(frozen=True)
class SnapshotOutcome:
    exists: bool
    state: str | None = None
    requeue_after: float | None = None
    finished: bool = True          # deletion: the finalizer may go


def dump_status(status: ExactlyOnceSnapshotStatus) -> dict[str, Any]:
    # None values stay in: in a merge patch they remove the field.
    return status.model_dump(by_alias=True, mode="json")


async def observe(obj: dict[str, Any], spec: SnapshotSpec | Any, deps: SnapshotDeps) -> SnapshotObserved:
    meta = obj.get("metadata") or {}
    name, namespace = meta["name"], meta.get("namespace", "default")
    stream = await deps.kube.get_stream(namespace, spec.stream) if isinstance(spec, SnapshotSpec) else None
    raw_pods = await deps.kube.list_pods(namespace, snapshot_selector(name))
    pods = tuple(sorted((snapshot_pod_view(p) for p in raw_pods), key=lambda p: p.name))
    return SnapshotObserved(name=name, namespace=namespace, uid=meta.get("uid", ""),
                            generation=int(meta.get("generation") or 0), now=deps.clock.now(), stream=stream,
                            pods=pods, deleting=bool(meta.get("deletionTimestamp")))


async def reconcile_snapshot(namespace: str, name: str, deps: SnapshotDeps, *, max_steps: int = 6) -> SnapshotOutcome:
    """Drive one snapshot a step towards Completed (or its disposal, when deleted). Safe to call at any time,
    concurrently with nothing else for the same snapshot (the kopf layer holds a per-object lock)."""
    plan: SnapshotPlan | None = None
    for _ in range(max_steps):
        obj = await deps.kube.get_snapshot(namespace, name)
        if obj is None:
            return SnapshotOutcome(exists=False)
        meta = obj["metadata"]
        status = parse_snapshot_status(obj.get("status"))
        spec = parse_snapshot_spec(obj.get("spec"))
        observed = await observe(obj, spec, deps)
        plan = plan_snapshot(spec, status, observed)
        log.debug("snapshot %s/%s: %s", namespace, name, plan.summary())
        try:
            if plan.status != status:
                await deps.kube.patch_snapshot_status(namespace, name, dump_status(plan.status),
                                                      meta.get("resourceVersion"))
        except Conflict:
            log.info("snapshot %s/%s changed while planning; observing again", namespace, name)
            continue
        ref = SnapshotRef(name, namespace, meta.get("uid", ""))
        await _post_events(deps, ref, plan.events)
        for action in plan.actions:
            await _act(deps, namespace, action)
        return SnapshotOutcome(True, plan.status.state, plan.requeue_after, plan.finished)
    return SnapshotOutcome(True, plan.status.state if plan else None, POLL_SECONDS,
                           plan.finished if plan else True)


async def _post_events(deps: SnapshotDeps, ref: SnapshotRef, events: list[Event]) -> None:
    for ev in events:
        (log.warning if ev.type == "Warning" else log.info)("snapshot %s/%s %s: %s", ref.namespace, ref.name,
                                                            ev.reason, ev.message)
        await deps.kube.post_event(ref, ev.type, ev.reason, ev.message)


async def _act(deps: SnapshotDeps, namespace: str, action: CreatePod | DeletePod) -> None:
    if isinstance(action, CreatePod):
        await deps.kube.create_pod(namespace, action.body)
    elif isinstance(action, DeletePod):
        await deps.kube.delete_pod(namespace, action.name, action.grace_seconds)
    else:  # pragma: no cover - the planner makes only these
        raise TypeError(f"unknown action {action!r}")
