"""One ExactlyOnceSnapshot's pass of the reconcile loop (loop.py): observe -> plan -> write status -> act.

The snapshot, its stream and its Pods are read afresh on every pass; the status (the write-ahead log:
attempt counter, Pod name, path) is written with the observed resourceVersion *before* a Pod is
created or deleted, so a stale view is refused with a 409 and observed again, and an operator killed
between the two finds the same Pod name recorded. A Pod create the API server refuses for good (403, 422, a
name someone else's object holds) is written to status and an event (snapshot_step.record_refusal) and tried
again later, as a stream's is.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Protocol

from eos_job.log_format import log_context
from eos_job.snapshot_resource import SnapshotSpec

from .actions import Plan
from .adapters import Clock, Conflict, Kube, KubeError
from .loop import act, converge, dump_status, post_events, write_first
from .snapshot_planner import plan_snapshot
from .snapshot_step import record_refusal
from .observed import pod_view
from .snapshots import (POLL_SECONDS, SnapshotObserved, SnapshotRef, parse_snapshot_spec, parse_snapshot_status,
                        snapshot_selector)
from .start_failures import REFUSED_RETRY_SECONDS, refused_object

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


async def observe(obj: dict[str, Any], spec: SnapshotSpec | Any, deps: SnapshotDeps) -> SnapshotObserved:
    meta = obj.get("metadata") or {}
    name, namespace = meta["name"], meta.get("namespace", "default")
    stream = await deps.kube.get_stream(namespace, spec.stream) if isinstance(spec, SnapshotSpec) else None
    raw_pods = await deps.kube.list_pods(namespace, snapshot_selector(name))
    pods = tuple(sorted((pod_view(p) for p in raw_pods), key=lambda p: p.name))
    node = None
    if stream is not None and ((stream.get("spec") or {}).get("checkpoint") or {}).get("store") == "pvc":
        driver = (stream.get("status") or {}).get("driverPod")
        node = next((pod_view(p).node for p in await deps.kube.list_driver_pods(namespace, spec.stream)
                     if (p.get("metadata") or {}).get("name") == driver), None)
    return SnapshotObserved(name=name, namespace=namespace, uid=meta.get("uid", ""),
                            generation=int(meta.get("generation") or 0), now=deps.clock.now(), stream=stream,
                            pods=pods, deleting=bool(meta.get("deletionTimestamp")), driver_node=node)


async def reconcile_snapshot(namespace: str, name: str, deps: SnapshotDeps, *, max_steps: int = 6) -> SnapshotOutcome:
    """Drive one snapshot a step towards Completed (or its disposal, when deleted). Safe to call at any time,
    concurrently with nothing else for the same snapshot (the kopf layer holds a per-object lock)."""
    with log_context(snapshot=name, namespace=namespace):
        return await _reconcile_snapshot(namespace, name, deps, max_steps=max_steps)


async def _reconcile_snapshot(namespace: str, name: str, deps: SnapshotDeps, *, max_steps: int) -> SnapshotOutcome:
    last: dict[str, Plan | None] = {"plan": None}

    async def one_pass() -> SnapshotOutcome | None:
        obj = await deps.kube.get_snapshot(namespace, name)
        if obj is None:
            return SnapshotOutcome(exists=False)
        meta = obj["metadata"]
        ref = SnapshotRef(name, namespace, meta.get("uid", ""))
        status = parse_snapshot_status(obj.get("status"))
        spec = parse_snapshot_spec(obj.get("spec"))
        observed = await observe(obj, spec, deps)
        plan = last["plan"] = plan_snapshot(spec, status, observed)
        log.debug("snapshot %s/%s: %s", namespace, name, plan.summary())
        rv = meta.get("resourceVersion")
        if plan.status != status:
            written = await write_first(deps.kube.patch_snapshot_status(namespace, name, dump_status(plan.status), rv))
            rv = (written.get("metadata") or {}).get("resourceVersion", rv)
        await post_events(deps.kube, ref, plan.events)
        for action in plan.actions:
            try:
                await act(deps.kube, namespace, action)
            except KubeError as exc:
                what = refused_object(action, exc)
                if what is None:
                    raise
                return await _refused(deps, ref, plan, what, exc.message, replace(observed, now=deps.clock.now()), rv)
        return SnapshotOutcome(True, plan.status.state, plan.requeue_after, plan.finished)

    def exhausted() -> SnapshotOutcome:
        plan = last["plan"]
        return SnapshotOutcome(True, plan.status.state if plan else None, POLL_SECONDS,
                               plan.finished if plan else True)

    return await converge(one_pass, max_steps=max_steps, exhausted=exhausted, what=f"snapshot {namespace}/{name}")


async def _refused(deps: SnapshotDeps, ref: SnapshotRef, plan: Plan, what: str, error: str,
                   observed: SnapshotObserved, rv: str | None) -> SnapshotOutcome | None:
    """Status first, then the event; None when the snapshot changed meanwhile (observe again)."""
    status, event = record_refusal(plan.status, what, error, observed)
    try:
        await deps.kube.patch_snapshot_status(ref.namespace, ref.name, dump_status(status), rv)
    except Conflict:
        return None
    await post_events(deps.kube, ref, [event] if event is not None else [])
    return SnapshotOutcome(True, status.state, REFUSED_RETRY_SECONDS, plan.finished)
