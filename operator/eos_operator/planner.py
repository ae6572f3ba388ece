"""The planner: ``plan(spec, status, observed) -> Plan``. Pure: no I/O, no clock, no randomness.

A plan is the new status to persist *first* (the write-ahead log) and then the
side effects to carry out, the events to post, and when to look again. One
call decides one step; the reconciler persists the status, acts, observes
again and calls ``plan`` again while ``again`` is set, so a launch runs as a
chain of small, individually idempotent steps:

    decide (record PendingLaunch) -> wait for the restart delay -> stop every
    other driver Pod and see it gone -> resolve (record the report) -> apply the
    run ConfigMap and create the Pod -> see the Pod -> clear PendingLaunch

An operator killed between any two steps re-reads the status and continues the
same launch: the Pod name is fixed when the launch is recorded, so a repeated
create is a 409 and never a second driver.

An upgrade (see upgrades.py) is a launch with ``status.upgrade`` recorded next
to it: which mode, where the old driver writes its snapshot and where the new
one starts. After the old driver is gone, one more step reads the snapshot back
(or decides the fallback) before resolution; the record is cleared in the same
status write that names the new driver and its checkpoint location.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Literal, Union

from eos_job.spec import (ExactlyOnceStreamSpec, ExactlyOnceStreamStatus, PendingLaunch, RejectedSpec,
                          ResolutionReport, RunConfig, SnapshotRecord, UpgradeCheck, UpgradeProgress, stream_uid)

from . import children
from .conditions import DEGRADED, PROGRESSING, READY, get_condition, set_condition
from .observed import Observed, PodView
from .restart import RestartMemory, decide, jitter_unit_for
from .timeutil import fmt, fmt_ceil, parse, seconds_between, utc
from .upgrades import (OPERATOR_ONLY_FIELDS, classify, current_checkpoint_dir, plan_spec_change,
                       run_affecting_changes, spec_json)
from .validation import InvalidSpec

POLL_SECONDS = 2.0  # how soon to look again while waiting for a Pod to go or come
SNAPSHOT_HISTORY = 10  # snapshots kept in status.snapshots (the files stay in the store)


# ------------------------------------------------------------------ plan parts
@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class DeletePod:
    name: str
    grace_seconds: int


@dataclass(frozen=True)
class Resolve:
    config: RunConfig
    attempt: int
    spec_hash: str


@dataclass(frozen=True)
class ApplyConfigMap:
    body: dict


@dataclass(frozen=True)
class ApplyService:
    body: dict


@dataclass(frozen=True)
class CreatePod:
    body: dict


@dataclass(frozen=True)
class DeleteConfigMap:
    name: str


@dataclass(frozen=True)
class DeleteService:
    name: str


@dataclass(frozen=True)
class CreateSnapshot:
    body: dict


@dataclass(frozen=True)
class DeleteSnapshot:
    name: str


Action = Union[DeletePod, Resolve, ApplyConfigMap, ApplyService, CreatePod, DeleteConfigMap, DeleteService,
               CreateSnapshot, DeleteSnapshot]


@dataclass
class Plan:
    status: ExactlyOnceStreamStatus
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None   # look again within this many seconds
    again: bool = False                  # re-observe and re-plan right after acting
    finished: bool = True                # deletion only: every child is gone

    def summary(self) -> str:
        acts = ", ".join(type(a).__name__ for a in self.actions) or "nothing"
        return f"{self.status.lifecycle_state}: {acts}"


Cond = tuple[Literal["True", "False", "Unknown"], str, str]


class _Step:
    """Working state of one planning step."""

    def __init__(self, status: ExactlyOnceStreamStatus, observed: Observed):
        self.st = status.model_copy(deep=True)
        self.obs = observed
        self.plan = Plan(status=self.st)

    def event(self, type_: Literal["Normal", "Warning"], reason: str, message: str) -> None:
        self.plan.events.append(Event(type_, reason, message))

    def act(self, action: Action) -> None:
        self.plan.actions.append(action)

    def conditions(self, ready: Cond, progressing: Cond, degraded: Cond) -> None:
        conds = self.st.conditions
        for type_, (status, reason, message) in ((READY, ready), (PROGRESSING, progressing),
                                                 (DEGRADED, degraded)):
            conds = set_condition(conds, type_, status, reason, message,
                                  generation=self.obs.generation, now=self.obs.now)
        self.st.conditions = conds

    def lifecycle(self, state: str, event: tuple[str, str] | None = None) -> None:
        """Set the lifecycle state; post ``event`` (reason, message) only on a change."""
        if self.st.lifecycle_state != state and event is not None:
            self.event("Normal", *event)
        self.st.lifecycle_state = state  # type: ignore[assignment]

    def done(self, *, requeue_after: float | None = None, again: bool = False) -> Plan:
        self.plan.requeue_after = requeue_after
        self.plan.again = again
        self.plan.status = self.st
        return self.plan


def _degraded(st: ExactlyOnceStreamStatus) -> Cond:
    rejected = st.rejected_spec
    if rejected is not None:
        reason = "UpgradeBlocked" if rejected.reason == "PreFlightFailed" else "UpgradeRolledBack"
        return ("True", reason, rejected.message)
    horizon = st.replay_horizon
    if horizon is not None and horizon.state != "Safe":
        return ("True", f"ReplayHorizon{horizon.state}", horizon.message)
    return ("False", "AsExpected", "")


def _watch_nondeterminism(step: _Step) -> None:
    """A Warning when the ledger's count of replayed slots that differed from the sink grows."""
    seen, st = step.obs.nondeterministic_slots, step.st
    if seen is None:
        return
    before = st.nondeterministic_slots or 0
    if seen > before:
        step.event("Warning", "NondeterministicOutput",
                   f"{seen - before} replayed output slot(s) differed from what the sink already holds ({seen} "
                   "so far): the transformation is not deterministic (time, random numbers, unordered "
                   "collections or external lookups). The sink keeps the first output, so nothing is written "
                   "twice, but a result depends on which attempt ran first; the driver log names the batch "
                   "and slot. Make the transformation deterministic")
    st.nondeterministic_slots = seen


