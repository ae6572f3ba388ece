"""The working state of one planning step of a stream, and what every branch of the planner shares.

A step starts from a copy of the stored status and what the observer saw; branches change the
copy, add actions and events, and finish with ``step.done(...)``. Conditions are written three at
a time (Ready, Progressing, Degraded), so no branch forgets one; Reconciling and Stalled (for kstatus)
follow from those three (conditions.kstatus_conditions).
"""
from __future__ import annotations

from typing import Literal

from eos_job.status import ExactlyOnceStreamStatus, RejectedSpec

from .. import __version__ as OPERATOR_VERSION
from .. import children
from ..actions import DeletePod, Step
from ..conditions import (DEGRADED, PROGRESSING, READY, RECONCILING, STALLED, get_condition, kstatus_conditions,
                          set_condition)
from ..observed import Observed
from ..start_failures import past_start_deadline
from ..version_skew import REASON as RUNTIME_SKEW
from ..version_skew import skew_message

POLL_SECONDS = 2.0  # how soon to look again while waiting for a Pod to go or come
SNAPSHOT_HISTORY = 10  # snapshots kept in status.snapshots (the files stay in the store)

Cond = tuple[Literal["True", "False", "Unknown"], str, str]   # as conditions.Cond


class StreamStep(Step):
    """A step of an ExactlyOnceStream: the shared Step plus the stream's conditions and lifecycle state."""

    st: ExactlyOnceStreamStatus
    obs: Observed

    def conditions(self, ready: Cond, progressing: Cond, degraded: Cond) -> None:
        conds = self.st.conditions
        reconciling, stalled = kstatus_conditions(ready, progressing, degraded,
                                                  spec_rejected=self.st.rejected_spec is not None)
        for type_, (status, reason, message) in ((READY, ready), (PROGRESSING, progressing), (DEGRADED, degraded),
                                                 (RECONCILING, reconciling), (STALLED, stalled)):
            conds = set_condition(conds, type_, status, reason, message,
                                  generation=self.obs.generation, now=self.obs.now)
        self.st.conditions = conds

    def lifecycle(self, state: str, event: tuple[str, str] | None = None) -> None:
        """Set the lifecycle state; post ``event`` (reason, message) only on a change."""
        if self.st.lifecycle_state != state and event is not None:
            self.event("Normal", *event)
        self.st.lifecycle_state = state  # type: ignore[assignment]


def kept(step: StreamStep, pod) -> bool:
    """The stream's kept failed driver (``restarts.keep_failed_driver``): ended, so never a second driver,
    and left for its log."""
    failed = step.st.failed_driver
    return (failed is not None and pod.name == failed.pod and pod.terminal
            and pod.owner_uid in (None, step.obs.uid))


def stop_pods(step: StreamStep, pods) -> None:
    """Delete each Pod not already going: a finished one at once, a running one with SIGTERM and the
    grace period in which the runtime stops at a clean batch boundary."""
    for pod in pods:
        if not pod.deleting:
            step.act(DeletePod(pod.name, 0 if pod.terminal else children.TERMINATION_GRACE_SECONDS))


def degraded(st: ExactlyOnceStreamStatus) -> Cond:
    rejected = st.rejected_spec
    if rejected is not None:
        reason = "UpgradeBlocked" if rejected.reason == "PreFlightFailed" else "UpgradeRolledBack"
        return ("True", reason, rejected.message)
    horizon = st.replay_horizon
    if horizon is not None and horizon.state != "Safe":
        return ("True", f"ReplayHorizon{horizon.state}", horizon.message)
    skew = skew_message(OPERATOR_VERSION, st.runtime_version)
    if skew is not None:   # last: the stream runs on, and the others need acting on sooner
        return ("True", RUNTIME_SKEW, skew)
    return ("False", "AsExpected", "")


def rejected_text(rejected: RejectedSpec) -> str:
    what = "blocked by pre-flight" if rejected.reason == "PreFlightFailed" else "rolled back"
    return f"{what}: {rejected.message}" if rejected.message else what


def abandon_upgrade(st: ExactlyOnceStreamStatus) -> None:
    """Forget an upgrade that started no new driver yet (it is decided again if still needed)."""
    if st.upgrade is not None:
        st.tx_generation = st.upgrade.previous_tx_generation
        st.upgrade = None


def watch_nondeterminism(step: StreamStep) -> None:
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


def watch_runtime_version(step: StreamStep) -> None:
    """Record the runtime version the newest batch-complete record names (amendment A3); a Warning when it falls
    outside the version-skew policy (once per version, or once when an upgraded operator first judges it: Degraded
    did not say anything yet), Normal when a record of a runtime inside it follows. Only with a record read: a
    runtime that reports nothing leaves ``runtimeVersion`` unset and is not judged."""
    st, obs = step.st, step.obs
    if obs.last_committed_batch is None:
        return
    before = skew_message(OPERATOR_VERSION, st.runtime_version)
    now = skew_message(OPERATOR_VERSION, obs.runtime_version)
    said = get_condition(st.conditions, DEGRADED)
    if now is not None and (obs.runtime_version != st.runtime_version or said is None or said.status != "True"):
        step.event("Warning", RUNTIME_SKEW, f"{now}; the stream keeps running")
    elif now is None and before is not None:
        step.event("Normal", "RuntimeVersionInPolicy",
                   f"runtime {obs.runtime_version or '(unreported)'} wrote the newest batch: "
                   f"no longer outside the version-skew policy of operator {OPERATOR_VERSION}")
    st.runtime_version = obs.runtime_version


def watch_replay_horizon(step: StreamStep) -> None:
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


def not_starting(pod, spec, now) -> str | None:
    """A Pod of the stream (driver, probe, pre-flight, drain) still not running job.driver.startTimeoutSeconds
    after its creation: why, as a failure text; None while it may still start (start_failures.py)."""
    return past_start_deadline(pod, spec.job.driver.start_timeout_seconds, now)
