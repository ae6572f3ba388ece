"""A stream's pass of the reconcile loop (loop.py): observe -> validate -> plan -> write status -> act.

What is particular to streams: the observer (driver and auxiliary Pods, the ledger's progress, the
checkpoint store during an upgrade, snapshots, the restore source, the replay horizon), the Resolve
action (resolution runs here and its result is recorded in status at once), and metrics.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from eos_job.kafka_security import KafkaSecretMissing, KafkaSecrets, denial, secret_refs
from eos_job.log_format import log_context
from eos_job.spec import ExactlyOnceStreamSpec
from eos_job.status import ExactlyOnceStreamStatus

from . import children, planner, spark_ui
from .actions import ApplyService, DeleteService, Event, Plan, Resolve
from .adapters import (CheckpointStore, Clock, Conflict, Kube, KubeError, Progress, Resolver, StoreUnreadable,
                       kafka_secrets, s3_options)
from .children import StreamRef
from .loop import act, converge, dump_status, post_events, write_first
from .metrics import StreamMetrics
from .op_metrics import OperatorMetrics
from .observed import NodeView, Observed, RestoreSource, SnapshotView, node_view, pod_view, snapshot_info
from .start_failures import refused_object
from .upgrades import current_checkpoint_dir
from .validation import InvalidSpec, validate_spec

log = logging.getLogger(__name__)

_STATUS_FIELDS = {f.alias or n for n, f in ExactlyOnceStreamStatus.model_fields.items()}


@dataclass
class Deps:
    kube: Kube
    resolver: Resolver
    clock: Clock
    progress: Progress | None = None     # the ledger: last committed batch, replay horizon (None: not read)
    store: CheckpointStore | None = None  # reads snapshots and checkpoints during an upgrade (None: unreadable)
    metrics: StreamMetrics | None = None  # what each status write says, for Prometheus (None: not exported)
    operator_metrics: OperatorMetrics | None = None  # the operator's own: reconcile time, API and Kafka errors


@dataclass(frozen=True)
class Outcome:
    exists: bool
    lifecycle_state: str | None = None
    requeue_after: float | None = None
    finished: bool = True            # deletion: every child gone


class StatusUnreadable(Exception):
    """The stored status cannot be parsed: acting on a guess could start a second driver."""


def parse_status(raw: dict[str, Any] | None) -> ExactlyOnceStreamStatus:
    """The stream's status; unknown keys (e.g. kopf's bookkeeping) are ignored."""
    known = {k: v for k, v in (raw or {}).items() if k in _STATUS_FIELDS}
    try:
        return ExactlyOnceStreamStatus.model_validate(known)
    except ValidationError as exc:
        raise StatusUnreadable(f"status cannot be parsed: {exc}") from exc


async def observe(obj: dict[str, Any], status: ExactlyOnceStreamStatus,
                  spec: ExactlyOnceStreamSpec | InvalidSpec, deps: Deps) -> Observed:
    meta = obj.get("metadata") or {}
    name, namespace = meta["name"], meta.get("namespace", "default")
    raw_pods = await deps.kube.list_driver_pods(namespace, name)
    pods = tuple(sorted((pod_view(p) for p in raw_pods), key=lambda p: p.name))
    batch = nondet = runtime = None
    driver = next((p for p in pods if p.name == status.driver_pod), None)
    kafka: dict[str, KafkaSecrets] | None = None
    if deps.progress is not None and isinstance(spec, ExactlyOnceStreamSpec):
        kafka = await _kafka(deps, namespace, spec)   # once per pass, for both progress reads
    if (deps.progress is not None and isinstance(spec, ExactlyOnceStreamSpec)
            and driver is not None and driver.phase == "Running" and status.pending_launch is None):
        ref = children.StreamRef(name, namespace, meta["uid"])
        tip = await deps.progress.ledger_tip(children.run_config(ref, spec, status.tx_generation), kafka)
        if tip is not None:
            batch = tip.batch
            nondet = tip.nondeterministic_slots_total
            runtime = tip.runtime_version
    snapshot, readable, ckpt_state = await _read_store(namespace, status, spec, deps)
    aux = await deps.kube.list_pods(namespace, children.aux_selector(name))
    aux_pods = tuple(sorted((pod_view(p) for p in aux), key=lambda p: p.name))
    snaps = [snapshot_info(s) for s in await _list_snapshots(deps, namespace, name)]
    snaps.sort(key=lambda s: (s.created or "", s.name))
    restore = await _restore_source(namespace, spec, deps) if isinstance(spec, ExactlyOnceStreamSpec) else None
    wanted = await _wanted_by_others(deps, namespace, name) if snaps else frozenset()
    horizon = None
    if (deps.progress is not None and isinstance(spec, ExactlyOnceStreamSpec) and status.last_reconciled_spec
            and not meta.get("deletionTimestamp")):
        # Checked whether the driver runs or not: a suspended or failed stream is the one falling behind.
        ref = children.StreamRef(name, namespace, meta["uid"])
        horizon = await deps.progress.replay_horizon(children.run_config(ref, spec, status.tx_generation), kafka)
    ui = await _ui_service(deps, namespace, name, status, spec)
    nodes = await _unwell_pods_nodes(deps, pods)
    return Observed(name=name, namespace=namespace, uid=meta["uid"], generation=int(meta.get("generation") or 0),
                    now=deps.clock.now(), pods=pods, deleting=bool(meta.get("deletionTimestamp")),
                    last_committed_batch=batch, nondeterministic_slots=nondet, runtime_version=runtime,
                    snapshot=snapshot, store_readable=readable, checkpoint_state=ckpt_state, snapshots=tuple(snaps),
                    aux_pods=aux_pods, restore_source=restore, wanted_by_others=wanted, replay_horizon=horizon,
                    ui_service=ui, nodes=nodes)


async def _unwell_pods_nodes(deps: Deps, pods: tuple) -> tuple[NodeView, ...]:
    """The Nodes of the driver Pods that look unwell: Running but not Ready (the node lifecycle controller marks a
    lost node's Pods so), or being deleted. One GET each; none while every driver is well. Unreadable (the chart's
    namespaced install grants no Node read, or the API fails): left out, and the planner treats the Pod as before
    (it waits for it to go). A Node the API does not have is left out too (``node_view``)."""
    names = sorted({p.node for p in pods
                    if p.node and not p.terminal and (p.not_ready or p.deleting or p.phase == "Unknown")})
    found = []
    for node in names:
        try:
            view = node_view(node, await deps.kube.get_node(node))
        except KubeError as exc:
            log.warning("node %s of a driver Pod that looks unwell cannot be read (%s): node loss is not "
                        "detected for it", node, exc)
            continue
        if view is not None:
            found.append(view)
    return tuple(found)


async def _ui_service(deps: Deps, namespace: str, name: str, status: ExactlyOnceStreamStatus,
                      spec: ExactlyOnceStreamSpec | InvalidSpec) -> spark_ui.ServiceView | None:
    """The Service <name>-ui, read only while job.metrics.uiService is on or status names it (one GET; the
    operator does not watch Services)."""
    on = isinstance(spec, ExactlyOnceStreamSpec) and spark_ui.wanted(spec.job.metrics)
    if not on and status.ui_service is None:
        return None
    obj = await deps.kube.get_service(namespace, status.ui_service or spark_ui.service_name(name))
    return None if obj is None else spark_ui.service_view(obj)


async def _wanted_by_others(deps: Deps, namespace: str, name: str) -> frozenset[str]:
    """Snapshot names (and paths) other streams name in spec.restoreFrom and have not restored from yet."""
    wanted = set()
    for other in await deps.kube.list_streams(namespace):
        if other["metadata"]["name"] == name:
            continue
        ref = (other.get("spec") or {}).get("restoreFrom")
        if ref and (other.get("status") or {}).get("restoredFromSnapshot") != ref:
            wanted.add(ref)
    return frozenset(wanted)


async def _kafka(deps: Deps, namespace: str, spec: ExactlyOnceStreamSpec) -> dict[str, KafkaSecrets] | None:
    """The Secret values of the stream's Kafka security, for the progress reads (None: none referenced, or
    missing; the launch reports a missing one)."""
    if not any(secret_refs(side.credentials, side.tls) for side in (spec.source, spec.sink)):
        return None
    try:
        return await kafka_secrets(deps.kube, namespace, spec)
    except KafkaSecretMissing as exc:
        log.info("progress reads skipped: %s", exc)
        return None


async def _list_snapshots(deps: Deps, namespace: str, name: str) -> list[dict[str, Any]]:
    try:
        return await deps.kube.list_snapshots(namespace, name)
    except KubeError as exc:
        if exc.status != 404:
            raise
        log.warning("the ExactlyOnceSnapshot CRD is not installed (apply crds/): snapshots are not listed")
        return []


async def _restore_source(namespace: str, spec: ExactlyOnceStreamSpec, deps: Deps) -> RestoreSource | None:
    """spec.restoreFrom resolved: a snapshot resource by name, or a snapshot path (its manifest read if possible)."""
    ref = spec.restore_from
    if not ref:
        return None
    if ref.startswith(("/", "file://", "s3a://", "s3://")):
        if deps.store is None:
            return RestoreSource(ref=ref, path=ref)
        try:
            view = await deps.store.read_snapshot(spec, ref, await s3_options(deps.kube, namespace, spec))
        except StoreUnreadable:
            return RestoreSource(ref=ref, path=ref)  # the driver fails its start if it is missing
        if view is None:
            return RestoreSource(ref=ref, problem=f"{ref} holds no snapshot manifest (eos-snapshot.json)")
        return RestoreSource(ref=ref, path=ref, stream_uid=view.stream_uid, batch=view.batch)
    obj = await deps.kube.get_snapshot(namespace, ref)
    if obj is None:
        return RestoreSource(ref=ref, problem=f"ExactlyOnceSnapshot {ref} not found in namespace {namespace}")
    info = snapshot_info(obj)
    if info.deleting:
        # Retention (or a user) deleted it: its files are being disposed, a restore from it would fail.
        return RestoreSource(ref=ref, problem=f"ExactlyOnceSnapshot {ref} is being deleted (its files are "
                                              "disposed)")
    if info.state != "Completed" or not info.path:
        return RestoreSource(ref=ref, problem=f"ExactlyOnceSnapshot {ref} is {info.state}, not Completed")
    return RestoreSource(ref=ref, path=info.path, stream_uid=info.stream_uid, batch=info.batch)


async def _read_store(namespace: str, status: ExactlyOnceStreamStatus, spec: ExactlyOnceStreamSpec | InvalidSpec,
                      deps: Deps) -> tuple[SnapshotView | None, bool, str]:
    """Only while an upgrade waits for its old driver: its snapshot, and the live checkpoint's state."""
    up = status.upgrade
    if up is None or up.step != "Stopping" or not isinstance(spec, ExactlyOnceStreamSpec):
        return None, True, "unknown"
    if deps.store is None:
        return None, False, "unknown"
    try:
        s3 = await s3_options(deps.kube, namespace, spec)
        snapshot = await deps.store.read_snapshot(spec, up.snapshot_path, s3) if up.snapshot_path else None
        current = current_checkpoint_dir(status.checkpoint_dir, status.last_reconciled_spec, spec)
        return snapshot, True, await deps.store.checkpoint_state(spec, current, s3)
    except StoreUnreadable as exc:
        log.info("checkpoint store not readable: %s", exc)
        return None, False, "unknown"


