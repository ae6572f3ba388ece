"""The one reconcile loop: observe -> plan -> write status -> post events -> act, for streams and snapshots.

Level-based: each pass reads the object and its children as they are now (from the operator's watches,
informer.py, which hold its own writes at once and never forget an object early), so the create, update,
resume, Pod-change and timer triggers, and a second operator start, all converge on the same decisions. The status is written *before* the plan's actions run (it is the write-ahead
log) and with the resourceVersion that was observed, so a stale view is refused with a 409 and simply
observed again. Each resource supplies one pass (reconciler.py, snapshot_reconciler.py); this module
runs the passes and carries out what the planners decide.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, TypeVar

from pydantic import BaseModel

from .actions import (Action, ApplyConfigMap, ApplyService, CreatePod, CreateSnapshot, DeleteConfigMap, DeletePod,
                      DeleteService, DeleteSnapshot, Event)
from .adapters import Conflict, Kube, KubeError
from .op_metrics import OperatorMetrics

log = logging.getLogger(__name__)

T = TypeVar("T")


class StaleView(Exception):
    """The status write was refused (409): the object changed while planning."""


async def write_first(write: Awaitable[T]) -> T:
    """The status write that precedes every action: a 409 means the plan rests on a stale view."""
    try:
        return await write
    except Conflict as exc:
        raise StaleView(str(exc)) from exc


async def converge(one_pass: Callable[[], Awaitable[T | None]], *, max_steps: int,
                   exhausted: Callable[[], T], what: str) -> T:
    """Run ``one_pass`` until it returns an outcome (None: observe and plan again at once), at most
    ``max_steps`` times. A pass whose status write met a 409 (:class:`StaleView`) is observed again."""
    for _ in range(max_steps):
        try:
            outcome = await one_pass()
        except StaleView:
            log.info("%s changed while planning; observing again", what)
            continue
        if outcome is not None:
            return outcome
    return exhausted()


async def serialized(lock: asyncio.Lock, kind: str, reconcile: Callable[[], Awaitable[T]],
                     metrics: OperatorMetrics | None = None) -> T:
    """One reconcile of an object under its lock (kopf may run its timer and an event handler at once),
    measured: waiting for the lock, then running (outcome ``requeue`` when a deletion is not finished)."""
    if metrics is None:
        async with lock:
            return await reconcile()
    with metrics.in_state(kind, "waiting"):
        await lock.acquire()
    try:
        with metrics.timed(kind) as timing:
            outcome = await reconcile()
            timing.outcome = "requeue" if getattr(outcome, "exists", False) and not getattr(
                outcome, "finished", True) else "ok"
            return outcome
    finally:
        lock.release()


def dump_status(status: BaseModel) -> dict[str, Any]:
    # None values stay in: in a merge patch they remove the field.
    return status.model_dump(by_alias=True, mode="json")


async def post_events(kube: Kube, ref: Any, events: list[Event], *,
                      counted: Callable[[Event], None] | None = None) -> None:
    """Post each event on ``ref`` (and log it); ``counted`` sees each one too (metrics)."""
    for ev in events:
        (log.warning if ev.type == "Warning" else log.info)("%s/%s %s: %s", ref.namespace, ref.name,
                                                            ev.reason, ev.message)
        await kube.post_event(ref, ev.type, ev.reason, ev.message)
        if counted is not None:
            counted(ev)


async def act(kube: Kube, namespace: str, action: Action) -> None:
    """Carry out one side effect a planner decided (all but Resolve, which the stream's pass runs itself)."""
    if isinstance(action, DeletePod):
        await kube.delete_pod(namespace, action.name, action.grace_seconds)
    elif isinstance(action, ApplyConfigMap):
        await kube.apply_config_map(namespace, action.body)
    elif isinstance(action, ApplyService):
        await kube.apply_service(namespace, action.body)
    elif isinstance(action, CreatePod):
        await kube.create_pod(namespace, action.body)
    elif isinstance(action, DeleteConfigMap):
        await kube.delete_config_map(namespace, action.name, action.owner_uid)
    elif isinstance(action, DeleteService):
        await kube.delete_service(namespace, action.name, action.owner_uid)
    elif isinstance(action, CreateSnapshot):
        try:
            await kube.create_snapshot(namespace, action.body)
        except KubeError as exc:
            if exc.status != 404:
                raise
            log.warning("the ExactlyOnceSnapshot CRD is not installed (apply crds/): snapshot %s is kept in "
                        "status only", action.body["metadata"]["name"])
    elif isinstance(action, DeleteSnapshot):
        await kube.delete_snapshot(namespace, action.name)
    else:  # pragma: no cover - a new action type without an executor is a bug
        raise TypeError(f"no executor for {action!r}")
