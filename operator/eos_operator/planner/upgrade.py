"""Upgrades: a changed spec recorded as an upgrade, pre-flight on a scratch copy, the old driver's
snapshot or the fallback once it is gone, drain of a partially committed batch, the readiness check
with rollback, and restores (spec.restoreFrom). The field classification lives in ../upgrades.py.
"""
from __future__ import annotations

import json
from datetime import datetime, timedelta

from eos_job.spec import ExactlyOnceStreamSpec, stream_uid
from eos_job.status import (ExactlyOnceStreamStatus, PendingLaunch, RejectedSpec, SnapshotRecord, UpgradeCheck,
                            UpgradeProgress)

from .. import children
from ..actions import ApplyConfigMap, CreatePod, CreateSnapshot, DeletePod, Plan
from ..conditions import READY, get_condition
from ..observed import PodView, SnapshotView
from ..timeutil import fmt, parse
from ..upgrades import OPERATOR_ONLY_FIELDS, current_checkpoint_dir, plan_spec_change
from .housekeeping import snapshot_resource_for
from .probe import probe
from .restarts import aux_failed, start_launch
from .step import POLL_SECONDS, SNAPSHOT_HISTORY, Cond, StreamStep, abandon_upgrade, degraded, not_starting


def spec_changed(step: StreamStep, spec: ExactlyOnceStreamSpec, changes: list[str], *,
                  not_before: str | None = None) -> Plan:
    """Record the launch and, for an upgrade, the upgrade's write-ahead record; nothing is stopped yet."""
    st, obs = step.st, step.obs
    restoring = "restoreFrom" in changes and spec.restore_from is not None
    if restoring and (obs.restore_source is None or obs.restore_source.path is None):
        return restore_source_missing(step, spec)
    change = plan_spec_change(changes, spec)
    previous_generation = st.tx_generation
    if change.bump_tx_generation:
        st.tx_generation += 1
    from_pod = st.driver_pod
    start_launch(step, "SpecChange", not_before=not_before)
    attempt = st.pending_launch.attempt
    if change.kind == "upgrade":
        current = current_checkpoint_dir(st.checkpoint_dir, st.last_reconciled_spec, spec)
        snapshot = st.snapshot_on_stop if change.mode == "snapshot" else None
        st.upgrade = UpgradeProgress(
            mode=change.mode, step="Stopping" if change.mode == "snapshot" else "Stopped",
            target_spec_hash=spec.spec_hash(), from_pod=from_pod,
            snapshot_name=snapshot.rstrip("/").rsplit("/", 1)[-1] if snapshot else None, snapshot_path=snapshot,
            checkpoint_dir=(current if change.mode == "last-state"
                            else children.upgrade_checkpoint_dir(spec, obs.uid, attempt)),
            restore_from=snapshot, previous_tx_generation=previous_generation, requested_at=fmt(obs.now),
            replay_offsets_from=current if st.last_reconciled_spec else None)
        if restoring:
            # spec.restoreFrom changed: the new driver starts from that snapshot, not from the stop snapshot.
            st.upgrade = st.upgrade.model_copy(update={
                "checkpoint_dir": children.upgrade_checkpoint_dir(spec, obs.uid, attempt),
                "restore_from": obs.restore_source.path, "step": "Stopping" if snapshot else "Stopped",
                "note": f"restoring from {spec.restore_from}"})
        if spec.upgrade_pre_flight and change.mode != "stateless" and st.last_reconciled_spec:
            st.upgrade = st.upgrade.model_copy(update={
                "step": "PreFlight", "pre_flight_pod": children.aux_pod_name(obs.name, children.PREFLIGHT, attempt)})
    st.lifecycle_state = "Upgrading"
    step.event("Normal", "Upgrading", f"{change.explanation}; new driver {st.pending_launch.pod}")
    step.conditions(("False", "Upgrading", change.explanation),
                    ("True", "Upgrading", f"launching {st.pending_launch.pod}"), degraded(st))
    return step.done(again=True)