def _forget(deps: Deps, namespace: str, name: str) -> None:
    """A deleted stream leaves nothing behind in the operator: its series and its cached Kafka reads."""
    if deps.metrics is not None:
        deps.metrics.forget(namespace, name)
    if deps.progress is not None:
        deps.progress.forget(namespace, name)


async def reconcile(namespace: str, name: str, deps: Deps, *, max_steps: int = 12) -> Outcome:
    """Drive the stream one or more steps towards its spec; safe to call at any time, concurrently
    with nothing else for the same stream (the kopf layer holds a per-stream lock). Every record logged
    meanwhile (in this task) names the stream (eos_job.log_format)."""
    with log_context(stream=name, namespace=namespace):
        return await _reconcile(namespace, name, deps, max_steps=max_steps)


async def _reconcile(namespace: str, name: str, deps: Deps, *, max_steps: int) -> Outcome:
    last: dict[str, Any] = {"plan": None, "lifecycle": None}

    async def one_pass() -> Outcome | None:
        obj = await deps.kube.get_stream(namespace, name)
        if obj is None:
            _forget(deps, namespace, name)
            return Outcome(exists=False)
        meta = obj["metadata"]
        ref = StreamRef(name, namespace, meta["uid"])
        status = parse_status(obj.get("status"))
        spec = validate_spec(obj.get("spec"), namespace, name)
        observed = await observe(obj, status, spec, deps)
        plan = last["plan"] = planner.plan(spec, status, observed)
        lifecycle = last["lifecycle"] = plan.status.lifecycle_state
        log.debug("%s/%s: %s", namespace, name, plan.summary())

        rv = await write_first(_write_status(deps, ref, status, plan.status, meta.get("resourceVersion")))
        await _post_events(deps, ref, plan.events)
        for action in plan.actions:
            if isinstance(action, Resolve):
                assert isinstance(spec, ExactlyOnceStreamSpec)
                follow_up = await _resolve(deps, ref, spec, plan.status, action, observed, rv)
                if follow_up is not None:
                    lifecycle = last["lifecycle"] = follow_up.status.lifecycle_state
                    if not follow_up.again:
                        return Outcome(True, lifecycle, follow_up.requeue_after)
                break  # a Resolve is always the last action of its step
            try:
                await act(deps.kube, namespace, action)
            except KubeError as exc:
                if isinstance(action, (ApplyService, DeleteService)) and action.best_effort:
                    await _post_events(deps, ref, [_best_effort_failed(action, exc)])
                    continue
                what = _refused(action, exc, plan.status)
                if what is None:
                    raise
                new_status, event = planner.record_refusal(plan.status, what, exc.message,
                                                           observed=_at(observed, deps.clock.now()))
                await _write_and_tell(deps, ref, plan.status, new_status, rv, [event])
                return None   # the next pass says it in the conditions and waits out the pause
        if plan.again:
            return None
        if observed.deleting and plan.finished:
            _forget(deps, namespace, name)
        return Outcome(True, lifecycle, plan.requeue_after, plan.finished)

    def exhausted() -> Outcome:
        plan = last["plan"]
        return Outcome(True, last["lifecycle"], planner.POLL_SECONDS, plan.finished if plan else True)

    return await converge(one_pass, max_steps=max_steps, exhausted=exhausted, what=f"{namespace}/{name}")


