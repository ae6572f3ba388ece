"""Failures and launches: the restart strategy applied to a failure, and the intent to launch a driver.

A launch is recorded in ``status.pendingLaunch`` (attempt and Pod name fixed) before anything is
done, so an operator killed mid-launch continues the same one (see launch.py).
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from eos_job.spec import ExactlyOnceStreamSpec
from eos_job.status import ExactlyOnceStreamStatus, FailedDriver, PendingLaunch

from .. import children
from ..actions import DeletePod, Plan
from ..observed import Observed
from ..restart import RestartMemory, decide, jitter_unit_for
from ..timeutil import fmt, fmt_ms_ceil, parse, seconds_between, utc
from .step import POLL_SECONDS, Cond, StreamStep, degraded


def restart_memory(st: ExactlyOnceStreamStatus) -> RestartMemory:
    times = tuple(parse(t).timestamp() for t in st.failure_times if parse(t) is not None)
    return RestartMemory(restarts=st.restart_count, failure_times=times,
                         last_delay=st.last_restart_delay_seconds)


def apply_failure(step: StreamStep, spec: ExactlyOnceStreamSpec, error: str, *, attempt: int | None,
                   failed_reason: str, hint: str = "") -> tuple[bool, float, str]:
    """Count one failure by the restart strategy; returns (restart?, delay, explanation). ``hint`` goes into
    the event only (where to read more)."""
    st = step.st
    now = step.obs.now
    started = parse(st.running_since)
    ran_for = seconds_between(started, now) if started else None
    this_attempt = attempt if attempt is not None else next_attempt(step)
    decision = decide(spec.restart_strategy, restart_memory(st), now=utc(now).timestamp(),
                      ran_for_seconds=ran_for, jitter_unit=jitter_unit_for(f"{step.obs.uid}/{this_attempt}"))
    st.last_error = error
    st.running_since = None
    mem = decision.memory
    st.restart_count = mem.restarts
    st.failure_times = [fmt(datetime.fromtimestamp(t, tz=timezone.utc)) for t in mem.failure_times]
    st.last_restart_delay_seconds = mem.last_delay
    step.event("Warning", failed_reason, error + hint)
    return decision.restart, decision.delay_seconds, decision.explanation


def aux_failed(step: StreamStep, spec: ExactlyOnceStreamSpec, launch: PendingLaunch, error: str, *,
               failed_reason: str, progressing: str, what: str, ready_reason: str,
               degraded_cond: Cond | None) -> Plan:
    """A launch's short-lived Pod (drain, probe) failed: one failure under the restart strategy, and the same
    launch runs it again after the strategy's delay (or the stream fails when the strategy is exhausted).
    ``degraded_cond`` None: Degraded with ``failed_reason`` and the error."""
    st, obs = step.st, step.obs
    restart, delay, explanation = apply_failure(step, spec, error, attempt=launch.attempt,
                                                failed_reason=failed_reason)
    if not restart:
        return exhausted(step, explanation)
    not_before = fmt_ms_ceil(obs.now + timedelta(seconds=delay))
    st.pending_launch = (st.pending_launch or launch).model_copy(update={"not_before": not_before})
    st.next_restart_time = not_before
    step.conditions(("False", ready_reason, st.last_error or f"{what} failed"),
                    ("True", progressing, f"{explanation}: {what} runs again"),
                    degraded_cond or ("True", failed_reason, st.last_error or ""))
    return step.done(requeue_after=max(delay, POLL_SECONDS))


def exhausted(step: StreamStep, explanation: str) -> Plan:
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


BATCH_REFUSED = "BatchRefused"
SPEC_REFUSED = "InvalidSpec"     # the driver found the job's plan contradicting the spec (eos_job SpecRefused)
REFUSALS = (BATCH_REFUSED, SPEC_REFUSED)
_REFUSAL_HINTS = {
    BATCH_REFUSED: ("restore a snapshot taken after that batch, or finish the batch with the spec that started "
                    "it, then change spec.restartNonce"),
    SPEC_REFUSED: "change the field the message names; the spec change starts the stream again",
}


def batch_refused(step: StreamStep, error: str, reason: str = BATCH_REFUSED) -> Plan:
    """The driver refused a batch whose number the ledger knows as another input or another spec's, or a
    spec its job's plan contradicts (``reason`` InvalidSpec): a restart would refuse again, so the stream
    fails at once (no restart is counted), with what to do. Nothing of that batch was written; checkpoint
    and ledger are kept."""
    st = step.st
    st.pending_launch = None
    st.next_restart_time = None
    st.running_since = None
    st.last_error = error
    st.lifecycle_state = "Failed"
    hint = _REFUSAL_HINTS[reason]
    step.event("Warning", reason, f"{error}. {hint}")
    step.conditions(("False", reason, error), ("False", reason, hint), ("True", reason, error))
    return step.done()


def keep_failed_driver(step: StreamStep, pod_name: str) -> str:
    """Keep the driver Pod that just ended (not deleted at the next launch) until a later driver commits a
    batch beyond this one's last (``release_failed_driver``); returns where its log is, for the event."""
    st, obs = step.st, step.obs
    st.failed_driver = FailedDriver(pod=pod_name, batch=st.last_committed_batch, time=fmt(obs.now))
    return f". Its log stays until a later driver commits a batch: kubectl logs -n {obs.namespace} {pod_name}"


