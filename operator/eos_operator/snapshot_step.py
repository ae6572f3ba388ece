"""The working state of one planning step of an ExactlyOnceSnapshot, and what its branches share: the Ready
condition, the rule for spec.path, and what happens when a Pod of the snapshot does not start.

Every step ends with the Ready condition (``SnapshotStep.done``): True once Completed, else False with the
state as its reason, unless a branch knows more about the current Pod; Reconciling and Stalled (for kstatus)
follow from it and the state. Those Pods (take, inspect, dispose)
follow the rule every Pod of the operator follows (start_failures.py): one that cannot start is reported
(``SnapshotStartBlocked``, the cause in the message, one event per cause) and fails at the stream's
``job.driver.startTimeoutSeconds``; a create the API server refuses is ``Refused`` with the server's message,
one event, and tried again after a pause (``status.nextAttemptTime``) without counting a failed attempt.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal

from eos_job.snapshot_resource import ExactlyOnceSnapshotStatus, SnapshotSpec
from eos_job.spec_rules import store_problem

from .actions import Event, Plan, Step
from .conditions import READY, RECONCILING, STALLED, get_condition, set_condition, snapshot_kstatus_conditions
from .observed import PodView
from .snapshots import MAX_MESSAGE, SnapshotObserved, StreamFacts
from .start_failures import (DEFAULT_START_TIMEOUT, REFUSED_REASON, REFUSED_RETRY_SECONDS, refusal_text,
                             report_blocked)
from .timeutil import fmt_ceil, parse, seconds_between
from .validation import InvalidSpec

SNAPSHOT_BLOCKED = "SnapshotStartBlocked"   # Ready=False: the snapshot's current Pod cannot start

Cond = tuple[Literal["True", "False", "Unknown"], str, str]


class SnapshotStep(Step):
    st: ExactlyOnceSnapshotStatus
    obs: SnapshotObserved
    max_message = MAX_MESSAGE
    ready: Cond | None = None   # set by a branch that knows more than the state: a blocked or refused Pod

    def done(self, **kw: Any) -> Plan:
        status, reason, message = self.ready or _ready(self.st, self.obs)
        write_conditions(self.st, (status, reason, message[:MAX_MESSAGE]), self.obs)
        return super().done(**kw)


def write_conditions(st: ExactlyOnceSnapshotStatus, ready: Cond, obs: SnapshotObserved) -> None:
    """Ready, and after it Reconciling and Stalled for kstatus (conditions.snapshot_kstatus_conditions)."""
    reconciling, stalled = snapshot_kstatus_conditions(st.state, ready, deleting=obs.deleting)
    for type_, (status, reason, message) in ((READY, ready), (RECONCILING, reconciling), (STALLED, stalled)):
        st.conditions = set_condition(st.conditions, type_, status, reason, message,
                                      generation=obs.generation, now=obs.now)


def _ready(st: ExactlyOnceSnapshotStatus, obs: SnapshotObserved) -> Cond:
    if obs.deleting:
        return ("False", "Deleting", st.message)
    return ("True" if st.state == "Completed" else "False", st.state, st.message)


def path_problem(spec: SnapshotSpec, facts: StreamFacts | InvalidSpec | None) -> str | None:
    """spec.path must lie in the stream's store (spec_rules.store_problem): the snapshot's Pods run with the
    stream's volume and keys, which must not copy to, inspect or dispose of anything else."""
    if spec.path is None or not isinstance(facts, StreamFacts):
        return None
    problem = store_problem(facts.spec.checkpoint, spec.path)
    return f"spec.path: {problem}" if problem else None


# ------------------------------------------------- Pods that do not start
def start_timeout(facts: StreamFacts | InvalidSpec | None) -> int:
    """The deadline of the snapshot's Pods: the stream's job.driver.startTimeoutSeconds (its default once the
    stream is gone or invalid)."""
    return facts.spec.job.driver.start_timeout_seconds if isinstance(facts, StreamFacts) else DEFAULT_START_TIMEOUT


def blocked(step: SnapshotStep, what: str, pod: PodView, timeout: int) -> None:
    """A Pod of the snapshot cannot start (``pod.blocked``): Ready and the message say why, one event per cause."""
    message = report_blocked(step, step.st.conditions, SNAPSHOT_BLOCKED, what, pod, timeout)
    step.st.message = message
    step.ready = ("False", SNAPSHOT_BLOCKED, message)


def record_refusal(status: ExactlyOnceSnapshotStatus, what: str, error: str,
                   observed: SnapshotObserved) -> tuple[ExactlyOnceSnapshotStatus, Event | None]:
    """Status after the API server refused ``what`` (a Pod of the snapshot) for good: Ready=False Refused with
    the server's message, the create tried again after REFUSED_RETRY_SECONDS (the same attempt, not counted
    as a failure); one event per distinct refusal."""
    st = status.model_copy(deep=True)
    message = refusal_text(what, error)[:MAX_MESSAGE]
    ready = get_condition(st.conditions, READY)
    same = ready is not None and ready.reason == REFUSED_REASON and ready.message == message
    write_conditions(st, ("False", REFUSED_REASON, message), observed)
    st.next_attempt_time = fmt_ceil(observed.now + timedelta(seconds=REFUSED_RETRY_SECONDS))
    st.last_error = st.message = message
    return st, None if same else Event("Warning", REFUSED_REASON, message)


def refusal_pause(step: SnapshotStep, *, finished: bool = True) -> Plan | None:
    """Before a create, after a refused one: wait until status.nextAttemptTime, then create again with Ready
    still Refused (the same refusal again posts no second event). None: nothing refused, or the pause is over."""
    st, obs = step.st, step.obs
    ready = get_condition(st.conditions, READY)
    if ready is None or ready.reason != REFUSED_REASON:
        return None
    step.ready = ("False", REFUSED_REASON, ready.message)
    not_before = parse(st.next_attempt_time)
    if not_before is not None and obs.now < not_before:
        return step.done(requeue_after=max(seconds_between(obs.now, not_before), 0.1), finished=finished)
    st.next_attempt_time = None
    return None