def _watch_replay_horizon(step: _Step) -> None:
    """Record the replay horizon; a Warning when it starts shrinking or records are lost, Normal when safe again."""
    new = step.obs.replay_horizon
    if new is None:
        return
    st = step.st
    old = st.replay_horizon
    if new.state != "Safe" and (old is None or old.state != new.state):
        step.event("Warning", f"ReplayHorizon{new.state}", new.message)
    elif new.state == "Safe" and old is not None and old.state != "Safe":
        step.event("Normal", "ReplayHorizonSafe", f"the source retains every record the stream has not processed "
                                                  f"({new.backlog_records} behind)")
    st.replay_horizon = new
    if st.last_committed_batch is None or new.batch > st.last_committed_batch:
        st.last_committed_batch = new.batch   # also while no driver runs (suspended, failed)


# --------------------------------------------------------------------- entry
def plan(spec: ExactlyOnceStreamSpec | InvalidSpec, status: ExactlyOnceStreamStatus,
         observed: Observed) -> Plan:
    if observed.deleting:
        return plan_deletion(status, observed)
    step = _Step(status, observed)
    step.st.observed_generation = observed.generation
    if isinstance(spec, InvalidSpec):
        return _invalid(step, spec)
    st = step.st

    # A changed restartNonce resets the restart counters and restarts the driver.
    if st.observed_restart_nonce is None:
        st.observed_restart_nonce = spec.restart_nonce
    elif st.observed_restart_nonce != spec.restart_nonce:
        return _nonce_changed(step, spec)

    if st.rejected_spec is not None and st.rejected_spec.spec_hash != spec.spec_hash():
        step.event("Normal", "SpecChanged", f"the spec changed since it was {_rejected_text(st.rejected_spec)}: "
                                            "applying the new spec")
        st.rejected_spec = None
    if st.rejected_spec is not None:
        spec = overlay_spec(st.rejected_spec.run_spec, spec)   # the last stable spec keeps running

    _snapshot_housekeeping(step, spec)
    _watch_replay_horizon(step)

    if spec.job.state == "suspended":
        return _suspend(step)

    if st.upgrade_check is not None:
        rolled = _check_upgrade(step, spec)
        if rolled is not None:
            return rolled

    if st.upgrade is not None and st.upgrade.step == "PreFlight":
        if spec.spec_hash() == st.upgrade.target_spec_hash:
            return _pre_flight(step, spec)
        _abandon_upgrade(st)   # the spec changed again while checking: decide afresh
        st.pending_launch = None

    if st.upgrade is not None and st.upgrade.step == "Blocked":
        if spec.spec_hash() == st.upgrade.target_spec_hash:
            return _blocked(step)
        _abandon_upgrade(st)  # the spec changed again (e.g. upgradeMode): decide afresh below

    if st.pending_launch is not None:
        launch = st.pending_launch
        if st.upgrade is None and launch.reason != "SpecChange":
            # A restart or resume that would start a changed spec is an upgrade, never a silent restart.
            changes = run_affecting_changes(st.last_reconciled_spec, spec)
            if any(classify(c) == "upgrade" for c in changes):
                return _spec_changed(step, spec, changes, not_before=launch.not_before)
        return _continue_launch(step, spec, launch)

    if st.lifecycle_state == "Failed":
        changes = run_affecting_changes(st.last_reconciled_spec, spec)
        if changes:
            return _spec_changed(step, spec, changes)
        return _failed(step)

    if st.driver_pod is None:
        if st.lifecycle_state == "Suspended":
            _start_launch(step, "Resume")
            step.lifecycle("Deploying")
            step.event("Normal", "Resumed", "job.state is running: resuming (resolution first)")
        else:
            _start_launch(step, "Create")
            step.lifecycle("Deploying")
        step.conditions(("False", "Deploying", "launching the driver"),
                        ("True", "Launching", f"launching {st.pending_launch.pod}"), _degraded(st))
        return step.done(again=True)

    pod = observed.pod(st.driver_pod)
    if pod is None or (pod.owner_uid not in (None, observed.uid)):
        return _driver_failed(step, spec, f"driver Pod {st.driver_pod} disappeared")
    if pod.phase == "Failed":
        return _driver_failed(step, spec, pod.failure_text())
    if pod.phase == "Succeeded":
        return _driver_failed(step, spec, pod.failure_text() + " while job.state is running")
    if pod.deleting:
        step.conditions(("False", "DriverTerminating", f"driver Pod {pod.name} is being deleted"),
                        ("True", "DriverTerminating", f"waiting for {pod.name} to terminate"), _degraded(st))
        return step.done(requeue_after=POLL_SECONDS)

    changes = run_affecting_changes(st.last_reconciled_spec, spec)
    if changes:
        return _spec_changed(step, spec, changes)
    for other in observed.others(pod.name):
        # Leftovers of earlier attempts (terminal) or a stray driver: never two.
        if not other.deleting:
            step.act(DeletePod(other.name, 0 if other.terminal else children.TERMINATION_GRACE_SECONDS))
    if pod.phase == "Running":
        return _running(step, pod)
    # Pending or Unknown: the Pod exists but is not running yet.
    if st.lifecycle_state not in ("Restarting", "Upgrading"):
        step.lifecycle("Deploying")
    step.conditions(("False", "Deploying", f"driver Pod {pod.name} is {pod.phase}"),
                    ("True", "DriverStarting", f"waiting for {pod.name} to run"), _degraded(st))
    return step.done(requeue_after=POLL_SECONDS)


# ------------------------------------------------------------------- branches
def _invalid(step: _Step, spec: InvalidSpec) -> Plan:
    st = step.st
    message = spec.message
    ready = get_condition(st.conditions, READY)
    if ready is None or ready.reason != "InvalidSpec" or ready.message != message:
        step.event("Warning", "InvalidSpec", message)
    if not any(not p.terminal for p in step.obs.pods):
        st.lifecycle_state = "Invalid"
    # Nothing else: a running driver keeps running its last valid spec.
    step.conditions(("False", "InvalidSpec", message), ("False", "InvalidSpec", "fix the spec to continue"),
                    ("True", "InvalidSpec", message))
    return step.done()