def _best_effort_failed(action: ApplyService | DeleteService, exc: KubeError) -> Event:
    """A Spark UI Service the API server refused: said, and nothing else held up (planner/spark_ui.py)."""
    verb, name = (("create or update", action.body["metadata"]["name"]) if isinstance(action, ApplyService)
                  else ("delete", action.name))
    return Event("Warning", "SparkUiServiceFailed", f"could not {verb} Service {name} (job.metrics.uiService): "
                                                    f"{exc.message}; the stream is not affected, retried later")


def _refused(action: object, exc: KubeError, status: ExactlyOnceStreamStatus) -> str | None:
    """What a launch's create was refused for good (admission: 403 Pod Security, quota or RBAC, 422
    invalid, 409 a name someone else's object holds), or None for errors a retry may fix."""
    return None if status.pending_launch is None else refused_object(action, exc)


async def _write_status(deps: Deps, ref: StreamRef, old: ExactlyOnceStreamStatus,
                        new: ExactlyOnceStreamStatus, rv: str | None) -> str | None:
    if new != old:
        result = await deps.kube.patch_stream_status(ref.namespace, ref.name, dump_status(new), rv)
        rv = (result.get("metadata") or {}).get("resourceVersion", rv)
    if deps.metrics is not None:
        deps.metrics.record(ref.namespace, ref.name, new)
    return rv