def after_stop(step: StreamStep, spec: ExactlyOnceStreamSpec, up: UpgradeProgress, ready_reason: str,
                degraded_cond: Cond) -> Plan:
    """The old driver is gone: take its snapshot, or decide the fallback. Idempotent: only status changes."""
    st, obs = step.st, step.obs
    launch = st.pending_launch
    current = current_checkpoint_dir(st.checkpoint_dir, st.last_reconciled_spec, spec)
    snap, readable, state = obs.snapshot, obs.store_readable, obs.checkpoint_state
    if spec.checkpoint.store == "pvc" and not (up.restore_from and up.restore_from != up.snapshot_path):
        # The operator mounts no claim: a check Pod reads the snapshot and the checkpoint where they are.
        checked = up.checked
        if checked is None or checked.checkpoint_dir != current:
            ref = children.StreamRef(obs.name, obs.namespace, obs.uid)
            config = children.run_config(ref, spec, st.tx_generation, checkpoint=current)

            def record(facts) -> None:
                st.upgrade = up.model_copy(update={"checked": facts})
            return probe(step, spec, launch, config, ready_reason, degraded_cond, component=children.CHECK,
                         snapshot=up.snapshot_path, record=record)
        s = checked.snapshot
        snap = SnapshotView(path=s.path, stream_uid=s.stream_uid, batch=s.batch, time=s.time,
                            checkpoint_id=s.checkpoint_id) if s is not None else None
        readable, state = True, checked.state or "unknown"
    # The manifest carries the job runtime's stream id (eos_job.spec.stream_uid), not metadata.uid.
    if snap is not None and snap.stream_uid == stream_uid(obs.namespace, obs.name):
        record = SnapshotRecord(name=up.snapshot_name or snap.path.rsplit("/", 1)[-1], path=snap.path,
                                batch=snap.batch, time=snap.time)
        st.snapshots = ([s for s in st.snapshots if s.name != record.name] + [record])[-SNAPSHOT_HISTORY:]
        st.upgrade = up.model_copy(update={"step": "Stopped"})
        step.act(CreateSnapshot(snapshot_resource_for(step, spec, record.name, "upgrade", path=record.path)))
        step.event("Normal", "SnapshotTaken",
                   f"{up.from_pod or 'the driver'} stopped with snapshot {record.name} at batch {record.batch} "
                   f"({record.path}); {launch.pod} starts from it in {up.checkpoint_dir}")
        return step.done(again=True)
    if up.restore_from and up.restore_from != up.snapshot_path:
        # A restore (spec.restoreFrom): the new driver starts from that snapshot; a stop snapshot is a bonus.
        st.upgrade = up.model_copy(update={"step": "Stopped"})
        return step.done(again=True)
    if up.snapshot_path and not readable:
        note = (f"checkpoint.store {spec.checkpoint.store} cannot be read by the operator: snapshot "
                f"{up.snapshot_path} is not verified; {launch.pod} fails its start if it is missing")
        st.upgrade = up.model_copy(update={"step": "Stopped", "note": note})
        step.event("Warning", "SnapshotUnverified", note)
        return step.done(again=True)
    why = (f"no snapshot was taken ({up.from_pod or 'no driver'} was not stopped gracefully)" if up.snapshot_path
           else "no snapshot can be taken (the last driver was started without a snapshot location)")
    if state in ("intact", "empty"):
        detail = ("falling back to last-state on the intact checkpoint" if state == "intact"
                  else "the checkpoint holds no state yet, starting on it")
        note = f"{why}: {detail} {current}"
        st.upgrade = up.model_copy(update={"step": "Stopped", "note": note, "checkpoint_dir": current,
                                           "restore_from": None})
        step.event("Warning" if state == "intact" else "Normal", "SnapshotFallback", note)
        step.conditions(("False", ready_reason, note), ("True", "Upgrading", note), degraded_cond)
        return step.done(again=True)
    note = (f"{why}, and the checkpoint {current} is {state}: the upgrade is blocked (never silently "
            "stateless). Set upgradeMode to last-state or stateless to continue")
    st.upgrade = up.model_copy(update={"step": "Blocked", "note": note})
    st.pending_launch = None
    st.next_restart_time = None
    st.lifecycle_state = "Failed"
    step.event("Warning", "UpgradeBlocked", note)
    return blocked(step)


def blocked(step: StreamStep) -> Plan:
    note = step.st.upgrade.note if step.st.upgrade else ""
    step.conditions(("False", "UpgradeBlocked", note),
                    ("False", "UpgradeBlocked", "change spec.upgradeMode to continue"), ("True", "UpgradeBlocked", note))
    return step.done()


def overlay_spec(run_spec: str | None, spec: ExactlyOnceStreamSpec) -> ExactlyOnceStreamSpec:
    """``run_spec`` (a stable spec's JSON) with the operator-only fields of the current ``spec``.

    While a spec is rejected the last stable one keeps running, but suspend, restartNonce, the restart
    strategy and the snapshot settings of the current spec still apply.
    """
    if not run_spec:
        return spec
    try:
        doc = json.loads(run_spec)
    except ValueError:
        return spec
    current = spec.wire()
    for path in OPERATOR_ONLY_FIELDS:
        src, dst = current, doc
        for key in path[:-1]:   # parents are not made: job.metrics.uiService never adds a job.metrics
            src, dst = src.get(key) or {}, dst.get(key)
            if not isinstance(dst, dict):
                break
        else:
            if path[-1] in src:
                dst[path[-1]] = src[path[-1]]
            else:
                dst.pop(path[-1], None)
    try:
        return ExactlyOnceStreamSpec.model_validate(doc)
    except ValueError:
        return spec