def _nonce_changed(step: _Step, spec: ExactlyOnceStreamSpec) -> Plan:
    st = step.st
    old = st.observed_restart_nonce
    st.observed_restart_nonce = spec.restart_nonce
    st.restart_count = 0
    st.failure_times = []
    st.last_restart_delay_seconds = None
    st.next_restart_time = None
    st.pending_launch = None
    _abandon_upgrade(st)   # decided again for the restart's launch if the spec still needs one
    if spec.job.state == "suspended":
        step.event("Normal", "RestartRequested",
                   f"restartNonce changed ({old} -> {spec.restart_nonce}): restart counters reset; "
                   "job.state is suspended, so nothing starts")
        return _suspend(step)
    _start_launch(step, "RestartRequested")
    st.lifecycle_state = "Restarting"
    step.event("Normal", "Restarting",
               f"restartNonce changed ({old} -> {spec.restart_nonce}): restart counters reset, "
               f"restarting as {st.pending_launch.pod} (resolution first)")
    step.conditions(("False", "Restarting", "restart requested by restartNonce"),
                    ("True", "Restarting", f"launching {st.pending_launch.pod}"), _degraded(st))
    return step.done(again=True)


def _suspend(step: _Step) -> Plan:
    st = step.st
    st.pending_launch = None
    _abandon_upgrade(st)  # the stop below leaves a snapshot; the resume decides the upgrade again
    st.next_restart_time = None
    pods = step.obs.pods
    if pods:
        for pod in pods:
            if not pod.deleting:
                # SIGTERM: the runtime stops at a clean batch boundary within the grace period.
                step.act(DeletePod(pod.name, 0 if pod.terminal else children.TERMINATION_GRACE_SECONDS))
        names = ", ".join(p.name for p in pods)
        step.conditions(("False", "Suspending", f"stopping {names} at a clean batch boundary"),
                        ("True", "Suspending", f"waiting for {names} to terminate"), _degraded(st))
        return step.done(requeue_after=POLL_SECONDS)
    step.lifecycle("Suspended", ("Suspended", "job.state is suspended: no driver runs; checkpoint kept"))
    st.driver_pod = None
    st.running_since = None
    step.conditions(("False", "Suspended", "job.state is suspended"),
                    ("False", "Suspended", "job.state is suspended"), _degraded(st))
    return step.done()


def _failed(step: _Step) -> Plan:
    st = step.st
    message = st.last_error or "restarts exhausted"
    ready = get_condition(st.conditions, READY)
    # Keep the message written when the restarts ran out (it says which strategy limit).
    keep = ready.message if ready is not None and ready.reason == "RestartsExhausted" else message
    step.conditions(("False", "RestartsExhausted", keep),
                    ("False", "RestartsExhausted", "change spec.restartNonce to resume"),
                    ("True", "RestartsExhausted", message))
    return step.done()


def _running(step: _Step, pod: PodView) -> Plan:
    st = step.st
    step.lifecycle("Running", ("Running", f"driver Pod {pod.name} is running"))
    if st.upgrade_check is None:   # an upgraded spec is stable once it committed a batch (see _check_upgrade)
        st.last_stable_spec = st.last_reconciled_spec
    if st.running_since is None:
        st.running_since = fmt(step.obs.now)
    if step.obs.last_committed_batch is not None:
        st.last_committed_batch = step.obs.last_committed_batch
    _watch_nondeterminism(step)
    st.next_restart_time = None
    progressing: Cond = ("False", "Running", "the driver runs the current spec")
    if st.upgrade_check is not None:
        progressing = ("True", "VerifyingUpgrade", f"waiting for {pod.name} to commit a batch after "
                                                   f"{st.upgrade_check.baseline_batch} (rollback at "
                                                   f"{st.upgrade_check.deadline})")
    elif st.rejected_spec is not None:
        progressing = ("False", "Running", "the driver runs the last stable spec; the current spec was "
                                           + _rejected_text(st.rejected_spec))
    step.conditions(("True", "Running", f"driver Pod {pod.name} is running"), progressing, _degraded(st))
    return step.done(requeue_after=POLL_SECONDS if step.plan.actions or st.upgrade_check else None)


def _spec_changed(step: _Step, spec: ExactlyOnceStreamSpec, changes: list[str], *,
                  not_before: str | None = None) -> Plan:
    """Record the launch and, for an upgrade, the upgrade's write-ahead record; nothing is stopped yet."""
    st, obs = step.st, step.obs
    restoring = "restoreFrom" in changes and spec.restore_from is not None
    if restoring and (obs.restore_source is None or obs.restore_source.path is None):
        return _restore_source_missing(step, spec)
    change = plan_spec_change(changes, spec)
    previous_generation = st.tx_generation
    if change.bump_tx_generation:
        st.tx_generation += 1
    from_pod = st.driver_pod
    _start_launch(step, "SpecChange", not_before=not_before)
    attempt = st.pending_launch.attempt
    if change.kind == "upgrade":
        current = current_checkpoint_dir(st.checkpoint_dir, st.last_reconciled_spec, spec)
        snapshot = st.snapshot_on_stop if change.mode == "snapshot" else None
        st.upgrade = UpgradeProgress(
            mode=change.mode, step="Stopping" if change.mode == "snapshot" else "Stopped",
            target_spec_hash=spec.spec_hash(), from_pod=from_pod,
            snapshot_name=snapshot.rstrip("/").rsplit("/", 1)[-1] if snapshot else None, snapshot_path=snapshot,
            checkpoint_dir=current if change.mode == "last-state" else children.upgrade_checkpoint_dir(spec, attempt),
            restore_from=snapshot, previous_tx_generation=previous_generation, requested_at=fmt(obs.now),
            replay_offsets_from=current if st.last_reconciled_spec else None)
        if restoring:
            # spec.restoreFrom changed: the new driver starts from that snapshot, not from the stop snapshot.
            st.upgrade = st.upgrade.model_copy(update={
                "checkpoint_dir": children.upgrade_checkpoint_dir(spec, attempt),
                "restore_from": obs.restore_source.path, "step": "Stopping" if snapshot else "Stopped",
                "note": f"restoring from {spec.restore_from}"})
        if spec.upgrade_pre_flight and change.mode != "stateless" and st.last_reconciled_spec:
            st.upgrade = st.upgrade.model_copy(update={
                "step": "PreFlight", "pre_flight_pod": children.aux_pod_name(obs.name, children.PREFLIGHT, attempt)})
    st.lifecycle_state = "Upgrading"
    step.event("Normal", "Upgrading", f"{change.explanation}; new driver {st.pending_launch.pod}")
    step.conditions(("False", "Upgrading", change.explanation),
                    ("True", "Upgrading", f"launching {st.pending_launch.pod}"), _degraded(st))
    return step.done(again=True)