async def _post_events(deps: Deps, ref: StreamRef, events: list[Event]) -> None:
    metrics = deps.metrics
    await post_events(deps.kube, ref, events, counted=None if metrics is None else (
        lambda ev: metrics.event(ref.namespace, ref.name, ev.type, ev.reason)))


async def _resolve(deps: Deps, ref: StreamRef, spec: ExactlyOnceStreamSpec, status: ExactlyOnceStreamStatus,
                   action: Resolve, observed: Observed, rv: str | None) -> Plan | None:
    """Run resolution and record its report (or count its failure) in status."""
    try:
        report = await deps.resolver.resolve(action.config, await s3_options(deps.kube, ref.namespace, spec),
                                             await kafka_secrets(deps.kube, ref.namespace, spec), facts=action.facts)
    except Exception as exc:  # noqa: BLE001 - any failure to resolve is a failed start
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        later = _at(observed, deps.clock.now())
        denied = denial(exc) or ("CheckpointSecretMissing" if isinstance(exc, StoreUnreadable)
                                 and "Secret" in str(exc) else None)
        if denied is not None:
            # A wrong password, a missing ACL or Secret: no restart helps until someone fixes it, so the
            # launch waits and retries instead of counting failures (one event per distinct cause).
            what = "the checkpoint store" if isinstance(exc, StoreUnreadable) else "Kafka access"
            new_status, event = planner.record_refusal(status, what, str(exc), observed=later, reason=denied)
            await _write_and_tell(deps, ref, status, new_status, rv, [event])
            return None
        follow_up = planner.record_resolution_failure(spec, status, error, attempt=action.attempt,
                                                      observed=later)
        # On a conflict: observe again; resolution is idempotent.
        return follow_up if await _write_and_tell(deps, ref, status, follow_up.status, rv, follow_up.events) else None
    new_status, event = planner.record_resolution(status, report, attempt=action.attempt,
                                                  spec_hash=action.spec_hash, observed=observed)
    await _write_and_tell(deps, ref, status, new_status, rv, [event])
    return None


async def _write_and_tell(deps: Deps, ref: StreamRef, old: ExactlyOnceStreamStatus, new: ExactlyOnceStreamStatus,
                          rv: str | None, events: list[Event | None]) -> bool:
    """Status first, then its events; False when the status changed meanwhile (observe again)."""
    try:
        await _write_status(deps, ref, old, new, rv)
    except Conflict:
        return False
    await _post_events(deps, ref, [e for e in events if e is not None])
    return True


def _at(observed: Observed, now: datetime) -> Observed:
    return replace(observed, now=now)


__all__ = ["Deps", "Outcome", "reconcile", "parse_status", "dump_status", "observe", "InvalidSpec"]