def pre_flight(step: StreamStep, spec: ExactlyOnceStreamSpec) -> Plan:
    """The new spec runs on a scratch copy of the state, writing nothing, while the old driver keeps running."""
    st, obs = step.st, step.obs
    up, launch = st.upgrade, st.pending_launch
    assert up is not None and launch is not None and up.pre_flight_pod
    ref = children.StreamRef(obs.name, obs.namespace, obs.uid)
    pod = obs.aux_pod(up.pre_flight_pod)
    running: Cond = ("True", "Running", f"driver Pod {st.driver_pod} runs the current spec meanwhile")
    driver = obs.pod(st.driver_pod)
    if driver is None or driver.phase != "Running":
        running = ("False", "Upgrading", "pre-flight of the new spec")
    if pod is None:
        source = (up.restore_from + "/checkpoint" if up.restore_from and up.restore_from != up.snapshot_path
                  else current_checkpoint_dir(st.checkpoint_dir, st.last_reconciled_spec, spec))
        config = children.run_config(ref, spec, st.tx_generation, checkpoint=source)
        step.act(ApplyConfigMap(children.run_config_map(ref, config, children.aux_config_name(obs.name,
                                                                                              children.PREFLIGHT))))
        node = driver.node if driver is not None and spec.checkpoint.store == "pvc" else None
        step.act(CreatePod(children.pin_to_node(children.aux_pod(
            ref, spec, component=children.PREFLIGHT, attempt=launch.attempt, tx_generation=st.tx_generation,
            args=["preflight", "--config-env", children.RUN_CONFIG_ENV, "--from-checkpoint", source,
                  "--scratch", children.preflight_scratch_dir(spec, launch.attempt)]), node)))
        step.event("Normal", "PreFlight", f"trying the new spec on a scratch copy of {source} "
                                          f"({up.pre_flight_pod}, writes nothing) before stopping {st.driver_pod}")
        step.conditions(running, ("True", "PreFlight", f"{up.pre_flight_pod} checks the new spec"), degraded(st))
        return step.done(requeue_after=POLL_SECONDS)
    if pod.phase == "Succeeded":
        if not pod.deleting:
            step.act(DeletePod(pod.name, 0))
        st.upgrade = up.model_copy(update={"step": "Stopping" if up.snapshot_path else "Stopped"})
        step.event("Normal", "PreFlightPassed", f"the new spec starts from the current state "
                                                f"({pod.message or 'ok'}); proceeding with the upgrade")
        return step.done(again=True)
    stuck = not_starting(pod, spec, obs.now)
    if pod.phase == "Failed" or stuck:
        if not pod.deleting:
            step.act(DeletePod(pod.name, 0))
        reason = stuck or pod.failure_text()
        message = (f"pre-flight of the new spec failed, the old spec keeps running: {reason}. "
                   "Fix the spec (or set upgradeMode: stateless to start without the state)")[:1024]
        abandon_upgrade(st)
        st.pending_launch = None
        st.rejected_spec = RejectedSpec(spec_hash=up.target_spec_hash, reason="PreFlightFailed", message=message,
                                        time=fmt(obs.now), run_spec=st.last_reconciled_spec)
        st.lifecycle_state = "Running" if driver is not None and driver.phase == "Running" else st.lifecycle_state
        step.event("Warning", "UpgradeBlocked", message)
        # The refusal and its conditions are written together: a reader never sees one without the other.
        ready: Cond = (("True", "Running", f"driver Pod {st.driver_pod} keeps running the current spec")
                       if driver is not None and driver.phase == "Running" else running)
        step.conditions(ready, ("False", "UpgradeBlocked", message), degraded(st))
        return step.done(again=True)
    step.conditions(running, ("True", "PreFlight", f"{pod.name} is {pod.phase}"
                                                   + (f": {pod.blocked}" if pod.blocked else "")), degraded(st))
    return step.done(requeue_after=POLL_SECONDS)


def needs_drain(st: ExactlyOnceStreamStatus, up: UpgradeProgress) -> bool:
    return (up.step in ("Stopped", "Draining") and not up.drained and not up.rollback and up.restore_from is None
            and up.mode != "stateless" and st.last_reconciled_spec is not None)


