"""The stream planner's entry point: ``plan(spec, status, observed) -> Plan``. Pure: no I/O, no clock,
no randomness.

A plan is the new status to persist *first* (the write-ahead log), then the side effects to carry
out, the events to post, and when to look again. One call decides one step; the reconcile loop
persists the status, acts, observes again and calls ``plan`` again while ``again`` is set.

Every call first does what applies in any state (validation, restartNonce, a rejected spec, snapshot
housekeeping, the replay horizon), then suspension and the check of a fresh upgrade, and then
dispatches on one :class:`ReconciliationState`, derived from status and observations alone::

    Created --launch--> LAUNCHING --Pod seen--> DRIVER_STARTING --runs--> RUNNING
                            ^                                        |  |
                            |      (restart strategy)                |  +--spec changed--> SPEC_CHANGED
                            +------------- DRIVER_FAILED <-----------+         |
                            |              DRIVER_GONE                         v
                            |                  | exhausted           PRE_FLIGHT --refused--> RUNNING (old spec)
                            |                  v                               |
                            +---restartNonce-- FAILED   UPGRADE_BLOCKED <------+--> LAUNCHING (upgrade)

    NO_DRIVER (created or resumed) --> LAUNCHING;  DRIVER_TERMINATING waits for the Pod to go.
    DRIVER_NODE_LOST waits NODE_LOSS_GRACE_SECONDS, then --> LAUNCHING with the old Pod still there (node_loss.py).

launch.py walks a launch through its steps, upgrade.py an upgrade's, restarts.py applies the
restart strategy, housekeeping.py asks for snapshots and prunes them. Last, in any state, spark_ui.py adds the
Spark UI Service's actions after the branch's (``job.metrics.uiService``).
"""
from __future__ import annotations

from enum import Enum

from eos_job.memory import driver_split_of
from eos_job.spec import ExactlyOnceStreamSpec
from eos_job.status import ExactlyOnceStreamStatus

from ..actions import Plan
from ..conditions import READY, get_condition
from ..observed import Observed, PodView
from ..start_failures import report_blocked
from ..timeutil import fmt, parse, seconds_between
from ..upgrades import classify, run_affecting_changes
from ..validation import InvalidSpec
from .housekeeping import snapshot_housekeeping
from .launch import continue_launch, plan_deletion
from .node_loss import driver_node_lost, lost_node
from .spark_ui import plan_ui_service
from .restarts import (REFUSALS, batch_refused, driver_evicted, driver_failed, keep_failed_driver,
                       release_failed_driver, start_launch)
from .step import (POLL_SECONDS, Cond, StreamStep, abandon_upgrade, degraded, kept, not_starting, rejected_text,
                   stop_pods, watch_nondeterminism, watch_replay_horizon, watch_runtime_version)
from .upgrade import blocked, check_upgrade, overlay_spec, pre_flight, spec_changed

DRIVER_BLOCKED = "DriverStartBlocked"   # Ready=False: the driver Pod cannot start (start_failures.py)


class ReconciliationState(Enum):
    """Where a stream stands, from its status and what was observed; each has one branch below."""
    PRE_FLIGHT = "an upgrade's pre-flight Pod checks the new spec"
    UPGRADE_BLOCKED = "an upgrade cannot proceed until upgradeMode changes"
    LAUNCHING = "a launch (start, restart, upgrade, rollback) is in flight"
    FAILED = "restarts are exhausted"
    NO_DRIVER = "no driver and none launched: created or resumed"
    DRIVER_GONE = "the driver Pod disappeared"
    DRIVER_FAILED = "the driver Pod ended"
    DRIVER_NODE_LOST = "the driver Pod's node is NotReady or gone"
    DRIVER_TERMINATING = "the driver Pod is being deleted"
    SPEC_CHANGED = "the driver runs an older spec"
    RUNNING = "the driver runs the current spec"
    DRIVER_STARTING = "the driver Pod exists but does not run yet"