def _abandon_upgrade(st: ExactlyOnceStreamStatus) -> None:
    """Forget an upgrade that started no new driver yet (it is decided again if still needed)."""
    if st.upgrade is not None:
        st.tx_generation = st.upgrade.previous_tx_generation
        st.upgrade = None


def _after_stop(step: _Step, spec: ExactlyOnceStreamSpec, up: UpgradeProgress, ready_reason: str,
                degraded_cond: Cond) -> Plan:
    """The old driver is gone: take its snapshot, or decide the fallback. Idempotent: only status changes."""
    st, obs = step.st, step.obs
    launch = st.pending_launch
    snap = obs.snapshot
    # The manifest carries the job runtime's stream id (eos_job.spec.stream_uid), not metadata.uid.
    if snap is not None and snap.stream_uid == stream_uid(obs.namespace, obs.name):
        record = SnapshotRecord(name=up.snapshot_name or snap.path.rsplit("/", 1)[-1], path=snap.path,
                                batch=snap.batch, time=snap.time)
        st.snapshots = ([s for s in st.snapshots if s.name != record.name] + [record])[-SNAPSHOT_HISTORY:]
        st.upgrade = up.model_copy(update={"step": "Stopped"})
        step.act(CreateSnapshot(_snapshot_resource(step, spec, record.name, "upgrade", path=record.path)))
        step.event("Normal", "SnapshotTaken",
                   f"{up.from_pod or 'the driver'} stopped with snapshot {record.name} at batch {record.batch} "
                   f"({record.path}); {launch.pod} starts from it in {up.checkpoint_dir}")
        return step.done(again=True)
    current = current_checkpoint_dir(st.checkpoint_dir, st.last_reconciled_spec, spec)
    if up.restore_from and up.restore_from != up.snapshot_path:
        # A restore (spec.restoreFrom): the new driver starts from that snapshot; a stop snapshot is a bonus.
        st.upgrade = up.model_copy(update={"step": "Stopped"})
        return step.done(again=True)
    if up.snapshot_path and not obs.store_readable:
        note = (f"checkpoint.store {spec.checkpoint.store} cannot be read by the operator: snapshot "
                f"{up.snapshot_path} is not verified; {launch.pod} fails its start if it is missing")
        st.upgrade = up.model_copy(update={"step": "Stopped", "note": note})
        step.event("Warning", "SnapshotUnverified", note)
        return step.done(again=True)
    why = (f"no snapshot was taken ({up.from_pod or 'no driver'} was not stopped gracefully)" if up.snapshot_path
           else "no snapshot can be taken (the last driver was started without a snapshot location)")
    state = obs.checkpoint_state
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
    return _blocked(step)


def _blocked(step: _Step) -> Plan:
    note = step.st.upgrade.note if step.st.upgrade else ""
    step.conditions(("False", "UpgradeBlocked", note),
                    ("False", "UpgradeBlocked", "change spec.upgradeMode to continue"), ("True", "UpgradeBlocked", note))
    return step.done()


def _restart_memory(st: ExactlyOnceStreamStatus) -> RestartMemory:
    times = tuple(parse(t).timestamp() for t in st.failure_times if parse(t) is not None)
    return RestartMemory(restarts=st.restart_count, failure_times=times,
                         last_delay=st.last_restart_delay_seconds)


def _apply_failure(step: _Step, spec: ExactlyOnceStreamSpec, error: str, *, attempt: int | None,
                   failed_reason: str) -> tuple[bool, float, str]:
    """Count one failure by the restart strategy; returns (restart?, delay, explanation)."""
    st = step.st
    now = step.obs.now
    started = parse(st.running_since)
    ran_for = seconds_between(started, now) if started else None
    next_attempt = attempt if attempt is not None else _next_attempt(step)
    decision = decide(spec.restart_strategy, _restart_memory(st), now=utc(now).timestamp(),
                      ran_for_seconds=ran_for, jitter_unit=jitter_unit_for(f"{step.obs.uid}/{next_attempt}"))
    st.last_error = error
    st.running_since = None
    mem = decision.memory
    st.restart_count = mem.restarts
    st.failure_times = [fmt(datetime.fromtimestamp(t, tz=timezone.utc)) for t in mem.failure_times]
    st.last_restart_delay_seconds = mem.last_delay
    step.event("Warning", failed_reason, error)
    return decision.restart, decision.delay_seconds, decision.explanation


def _exhausted(step: _Step, explanation: str) -> Plan:
    st = step.st
    st.pending_launch = None
    st.next_restart_time = None
    st.lifecycle_state = "Failed"
    message = f"{explanation}; last error: {st.last_error}"
    step.event("Warning", "RestartsExhausted",
               f"{message}. Checkpoint and ledger are kept; change spec.restartNonce to resume")
    step.conditions(("False", "RestartsExhausted", message),
                    ("False", "RestartsExhausted", "change spec.restartNonce to resume"),
                    ("True", "RestartsExhausted", st.last_error or ""))
    return step.done()


def _driver_failed(step: _Step, spec: ExactlyOnceStreamSpec, error: str) -> Plan:
    st = step.st
    restart, delay, explanation = _apply_failure(step, spec, error, attempt=None, failed_reason="DriverFailed")
    if not restart:
        return _exhausted(step, explanation)
    not_before = step.obs.now + timedelta(seconds=delay)
    _start_launch(step, "Restart", not_before=fmt_ceil(not_before))
    st.lifecycle_state = "Restarting"
    step.event("Normal", "Restarting", f"{explanation}, as {st.pending_launch.pod}")
    step.conditions(("False", "Restarting", error),
                    ("True", "Restarting", explanation), ("True", "DriverFailed", error))
    return step.done(again=True)