def release_failed_driver(step: StreamStep) -> None:
    """The running driver committed a batch beyond the failed one's last: the kept Pod goes."""
    st, obs = step.st, step.obs
    failed = st.failed_driver
    if failed is None or obs.last_committed_batch is None:
        return
    if failed.batch is not None and obs.last_committed_batch <= failed.batch:
        return
    pod = obs.pod(failed.pod)
    if pod is not None and not pod.deleting:
        step.act(DeletePod(pod.name, 0))
    st.failed_driver = None


def driver_failed(step: StreamStep, spec: ExactlyOnceStreamSpec, error: str, hint: str = "",
                  failed_reason: str = "DriverFailed") -> Plan:
    st = step.st
    restart, delay, explanation = apply_failure(step, spec, error, attempt=None, failed_reason=failed_reason,
                                                hint=hint)
    if not restart:
        return exhausted(step, explanation)
    not_before = step.obs.now + timedelta(seconds=delay)
    start_launch(step, "Restart", not_before=fmt_ms_ceil(not_before))
    st.lifecycle_state = "Restarting"
    step.event("Normal", "Restarting", f"{explanation}, as {st.pending_launch.pod}")
    step.conditions(("False", "Restarting", error),
                    ("True", "Restarting", explanation), ("True", "DriverFailed", error))
    return step.done(again=True)


def driver_evicted(step: StreamStep, pod_name: str) -> Plan:
    """The driver was evicted (``kubectl drain``, the Eviction API): a planned stop, not a failure. The kubelet
    sent SIGTERM, the runtime stopped at a batch boundary; no attempt is consumed, no failure time recorded, and
    the new driver starts at once wherever the scheduler places it (the drained node is cordoned)."""
    st = step.st
    start_launch(step, "Restart")   # the launch reason enum (CRD) has no Evicted; events and conditions say it
    st.lifecycle_state = "Restarting"
    text = (f"driver Pod {pod_name} was evicted (drain): a planned stop, not counted by the restart strategy; "
            f"restarting as {st.pending_launch.pod}")
    step.event("Normal", "DriverEvicted", text)
    step.conditions(("False", "DriverEvicted", text), ("True", "DriverEvicted", text), degraded(st))
    return step.done(again=True)


def next_attempt(step: StreamStep) -> int:
    st, pods = step.st, step.obs.pods
    if st.driver_pod is None and st.pending_launch is None and st.driver_attempt == 0 and not pods \
            and st.lifecycle_state in ("Created", "Invalid"):
        return 0
    seen = [p.attempt for p in pods if p.attempt is not None]
    return max([st.driver_attempt, *seen]) + 1


def start_launch(step: StreamStep, reason: str, *, not_before: str | None = None) -> None:
    """Record the intent to launch a new driver (persisted before anything is done)."""
    st = step.st
    attempt = next_attempt(step)
    st.pending_launch = PendingLaunch(attempt=attempt,
                                      pod=children.driver_pod_name(step.obs.name, attempt),
                                      reason=reason, requested_at=fmt(step.obs.now), not_before=not_before)
    st.driver_attempt = attempt
    st.next_restart_time = not_before


def record_resolution_failure(spec: ExactlyOnceStreamSpec, status: ExactlyOnceStreamStatus, error: str, *,
                              attempt: int, observed: Observed) -> Plan:
    """Resolution failed (Kafka unreachable, timeout): a failed start, counted by the restart strategy.

    The launch keeps its attempt and Pod name (no Pod was created), and waits for the
    strategy's delay; exhausted means Failed, as for a failed driver.
    """
    step = StreamStep(status, observed)
    st = step.st
    launch = st.pending_launch
    if launch is None or launch.attempt != attempt:
        return step.done()
    text = f"resolution before starting {launch.pod} failed: {error}"[:1024]
    restart, delay, explanation = apply_failure(step, spec, text, attempt=launch.attempt,
                                                 failed_reason="ResolutionFailed")
    if not restart:
        return exhausted(step, explanation)
    not_before = fmt_ms_ceil(observed.now + timedelta(seconds=delay))
    st.pending_launch = launch.model_copy(update={"not_before": not_before, "resolved_spec_hash": None})
    st.next_restart_time = not_before
    st.lifecycle_state = "Restarting"
    step.event("Normal", "Restarting", f"{explanation}, as {launch.pod}")
    step.conditions(("False", "Restarting", text), ("True", "Restarting", explanation),
                    ("True", "ResolutionFailed", text))
    return step.done(requeue_after=max(delay, POLL_SECONDS), again=False)