def reconciliation_state(spec: ExactlyOnceStreamSpec, st: ExactlyOnceStreamStatus,
                         observed: Observed) -> ReconciliationState:
    up = st.upgrade
    if up is not None and up.step == "PreFlight":
        return ReconciliationState.PRE_FLIGHT
    if up is not None and up.step == "Blocked":
        return ReconciliationState.UPGRADE_BLOCKED
    if st.pending_launch is not None:
        return ReconciliationState.LAUNCHING
    if st.lifecycle_state == "Failed":
        return ReconciliationState.FAILED
    if st.driver_pod is None:
        return ReconciliationState.NO_DRIVER
    pod = observed.pod(st.driver_pod)
    if pod is None or (pod.owner_uid not in (None, observed.uid)):
        return ReconciliationState.DRIVER_GONE
    if pod.phase in ("Failed", "Succeeded"):
        return ReconciliationState.DRIVER_FAILED
    if lost_node(observed, pod) is not None:
        return ReconciliationState.DRIVER_NODE_LOST
    if pod.deleting:
        return ReconciliationState.DRIVER_TERMINATING
    if run_affecting_changes(st.last_reconciled_spec, spec):
        return ReconciliationState.SPEC_CHANGED
    if pod.phase == "Running":
        return ReconciliationState.RUNNING
    return ReconciliationState.DRIVER_STARTING


# --------------------------------------------------------------------- entry
def plan(spec: ExactlyOnceStreamSpec | InvalidSpec, status: ExactlyOnceStreamStatus,
         observed: Observed) -> Plan:
    if observed.deleting:
        return plan_deletion(status, observed)
    step = StreamStep(status, observed)
    step.st.observed_generation = observed.generation
    if isinstance(spec, InvalidSpec):
        return invalid(step, spec)
    return plan_ui_service(observed, spec, _plan_valid(step, spec))


def _plan_valid(step: StreamStep, spec: ExactlyOnceStreamSpec) -> Plan:
    st, observed = step.st, step.obs

    # A changed restartNonce resets the restart counters and restarts the driver.
    if st.observed_restart_nonce is None:
        st.observed_restart_nonce = spec.restart_nonce
    elif st.observed_restart_nonce != spec.restart_nonce:
        return nonce_changed(step, spec)

    if st.rejected_spec is not None and st.rejected_spec.spec_hash != spec.spec_hash():
        step.event("Normal", "SpecChanged", f"the spec changed since it was {rejected_text(st.rejected_spec)}: "
                                            "applying the new spec")
        st.rejected_spec = None
    if st.rejected_spec is not None:
        spec = overlay_spec(st.rejected_spec.run_spec, spec)   # the last stable spec keeps running

    snapshot_housekeeping(step, spec)
    watch_replay_horizon(step)

    if spec.job.state == "suspended":
        return suspend(step)

    if st.upgrade_check is not None:
        rolled = check_upgrade(step, spec)
        if rolled is not None:
            return rolled

    # An upgrade waiting in pre-flight or blocked for a spec that changed again is decided afresh.
    up = st.upgrade
    if up is not None and up.step in ("PreFlight", "Blocked") and spec.spec_hash() != up.target_spec_hash:
        abandon_upgrade(st)
        if up.step == "PreFlight":
            st.pending_launch = None

    state = reconciliation_state(spec, st, observed)
    return _BRANCHES[state](step, spec)


# ------------------------------------------------------------------- branches
def _launching(step: StreamStep, spec: ExactlyOnceStreamSpec) -> Plan:
    st = step.st
    launch = st.pending_launch
    if st.upgrade is None and launch.reason != "SpecChange":
        # A restart or resume that would start a changed spec is an upgrade, never a silent restart.
        changes = run_affecting_changes(st.last_reconciled_spec, spec)
        if any(classify(c) == "upgrade" for c in changes):
            return spec_changed(step, spec, changes, not_before=launch.not_before)
    return continue_launch(step, spec, launch)


def _failed_or_changed(step: StreamStep, spec: ExactlyOnceStreamSpec) -> Plan:
    changes = run_affecting_changes(step.st.last_reconciled_spec, spec)
    if changes:
        return spec_changed(step, spec, changes)
    return failed(step)


def _no_driver(step: StreamStep, spec: ExactlyOnceStreamSpec) -> Plan:
    st = step.st
    if st.lifecycle_state == "Suspended":
        start_launch(step, "Resume")
        step.lifecycle("Deploying")
        step.event("Normal", "Resumed", "job.state is running: resuming (resolution first)")
    else:
        start_launch(step, "Create")
        step.lifecycle("Deploying")
    step.conditions(("False", "Deploying", "launching the driver"),
                    ("True", "Launching", f"launching {st.pending_launch.pod}"), degraded(st))
    return step.done(again=True)


def _evicted(step: StreamStep, pod) -> bool:
    """The driver was evicted: seen so (its DisruptionTarget condition), or seen so while it terminated."""
    if pod is not None and pod.evicted:
        return True
    seen = get_condition(step.st.conditions, "Progressing")
    return (seen is not None and seen.reason == "DriverEvicted"
            and f"{step.st.driver_pod} " in (seen.message or ""))