def _next_attempt(step: _Step) -> int:
    st, pods = step.st, step.obs.pods
    if st.driver_pod is None and st.pending_launch is None and st.driver_attempt == 0 and not pods \
            and st.lifecycle_state in ("Created", "Invalid"):
        return 0
    seen = [p.attempt for p in pods if p.attempt is not None]
    return max([st.driver_attempt, *seen]) + 1


def _start_launch(step: _Step, reason: str, *, not_before: str | None = None) -> None:
    """Record the intent to launch a new driver (persisted before anything is done)."""
    st = step.st
    attempt = _next_attempt(step)
    st.pending_launch = PendingLaunch(attempt=attempt,
                                      pod=children.driver_pod_name(step.obs.name, attempt),
                                      reason=reason, requested_at=fmt(step.obs.now), not_before=not_before)
    st.driver_attempt = attempt
    st.next_restart_time = not_before


def _continue_launch(step: _Step, spec: ExactlyOnceStreamSpec, launch: PendingLaunch) -> Plan:
    st, obs = step.st, step.obs
    progressing_reason = {"Restart": "Restarting", "SpecChange": "Upgrading",
                          "RestartRequested": "Restarting"}.get(launch.reason, "Launching")
    degraded = get_condition(st.conditions, DEGRADED)
    degraded_cond: Cond = (degraded.status, degraded.reason, degraded.message) if degraded else _degraded(st)
    ready_reason = "Deploying" if progressing_reason == "Launching" else progressing_reason

    # 1. The restart delay.
    not_before = parse(launch.not_before)
    if not_before is not None and obs.now < not_before:
        wait = seconds_between(obs.now, not_before)
        step.conditions(("False", ready_reason, st.last_error or f"restart at {launch.not_before}"),
                        ("True", progressing_reason, f"{launch.pod} starts at {launch.not_before}"),
                        degraded_cond)
        return step.done(requeue_after=max(wait, 0.1))

    # 2. Never two drivers: every other driver Pod of the stream must be gone first.
    others = [p for p in obs.pods if p.name != launch.pod or p.owner_uid not in (None, obs.uid)]
    if others:
        for pod in others:
            if not pod.deleting:
                step.act(DeletePod(pod.name, 0 if pod.terminal else children.TERMINATION_GRACE_SECONDS))
        names = ", ".join(p.name for p in others)
        up = st.upgrade
        if up is not None and up.step == "Stopping" and up.snapshot_path:
            names += f" (it writes snapshot {up.snapshot_name} at a clean batch boundary)"
        step.conditions(("False", ready_reason, f"stopping {names}"),
                        ("True", "StoppingDriver", f"waiting for {names} to be gone before starting {launch.pod}"),
                        degraded_cond)
        # A finished Pod is removed at once; look again right away instead of at the next tick.
        return step.done(requeue_after=POLL_SECONDS, again=all(p.terminal and not p.deleting for p in others))

    # 3. The Pod exists: the launch happened (maybe by an operator that died right after).
    if obs.pod(launch.pod) is not None:
        st.pending_launch = None
        st.driver_pod = launch.pod
        st.driver_attempt = launch.attempt
        st.next_restart_time = None
        st.running_since = None
        step.event("Normal", "Submitted", f"driver Pod {launch.pod} created (attempt {launch.attempt}, "
                                          f"{launch.reason})")
        if st.lifecycle_state not in ("Restarting", "Upgrading"):
            st.lifecycle_state = "Deploying"
        step.conditions(("False", ready_reason, f"driver Pod {launch.pod} submitted"),
                        ("True", progressing_reason, f"waiting for {launch.pod} to run"), degraded_cond)
        return step.done(again=True)

    # 3b. An upgrade: the old driver is gone; its snapshot, or the fallback, decides where the new one starts.
    if st.upgrade is not None and st.upgrade.step == "Stopping":
        return _after_stop(step, spec, st.upgrade, ready_reason, degraded_cond)

    # 3c. A first start with spec.restoreFrom: a new checkpoint location seeded from that snapshot.
    if st.upgrade is None and spec.restore_from and st.last_reconciled_spec is None:
        src = obs.restore_source
        if src is None or src.path is None:
            return _restore_source_missing(step, spec)
        st.upgrade = UpgradeProgress(mode="snapshot", step="Stopped", target_spec_hash=spec.spec_hash(),
                                     checkpoint_dir=children.upgrade_checkpoint_dir(spec, launch.attempt),
                                     restore_from=src.path, previous_tx_generation=st.tx_generation,
                                     requested_at=fmt(obs.now), note=f"restoring from {spec.restore_from}")
        return step.done(again=True)

    # 3d. An upgrade that does not start from a clean-boundary snapshot first finishes, with the old
    # spec, any batch the old driver left uncommitted (a partially committed batch must not be
    # re-run under another slot count or another job).
    if st.upgrade is not None and _needs_drain(st, st.upgrade):
        return _drain(step, spec, st.upgrade, launch, ready_reason, degraded_cond)

    # 4. Resolution, before every start, for exactly this spec.
    ref = children.StreamRef(obs.name, obs.namespace, obs.uid)
    spec_hash = spec.spec_hash()
    config = launch_config(ref, spec, st)
    if launch.resolved_spec_hash != spec_hash:
        step.act(Resolve(config, launch.attempt, spec_hash))
        step.conditions(("False", ready_reason, "resolving transactions before the start"),
                        ("True", "Resolving", f"fencing and reading the ledger before starting {launch.pod}"),
                        degraded_cond)
        return step.done(again=True)

    # 5. Submit. The status written first names the Pod, the spec it runs and its checkpoint location;
    # the same write closes the upgrade record.
    st.last_reconciled_spec = spec_json(spec)
    st.driver_pod = launch.pod
    st.driver_attempt = launch.attempt
    st.checkpoint_dir = config.checkpoint_dir
    st.restore_from = config.restore_from
    st.replay_offsets_from = config.replay_offsets_from
    st.snapshot_on_stop = children.snapshot_path(ref, spec, launch.attempt)
    if st.upgrade is not None and st.upgrade.note.startswith("restoring from") and spec.restore_from:
        step.event("Normal", "Restored", _restore_text(step, spec, st.upgrade))
        st.restored_from_snapshot = spec.restore_from
    if (st.upgrade is not None and not st.upgrade.rollback and st.upgrade.restore_from
            and st.upgrade.restore_from == st.upgrade.snapshot_path):
        up = st.upgrade
        snap = next((r for r in st.snapshots if r.path == up.snapshot_path), None)
        st.upgrade_check = UpgradeCheck(
            target_spec_hash=spec_hash, pod=launch.pod,
            deadline=fmt_ceil(obs.now + timedelta(seconds=spec.upgrade_readiness_timeout_seconds)),
            baseline_batch=snap.batch if snap else None, rollback_snapshot=up.snapshot_path,
            previous_spec=st.last_stable_spec, previous_tx_generation=up.previous_tx_generation)
    if st.upgrade is not None and st.upgrade.snapshot_path and st.upgrade.restore_from == st.upgrade.snapshot_path:
        # Also here (409 if it exists): an operator killed right after step Stopped did not create it.
        step.act(CreateSnapshot(_snapshot_resource(step, spec, st.upgrade.snapshot_name
                                                   or st.upgrade.snapshot_path.rsplit("/", 1)[-1], "upgrade",
                                                   path=st.upgrade.snapshot_path)))
    if st.upgrade is not None:
        up = st.upgrade
        how = (f"from snapshot {up.snapshot_name} in the new checkpoint location {up.checkpoint_dir}"
               if up.restore_from else
               f"in the fresh checkpoint location {up.checkpoint_dir} (stateless: new checkpoint identity, "
               "nothing skipped by the ledger)" if up.mode == "stateless" and not up.note else
               f"on the checkpoint {up.checkpoint_dir}")
        step.event("Normal", "Upgraded", f"{launch.pod} starts the new spec {how}, transactional-id generation "
                                         f"{st.tx_generation}" + (f"; {up.note}" if up.note else ""))
        st.upgrade = None
    step.act(ApplyConfigMap(children.run_config_map(ref, config)))
    if spec.job.deploy_mode == "cluster":
        step.act(ApplyService(children.driver_service(ref)))
    step.act(CreatePod(children.driver_pod(ref, spec, attempt=launch.attempt, tx_generation=st.tx_generation,
                                           snapshot_on_stop=st.snapshot_on_stop)))
    step.conditions(("False", ready_reason, f"creating {launch.pod}"),
                    ("True", "Submitting", f"creating driver Pod {launch.pod}"), degraded_cond)
    return step.done(again=True)