def drain(step: StreamStep, spec: ExactlyOnceStreamSpec, up: UpgradeProgress, launch: PendingLaunch,
           ready_reason: str, degraded_cond: Cond) -> Plan:
    st, obs = step.st, step.obs
    ref = children.StreamRef(obs.name, obs.namespace, obs.uid)
    name = children.aux_pod_name(obs.name, children.DRAIN, launch.attempt)
    if up.step != "Draining":
        st.upgrade = up.model_copy(update={"step": "Draining", "drain_pod": name})
        return step.done(again=True)
    pod = obs.aux_pod(name)
    if pod is None:
        old = overlay_spec(st.last_reconciled_spec, spec)
        config = children.run_config(ref, old, up.previous_tx_generation, checkpoint=up.checkpoint_dir)
        step.act(ApplyConfigMap(children.run_config_map(ref, config, children.aux_config_name(obs.name,
                                                                                              children.DRAIN))))
        step.act(CreatePod(children.aux_pod(ref, old, component=children.DRAIN, attempt=launch.attempt,
                                            tx_generation=up.previous_tx_generation,
                                            args=["run", "--config-env", children.RUN_CONFIG_ENV, "--drain"])))
        step.event("Normal", "Draining", f"{name} finishes any batch left uncommitted in {up.checkpoint_dir} with "
                                         f"the old spec (generation {up.previous_tx_generation}) before "
                                         f"{launch.pod} starts the new one")
        step.conditions(("False", ready_reason, f"draining with {name}"),
                        ("True", "Draining", f"{name} finishes the old spec's last batch"), degraded_cond)
        return step.done(requeue_after=POLL_SECONDS)
    if pod.deleting:
        return step.done(requeue_after=POLL_SECONDS)
    if pod.phase == "Succeeded":
        step.act(DeletePod(pod.name, 0))
        st.upgrade = up.model_copy(update={"step": "Stopped", "drained": True})
        step.event("Normal", "Drained", f"{name}: {pod.message or 'no batch was left uncommitted'}")
        return step.done(again=True)
    stuck = not_starting(pod, spec, obs.now)
    if pod.phase == "Failed" or stuck:
        step.act(DeletePod(pod.name, 0))
        return aux_failed(step, spec, launch, stuck or pod.failure_text(), failed_reason="DrainFailed",
                          progressing="Draining", what="the drain", ready_reason=ready_reason,
                          degraded_cond=None)
    step.conditions(("False", ready_reason, f"draining with {name}"),
                    ("True", "Draining", f"{name} is {pod.phase}" + (f": {pod.blocked}" if pod.blocked else "")),
                    degraded_cond)
    return step.done(requeue_after=POLL_SECONDS)


def idle_since_upgrade(step: StreamStep, spec: ExactlyOnceStreamSpec, chk: UpgradeCheck, driver: PodView | None,
                        deadline: datetime) -> str | None:
    """Why an upgraded driver that committed nothing is still ready, or None: it ran the whole readiness
    window without failing and the source had nothing for it (no batch to commit is not a stuck stream).

    The evidence is the replay horizon read during the window: no record retained beyond the last
    committed batch and none lost. Without that reading (source unreadable) there is no proof: roll back.
    """
    st, obs = step.st, step.obs
    hz = obs.replay_horizon
    window_start = deadline - timedelta(seconds=spec.upgrade_readiness_timeout_seconds)
    checked = parse(hz.checked_at) if hz is not None else None
    if (driver is None or driver.name != chk.pod or driver.phase != "Running"
            or st.pending_launch is not None or hz is None or checked is None or checked < window_start
            or hz.backlog_records or hz.lost_records):
        return None
    return (f"no input arrived after batch {hz.batch} in the {spec.upgrade_readiness_timeout_seconds}s readiness "
            f"window (the source is idle, so there was no batch to commit; the horizon was read at "
            f"{hz.checked_at})")