def _driver_gone(step: StreamStep, spec: ExactlyOnceStreamSpec) -> Plan:
    if _evicted(step, None):
        return driver_evicted(step, step.st.driver_pod)
    return driver_failed(step, spec, f"driver Pod {step.st.driver_pod} disappeared")


def _driver_ended(step: StreamStep, spec: ExactlyOnceStreamSpec) -> Plan:
    pod = step.obs.pod(step.st.driver_pod)
    if _evicted(step, pod) and pod.summary_reason not in REFUSALS:
        return driver_evicted(step, pod.name)
    # Kept for its log; in cluster deploy mode not: its executor Pods are owned by it and would stay too.
    hint = keep_failed_driver(step, pod.name) if spec.job.deploy_mode != "cluster" else ""
    # Killed by the kernel at its limit: the field to raise, in status (lastError) as in the event.
    advice = (f"the container passed its memory limit, job.driver.memory {spec.job.driver.memory} "
              f"({driver_split_of(spec).describe()}): raise job.driver.memory") if pod.reason == "OOMKilled" else ""
    if pod.summary_reason in REFUSALS:
        return batch_refused(step, pod.failure_text(), pod.summary_reason)
    if pod.phase == "Failed":
        return driver_failed(step, spec, pod.failure_text(advice), hint)
    return driver_failed(step, spec, pod.failure_text(advice) + " while job.state is running", hint)


def _driver_terminating(step: StreamStep, spec: ExactlyOnceStreamSpec) -> Plan:
    pod = step.obs.pod(step.st.driver_pod)
    if pod.evicted:
        text = f"driver Pod {pod.name} evicted (drain): stopping at a batch boundary, then a new driver"
        seen = get_condition(step.st.conditions, "Progressing")
        if seen is None or seen.reason != "DriverEvicted":
            step.event("Normal", "DriverEvicting", text)
        step.conditions(("False", "DriverEvicted", text), ("True", "DriverEvicted", text), degraded(step.st))
        return step.done(requeue_after=POLL_SECONDS)
    step.conditions(("False", "DriverTerminating", f"driver Pod {pod.name} is being deleted"),
                    ("True", "DriverTerminating", f"waiting for {pod.name} to terminate"), degraded(step.st))
    return step.done(requeue_after=POLL_SECONDS)


def _spec_changed(step: StreamStep, spec: ExactlyOnceStreamSpec) -> Plan:
    return spec_changed(step, spec, run_affecting_changes(step.st.last_reconciled_spec, spec))


def _driver_up(step: StreamStep, spec: ExactlyOnceStreamSpec) -> Plan:
    """RUNNING or DRIVER_STARTING: leftovers of earlier attempts (terminal) or a stray driver go; never two."""
    st = step.st
    pod = step.obs.pod(st.driver_pod)
    stop_pods(step, [p for p in step.obs.others(pod.name) if not kept(step, p)])
    if pod.phase == "Running":
        return running(step, pod)
    # Pending or Unknown: the Pod exists but is not running yet; past its start deadline it failed.
    stuck = not_starting(pod, spec, step.obs.now)
    if stuck:
        return driver_failed(step, spec, f"driver {stuck}")
    timeout = spec.job.driver.start_timeout_seconds
    created = parse(pod.created_at)
    age = seconds_between(created, step.obs.now) if created is not None else 0.0
    if st.lifecycle_state not in ("Restarting", "Upgrading"):
        step.lifecycle("Deploying")
    if pod.blocked:
        message = report_blocked(step, st.conditions, DRIVER_BLOCKED, "driver", pod, timeout)
        step.conditions(("False", DRIVER_BLOCKED, message),
                        ("True", "DriverStarting", f"waiting for {pod.name} to run, at most "
                                                   f"{timeout - age:.0f}s more"), degraded(st))
    else:
        step.conditions(("False", "Deploying", f"driver Pod {pod.name} is {pod.phase}"),
                        ("True", "DriverStarting", f"waiting for {pod.name} to run"), degraded(st))
    return step.done(requeue_after=min(POLL_SECONDS * 5 if pod.blocked else POLL_SECONDS, max(timeout - age, 0.1)))


def invalid(step: StreamStep, spec: InvalidSpec) -> Plan:
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