def launch_config(ref: children.StreamRef, spec: ExactlyOnceStreamSpec, st: ExactlyOnceStreamStatus) -> RunConfig:
    """What the launched driver runs: the upgrade's checkpoint location if one is in flight, else the current one."""
    up = st.upgrade
    if up is not None:
        return children.run_config(ref, spec, st.tx_generation, checkpoint=up.checkpoint_dir,
                                   restore_from=up.restore_from,
                                   replay_offsets_from=up.replay_offsets_from if up.restore_from else None)
    return children.run_config(ref, spec, st.tx_generation,
                               checkpoint=current_checkpoint_dir(st.checkpoint_dir, st.last_reconciled_spec, spec),
                               restore_from=st.restore_from, replay_offsets_from=st.replay_offsets_from)


# ------------------------------------------- upgrade safety: pre-flight, drain, rollback
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
        for key in path[:-1]:
            src, dst = src.get(key) or {}, dst.setdefault(key, {})
        if path[-1] in src:
            dst[path[-1]] = src[path[-1]]
        else:
            dst.pop(path[-1], None)
    try:
        return ExactlyOnceStreamSpec.model_validate(doc)
    except ValueError:
        return spec


def _rejected_text(rejected: RejectedSpec) -> str:
    what = "blocked by pre-flight" if rejected.reason == "PreFlightFailed" else "rolled back"
    return f"{what}: {rejected.message}" if rejected.message else what


def _pre_flight(step: _Step, spec: ExactlyOnceStreamSpec) -> Plan:
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
        step.act(CreatePod(children.aux_pod(
            ref, spec, component=children.PREFLIGHT, attempt=launch.attempt, tx_generation=st.tx_generation,
            args=["preflight", "--config-env", children.RUN_CONFIG_ENV, "--from-checkpoint", source,
                  "--scratch", children.preflight_scratch_dir(spec, launch.attempt)])))
        step.event("Normal", "PreFlight", f"trying the new spec on a scratch copy of {source} "
                                          f"({up.pre_flight_pod}, writes nothing) before stopping {st.driver_pod}")
        step.conditions(running, ("True", "PreFlight", f"{up.pre_flight_pod} checks the new spec"), _degraded(st))
        return step.done(requeue_after=POLL_SECONDS)
    if pod.phase == "Succeeded":
        if not pod.deleting:
            step.act(DeletePod(pod.name, 0))
        st.upgrade = up.model_copy(update={"step": "Stopping" if up.snapshot_path else "Stopped"})
        step.event("Normal", "PreFlightPassed", f"the new spec starts from the current state "
                                                f"({pod.message or 'ok'}); proceeding with the upgrade")
        return step.done(again=True)
    if pod.phase == "Failed":
        if not pod.deleting:
            step.act(DeletePod(pod.name, 0))
        reason = pod.failure_text()
        message = (f"pre-flight of the new spec failed, the old spec keeps running: {reason}. "
                   "Fix the spec (or set upgradeMode: stateless to start without the state)")[:1024]
        _abandon_upgrade(st)
        st.pending_launch = None
        st.rejected_spec = RejectedSpec(spec_hash=up.target_spec_hash, reason="PreFlightFailed", message=message,
                                        time=fmt(obs.now), run_spec=st.last_reconciled_spec)
        st.lifecycle_state = "Running" if driver is not None and driver.phase == "Running" else st.lifecycle_state
        step.event("Warning", "UpgradeBlocked", message)
        # The refusal and its conditions are written together: a reader never sees one without the other.
        ready: Cond = (("True", "Running", f"driver Pod {st.driver_pod} keeps running the current spec")
                       if driver is not None and driver.phase == "Running" else running)
        step.conditions(ready, ("False", "UpgradeBlocked", message), _degraded(st))
        return step.done(again=True)
    step.conditions(running, ("True", "PreFlight", f"{pod.name} is {pod.phase}"), _degraded(st))
    return step.done(requeue_after=POLL_SECONDS)