def check_upgrade(step: StreamStep, spec: ExactlyOnceStreamSpec) -> Plan | None:
    """An upgraded driver must run and commit a batch within the readiness timeout, else roll back."""
    st, obs = step.st, step.obs
    chk = st.upgrade_check
    assert chk is not None
    if spec.spec_hash() != chk.target_spec_hash:
        st.upgrade_check = None   # the spec moved on (a newer upgrade is decided below)
        return None
    driver = obs.pod(st.driver_pod)
    batch = obs.last_committed_batch
    deadline = parse(chk.deadline)
    due = deadline is not None and obs.now >= deadline
    verified = None
    if (st.pending_launch is None and driver is not None and driver.phase == "Running" and batch is not None
            and (chk.baseline_batch is None or batch > chk.baseline_batch)):
        verified = f"{driver.name} runs the new spec and committed batch {batch}"
    elif due and (idle := idle_since_upgrade(step, spec, chk, driver, deadline)):
        verified = f"{driver.name} runs the new spec: {idle}"
    if verified:
        st.upgrade_check = None
        st.last_stable_spec = st.last_reconciled_spec
        step.event("Normal", "UpgradeVerified", verified)
        return None
    if not due:
        return None
    st.upgrade_check = None
    why = (f"the upgraded stream did not run and commit a batch after {chk.baseline_batch} within "
           f"{spec.upgrade_readiness_timeout_seconds}s (last error: {st.last_error or 'none'})")
    previous = overlay_spec(chk.previous_spec, spec) if chk.previous_spec else None
    if previous is None or chk.rollback_snapshot is None:
        step.event("Warning", "UpgradeNotReady", f"{why}; no stable spec and snapshot to roll back to")
        return None
    if (previous.job.parallelism, previous.job.slots_from) != (spec.job.parallelism, spec.job.slots_from):
        # The ledger skips batches per transactional-id generation; across a change of the slots (their count
        # or how they are derived) a restore of the older snapshot could write a batch the new driver partly
        # committed again. Never risk that.
        step.event("Warning", "UpgradeNotReady", f"{why}; not rolled back automatically across a job.parallelism "
                   f"or job.slotsFrom change: to roll back, apply the previous spec with restoreFrom: "
                   f"{chk.rollback_snapshot}")
        return None
    message = f"{why}: rolled back to the last stable spec from snapshot {chk.rollback_snapshot}"
    st.rejected_spec = RejectedSpec(spec_hash=chk.target_spec_hash, reason="RolledBack", message=message,
                                    time=fmt(obs.now), run_spec=chk.previous_spec)
    st.pending_launch = None
    start_launch(step, "Rollback")
    attempt = st.pending_launch.attempt
    st.upgrade = UpgradeProgress(mode="snapshot", step="Stopped", target_spec_hash=previous.spec_hash(),
                                 from_pod=st.driver_pod, snapshot_name=chk.rollback_snapshot.rsplit("/", 1)[-1],
                                 checkpoint_dir=children.upgrade_checkpoint_dir(previous, obs.uid, attempt),
                                 restore_from=chk.rollback_snapshot, previous_tx_generation=st.tx_generation,
                                 rollback=True, requested_at=fmt(obs.now), note="rollback",
                                 replay_offsets_from=current_checkpoint_dir(st.checkpoint_dir,
                                                                            st.last_reconciled_spec, spec))
    st.lifecycle_state = "Upgrading"
    step.event("Warning", "UpgradeRolledBack", f"{message}; new driver {st.pending_launch.pod}")
    step.conditions(("False", "RollingBack", message), ("True", "RollingBack", f"launching {st.pending_launch.pod}"),
                    ("True", "UpgradeRolledBack", message))
    return step.done(again=True)


def restore_source_missing(step: StreamStep, spec: ExactlyOnceStreamSpec) -> Plan:
    src = step.obs.restore_source
    problem = (src.problem if src is not None and src.problem else f"snapshot {spec.restore_from} not found")
    message = (f"spec.restoreFrom: {problem}; name a Completed ExactlyOnceSnapshot of this namespace or an "
               "absolute snapshot path")
    ready = get_condition(step.st.conditions, READY)
    if ready is None or ready.reason != "RestoreSourceNotReady" or ready.message != message:
        step.event("Warning", "RestoreSourceNotReady", message)
    step.conditions(("False", "RestoreSourceNotReady", message),
                    ("True", "RestoreSourceNotReady", "waiting for the snapshot to restore from"),
                    ("True", "RestoreSourceNotReady", message))
    return step.done(requeue_after=5.0)


def restore_text(step: StreamStep, spec: ExactlyOnceStreamSpec, up: UpgradeProgress) -> str:
    obs = step.obs
    src = obs.restore_source
    head = f"restored from {spec.restore_from} ({up.restore_from}) into the new checkpoint location {up.checkpoint_dir}"
    if src is None or src.stream_uid is None:
        return head + "; the snapshot's stream id could not be read, so whether batches are skipped is unknown"
    if src.stream_uid == stream_uid(obs.namespace, obs.name):
        return (head + f": the same stream, so batches already in the sink (after batch {src.batch}) are skipped "
                       "by the ledger: exactly once with respect to what consumers saw")
    return (head + f": a snapshot of another stream (a fork): this stream has its own id, so everything after "
                   f"batch {src.batch} is written again; point a fork at another sink topic")