def nonce_changed(step: StreamStep, spec: ExactlyOnceStreamSpec) -> Plan:
    st = step.st
    old = st.observed_restart_nonce
    st.observed_restart_nonce = spec.restart_nonce
    st.restart_count = 0
    st.failure_times = []
    st.last_restart_delay_seconds = None
    st.next_restart_time = None
    st.pending_launch = None
    abandon_upgrade(st)   # decided again for the restart's launch if the spec still needs one
    if spec.job.state == "suspended":
        step.event("Normal", "RestartRequested",
                   f"restartNonce changed ({old} -> {spec.restart_nonce}): restart counters reset; "
                   "job.state is suspended, so nothing starts")
        return suspend(step)
    start_launch(step, "RestartRequested")
    st.lifecycle_state = "Restarting"
    step.event("Normal", "Restarting",
               f"restartNonce changed ({old} -> {spec.restart_nonce}): restart counters reset, "
               f"restarting as {st.pending_launch.pod} (resolution first)")
    step.conditions(("False", "Restarting", "restart requested by restartNonce"),
                    ("True", "Restarting", f"launching {st.pending_launch.pod}"), degraded(st))
    return step.done(again=True)


def suspend(step: StreamStep) -> Plan:
    st = step.st
    st.pending_launch = None
    abandon_upgrade(st)  # the stop below leaves a snapshot; the resume decides the upgrade again
    st.next_restart_time = None
    pods = step.obs.pods
    if pods:
        stop_pods(step, pods)   # SIGTERM: the runtime stops at a clean batch boundary within the grace period
        names = ", ".join(p.name for p in pods)
        step.conditions(("False", "Suspending", f"stopping {names} at a clean batch boundary"),
                        ("True", "Suspending", f"waiting for {names} to terminate"), degraded(st))
        return step.done(requeue_after=POLL_SECONDS)
    step.lifecycle("Suspended", ("Suspended", "job.state is suspended: no driver runs; checkpoint kept"))
    st.driver_pod = None
    st.running_since = None
    step.conditions(("False", "Suspended", "job.state is suspended"),
                    ("False", "Suspended", "job.state is suspended"), degraded(st))
    return step.done()


def failed(step: StreamStep) -> Plan:
    st = step.st
    message = st.last_error or "restarts exhausted"
    ready = get_condition(st.conditions, READY)
    if ready is not None and ready.reason in REFUSALS:
        return step.done()   # failed without restarts: its conditions already say what to do
    # Keep the message written when the restarts ran out (it says which strategy limit).
    keep = ready.message if ready is not None and ready.reason == "RestartsExhausted" else message
    step.conditions(("False", "RestartsExhausted", keep),
                    ("False", "RestartsExhausted", "change spec.restartNonce to resume"),
                    ("True", "RestartsExhausted", message))
    return step.done()


def running(step: StreamStep, pod: PodView) -> Plan:
    st = step.st
    step.lifecycle("Running", ("Running", f"driver Pod {pod.name} is running"))
    if st.upgrade_check is None:   # an upgraded spec is stable once it committed a batch (see check_upgrade)
        st.last_stable_spec = st.last_reconciled_spec
    if st.running_since is None:
        st.running_since = fmt(step.obs.now)
    if step.obs.last_committed_batch is not None:
        st.last_committed_batch = step.obs.last_committed_batch
    release_failed_driver(step)
    watch_nondeterminism(step)
    watch_runtime_version(step)
    st.next_restart_time = None
    progressing: Cond = ("False", "Running", "the driver runs the current spec")
    if st.upgrade_check is not None:
        progressing = ("True", "VerifyingUpgrade", f"waiting for {pod.name} to commit a batch after "
                                                   f"{st.upgrade_check.baseline_batch} (rollback at "
                                                   f"{st.upgrade_check.deadline})")
    elif st.rejected_spec is not None:
        progressing = ("False", "Running", "the driver runs the last stable spec; the current spec was "
                                           + rejected_text(st.rejected_spec))
    step.conditions(("True", "Running", f"driver Pod {pod.name} is running"), progressing, degraded(st))
    return step.done(requeue_after=POLL_SECONDS if step.plan.actions or st.upgrade_check else None)


_BRANCHES = {
    ReconciliationState.PRE_FLIGHT: pre_flight,
    ReconciliationState.UPGRADE_BLOCKED: lambda step, spec: blocked(step),
    ReconciliationState.LAUNCHING: _launching,
    ReconciliationState.FAILED: _failed_or_changed,
    ReconciliationState.NO_DRIVER: _no_driver,
    ReconciliationState.DRIVER_GONE: _driver_gone,
    ReconciliationState.DRIVER_FAILED: _driver_ended,
    ReconciliationState.DRIVER_NODE_LOST: driver_node_lost,
    ReconciliationState.DRIVER_TERMINATING: _driver_terminating,
    ReconciliationState.SPEC_CHANGED: _spec_changed,
    ReconciliationState.RUNNING: _driver_up,
    ReconciliationState.DRIVER_STARTING: _driver_up,
}