def _needs_drain(st: ExactlyOnceStreamStatus, up: UpgradeProgress) -> bool:
    return (up.step in ("Stopped", "Draining") and not up.drained and not up.rollback and up.restore_from is None
            and up.mode != "stateless" and st.last_reconciled_spec is not None)


def _drain(step: _Step, spec: ExactlyOnceStreamSpec, up: UpgradeProgress, launch: PendingLaunch,
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
    if pod.phase == "Failed":
        step.act(DeletePod(pod.name, 0))
        restart, delay, explanation = _apply_failure(step, spec, pod.failure_text(), attempt=launch.attempt,
                                                     failed_reason="DrainFailed")
        if not restart:
            return _exhausted(step, explanation)
        not_before = fmt_ceil(obs.now + timedelta(seconds=delay))
        st.pending_launch = launch.model_copy(update={"not_before": not_before})
        st.next_restart_time = not_before
        step.conditions(("False", ready_reason, st.last_error or "drain failed"),
                        ("True", "Draining", f"{explanation}: the drain runs again"), ("True", "DrainFailed",
                                                                                         st.last_error or ""))
        return step.done(requeue_after=max(delay, POLL_SECONDS))
    step.conditions(("False", ready_reason, f"draining with {name}"),
                    ("True", "Draining", f"{name} is {pod.phase}"), degraded_cond)
    return step.done(requeue_after=POLL_SECONDS)


def _idle_since_upgrade(step: _Step, spec: ExactlyOnceStreamSpec, chk: UpgradeCheck, driver: PodView | None,
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


def _check_upgrade(step: _Step, spec: ExactlyOnceStreamSpec) -> Plan | None:
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
    elif due and (idle := _idle_since_upgrade(step, spec, chk, driver, deadline)):
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
    if previous.job.parallelism != spec.job.parallelism:
        # The ledger skips batches per transactional-id generation; across a slot-count change a restore of
        # the older snapshot could write a batch the new driver partly committed again. Never risk that.
        step.event("Warning", "UpgradeNotReady", f"{why}; not rolled back automatically across a job.parallelism "
                   f"change: to roll back, apply the previous spec with restoreFrom: {chk.rollback_snapshot}")
        return None
    message = f"{why}: rolled back to the last stable spec from snapshot {chk.rollback_snapshot}"
    st.rejected_spec = RejectedSpec(spec_hash=chk.target_spec_hash, reason="RolledBack", message=message,
                                    time=fmt(obs.now), run_spec=chk.previous_spec)
    st.pending_launch = None
    _start_launch(step, "Rollback")
    attempt = st.pending_launch.attempt
    st.upgrade = UpgradeProgress(mode="snapshot", step="Stopped", target_spec_hash=previous.spec_hash(),
                                 from_pod=st.driver_pod, snapshot_name=chk.rollback_snapshot.rsplit("/", 1)[-1],
                                 checkpoint_dir=children.upgrade_checkpoint_dir(previous, attempt),
                                 restore_from=chk.rollback_snapshot, previous_tx_generation=st.tx_generation,
                                 rollback=True, requested_at=fmt(obs.now), note="rollback",
                                 replay_offsets_from=current_checkpoint_dir(st.checkpoint_dir,
                                                                            st.last_reconciled_spec, spec))
    st.lifecycle_state = "Upgrading"
    step.event("Warning", "UpgradeRolledBack", f"{message}; new driver {st.pending_launch.pod}")
    step.conditions(("False", "RollingBack", message), ("True", "RollingBack", f"launching {st.pending_launch.pod}"),
                    ("True", "UpgradeRolledBack", message))
    return step.done(again=True)


def _restore_source_missing(step: _Step, spec: ExactlyOnceStreamSpec) -> Plan:
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


def _restore_text(step: _Step, spec: ExactlyOnceStreamSpec, up: UpgradeProgress) -> str:
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


# ----------------------------------------------------------- snapshot resources
def _snapshot_resource(step: _Step, spec: ExactlyOnceStreamSpec, name: str, trigger: str,
                       path: str | None = None) -> dict:
    from .snapshots import snapshot_resource

    return snapshot_resource(step.obs.namespace, step.obs.name, name, trigger, path=path,
                             max_retries=spec.snapshots.max_retries,
                             dispose_on_delete=spec.snapshots.dispose_on_delete)


def _snapshot_housekeeping(step: _Step, spec: ExactlyOnceStreamSpec) -> None:
    """Snapshots asked for by snapshotNonce or snapshots.intervalSeconds, and retention."""
    st, obs = step.st, step.obs
    names = {s.name for s in obs.snapshots}
    if st.observed_snapshot_nonce is None:
        st.observed_snapshot_nonce = spec.snapshot_nonce
    elif st.observed_snapshot_nonce != spec.snapshot_nonce:
        st.observed_snapshot_nonce = spec.snapshot_nonce
        name = children.fitted_name(obs.name, f"-n{spec.snapshot_nonce}")
        if name not in names:
            step.act(CreateSnapshot(_snapshot_resource(step, spec, name, "nonce")))
            step.event("Normal", "SnapshotRequested", f"snapshotNonce changed: snapshot {name} requested")
    interval = spec.snapshots.interval_seconds
    driver = obs.pod(st.driver_pod)
    if (interval and driver is not None and driver.phase == "Running" and st.pending_launch is None
            and st.upgrade is None and spec.job.state == "running"):
        periodic = [s for s in obs.snapshots if s.trigger == "periodic" and parse(s.created) is not None]
        newest = max((parse(s.created) for s in periodic), default=None)
        since = parse(st.running_since)
        due_from = max([t for t in (newest, since) if t is not None], default=None)
        if due_from is not None and seconds_between(due_from, obs.now) >= interval:
            name = children.fitted_name(obs.name, f"-p{int(utc(obs.now).timestamp()) // interval}")
            if name not in names:
                step.act(CreateSnapshot(_snapshot_resource(step, spec, name, "periodic")))
                step.event("Normal", "SnapshotRequested", f"periodic snapshot {name} requested "
                                                          f"(every {interval}s)")
    for name in retention(obs.snapshots, spec, st, obs.now, wanted=obs.wanted_by_others):
        step.act(DeleteSnapshot(name))
        step.event("Normal", "SnapshotPruned", f"snapshot {name} deleted by retention (maxCount "
                                               f"{spec.snapshots.max_count}, maxAgeSeconds "
                                               f"{spec.snapshots.max_age_seconds})")


def retention(snapshots, spec: ExactlyOnceStreamSpec, st: ExactlyOnceStreamStatus, now: datetime,
              wanted: frozenset[str] = frozenset()) -> list[str]:
    """Snapshots to delete: beyond snapshots.maxCount or older than maxAgeSeconds, newest first kept.

    Never deleted: one that is not finished (Pending, InProgress), the newest Completed one, one the
    stream was restored from or would roll back to, the one spec.restoreFrom names, or one another
    stream still has to restore from (``wanted``: names or paths).
    """
    policy = spec.snapshots
    finished = [s for s in snapshots if s.state in ("Completed", "Failed") and not s.deleting]
    finished.sort(key=lambda s: (parse(s.created) or now, s.name), reverse=True)
    completed = [s for s in finished if s.state == "Completed"]
    protected_paths = {p for p in (st.restore_from, st.upgrade.restore_from if st.upgrade else None,
                                   st.upgrade_check.rollback_snapshot if st.upgrade_check else None) if p}
    protected = {completed[0].name} if completed else set()
    protected |= {s.name for s in finished if s.path in protected_paths or s.name == spec.restore_from
                  or s.name in wanted or s.path in wanted}
    out = []
    for i, s in enumerate(finished):
        if s.name in protected:
            continue
        created = parse(s.created)
        too_old = (policy.max_age_seconds is not None and created is not None
                   and seconds_between(created, now) > policy.max_age_seconds)
        if i >= policy.max_count or too_old:
            out.append(s.name)
    return sorted(out)


# ------------------------------------------------- results of the Resolve action
def record_resolution(status: ExactlyOnceStreamStatus, report: ResolutionReport, *, attempt: int,
                      spec_hash: str, observed: Observed) -> tuple[ExactlyOnceStreamStatus, Event | None]:
    """Status after a successful resolution for launch ``attempt``; the Resolved event."""
    st = status.model_copy(deep=True)
    launch = st.pending_launch
    if launch is None or launch.attempt != attempt:
        return st, None  # the launch was cancelled or replaced meanwhile; the report is stale
    st.pending_launch = launch.model_copy(update={"resolved_spec_hash": spec_hash})
    st.resolution = report
    if report.last_complete_batch is not None:
        st.last_committed_batch = report.last_complete_batch
    summary = report.summary or _summarise(report)
    return st, Event("Normal", "Resolved", f"before starting {launch.pod}: {summary}")


def _summarise(r: ResolutionReport) -> str:
    parts = [f"generation {r.generation}, {r.slots} slots", f"fenced {r.fenced_transactional_ids} ids"]
    if not r.checkpoint_readable:
        parts.append("checkpoint not mounted in the operator (read by the driver)")
    if r.open_transactions_aborted:
        parts.append(f"aborted {r.open_transactions_aborted} open transactions")
    if r.last_complete_batch is not None:
        parts.append(f"last complete batch {r.last_complete_batch}")
    if r.replay_batch is not None:
        parts.append(f"replays batch {r.replay_batch}"
                     + (f" (slots {r.replay_slots_already_committed} already committed)"
                        if r.replay_slots_already_committed else ""))
    if r.partially_committed:
        parts.append("partially committed")
    return "; ".join(parts)


def record_resolution_failure(spec: ExactlyOnceStreamSpec, status: ExactlyOnceStreamStatus, error: str, *,
                              attempt: int, observed: Observed) -> Plan:
    """Resolution failed (Kafka unreachable, timeout): a failed start, counted by the restart strategy.

    The launch keeps its attempt and Pod name (no Pod was created), and waits for the
    strategy's delay; exhausted means Failed, as for a failed driver.
    """
    step = _Step(status, observed)
    st = step.st
    launch = st.pending_launch
    if launch is None or launch.attempt != attempt:
        return step.done()
    text = f"resolution before starting {launch.pod} failed: {error}"[:1024]
    restart, delay, explanation = _apply_failure(step, spec, text, attempt=launch.attempt,
                                                 failed_reason="ResolutionFailed")
    if not restart:
        return _exhausted(step, explanation)
    not_before = fmt_ceil(observed.now + timedelta(seconds=delay))
    st.pending_launch = launch.model_copy(update={"not_before": not_before, "resolved_spec_hash": None})
    st.next_restart_time = not_before
    st.lifecycle_state = "Restarting"
    step.event("Normal", "Restarting", f"{explanation}, as {launch.pod}")
    step.conditions(("False", "Restarting", text), ("True", "Restarting", explanation),
                    ("True", "ResolutionFailed", text))
    return step.done(requeue_after=delay, again=False)


# -------------------------------------------------------------------- deletion
def plan_deletion(status: ExactlyOnceStreamStatus, observed: Observed) -> Plan:
    """Stop every driver gracefully, then remove the other children. The checkpoint stays."""
    step = _Step(status, observed)
    if observed.pods:
        for pod in observed.pods:
            if not pod.deleting:
                step.act(DeletePod(pod.name, 0 if pod.terminal else children.TERMINATION_GRACE_SECONDS))
        step.plan.finished = False
        return step.done(requeue_after=POLL_SECONDS)
    step.act(DeleteConfigMap(children.run_config_name(observed.name)))
    for component in (children.PREFLIGHT, children.DRAIN):
        step.act(DeleteConfigMap(children.aux_config_name(observed.name, component)))
    step.act(DeleteService(children.driver_service_name(observed.name)))
    step.plan.finished = True
    return step.done()
