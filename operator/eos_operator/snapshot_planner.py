"""The ExactlyOnceSnapshot planner: ``plan_snapshot(spec, status, observed) -> Plan``. Pure, like the
stream planner: no I/O, no clock. One call decides one step.

A snapshot is a one-shot job: Pending -> InProgress (an attempt Pod runs) -> Completed, or Failed
after ``spec.maxRetries`` retried attempts; a deleted snapshot has its files disposed first
(snapshot_disposal.py; snapshots.py for the Pods and why they are owned the way they are). An attempt
Pod that cannot start says why, and one still not running at the stream's start deadline is a failed
attempt (snapshot_step.py).
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

from eos_job.spec import StreamIdentity, stream_uid
from eos_job.snapshot_resource import ExactlyOnceSnapshotStatus, SnapshotSpec

from . import children
from .actions import CreatePod, DeletePod, Plan
from .observed import PodView
from .snapshot_disposal import plan_disposal
from .snapshot_step import SnapshotStep, blocked, path_problem, refusal_pause, start_timeout
from .snapshots import (ATTEMPT_GRACE_SECONDS, MAX_LABEL_VALUE, MAX_MESSAGE, POLL_SECONDS, TERMINAL_STATES,
                        SnapshotAction, SnapshotObserved, SnapshotRef, SnapshotResult, StreamFacts, access_of,
                        attempt_pod_name, default_path, failure_text, inspect_command, parse_result, retry_delay,
                        snapshot_pod, stream_facts, take_command)
from .start_failures import past_start_deadline
from .timeutil import fmt_ceil, parse, seconds_between
from .validation import InvalidSpec


def plan_snapshot(spec: SnapshotSpec | InvalidSpec, status: ExactlyOnceSnapshotStatus,
                  observed: SnapshotObserved) -> Plan:
    step = SnapshotStep(status, observed)
    if observed.deleting:
        return plan_disposal(step, spec)
    step.st.observed_generation = observed.generation
    if step.st.state in TERMINAL_STATES:
        return _terminal(step)
    if isinstance(spec, InvalidSpec):
        return _failed(step, f"the snapshot's spec is invalid ({spec.message}): delete it and create a "
                             "corrected one")
    if len(observed.name) > MAX_LABEL_VALUE:
        return _failed(step, f"the name is {len(observed.name)} characters long; snapshot names may have at "
                             f"most {MAX_LABEL_VALUE} (the name is a label value of the snapshot's Pods)")
    if step.st.state == "InProgress":
        return _in_progress(step, spec)
    return _pending(step, spec)


def _terminal(step: SnapshotStep) -> Plan:
    """Completed and Failed stay so; leftovers of an interrupted step are removed."""
    for pod in step.obs.attempt_pods():
        if not pod.deleting:
            step.act(DeletePod(pod.name, 0 if pod.terminal else ATTEMPT_GRACE_SECONDS))
    return step.done()


def _failed(step: SnapshotStep, message: str) -> Plan:
    st = step.st
    st.state = "Failed"
    st.last_error = message
    st.message = message
    st.next_attempt_time = None
    step.event("Warning", "SnapshotFailed", message)
    return _terminal(step)


def _stream_problem(spec: SnapshotSpec, facts: StreamFacts | InvalidSpec | None, namespace: str) -> str | None:
    if facts is None:
        return (f"stream {spec.stream} does not exist in namespace {namespace}: create the ExactlyOnceStream "
                f"{spec.stream} and then a new snapshot, or set spec.stream of a new snapshot to an existing stream")
    if isinstance(facts, InvalidSpec):
        return (f"stream {spec.stream} has an invalid spec ({facts.message}): fix the stream's spec, then create "
                "a new snapshot")
    return None


def _pending(step: SnapshotStep, spec: SnapshotSpec) -> Plan:
    st, obs = step.st, step.obs
    for pod in obs.attempt_pods():          # failed attempts are deleted as they are counted; be sure
        if not pod.deleting:
            step.act(DeletePod(pod.name, 0 if pod.terminal else ATTEMPT_GRACE_SECONDS))
    not_before = parse(st.next_attempt_time)
    if not_before is not None and obs.now < not_before:
        st.message = f"attempt {st.attempts + 1} starts at {st.next_attempt_time}"
        return step.done(requeue_after=max(seconds_between(obs.now, not_before), 0.1))

    facts = stream_facts(obs.stream)
    problem = _stream_problem(spec, facts, obs.namespace)
    if problem is not None:
        if st.attempts == 0:
            return _failed(step, problem)
        return _attempt_failed(step, spec, problem, counted=False)
    assert isinstance(facts, StreamFacts)
    if spec.trigger == "upgrade" and not spec.path:
        return _failed(step, "spec.path is required when spec.trigger is upgrade (the snapshot the driver wrote): "
                             "delete this snapshot and create one with spec.path")
    problem = path_problem(spec, facts)
    if problem is not None:
        return _failed(step, f"{problem}: delete this snapshot and create one with a path in the stream's store, or "
                             "without spec.path (<checkpoint.path>/snapshots/<name>)")
    if spec.trigger != "upgrade" and facts.checkpoint_dir is None:
        st.attempts += 1
        return _attempt_failed(step, spec, f"stream {spec.stream} has no checkpoint yet (it never started a "
                                           "driver)", counted=True)
    attempt = st.attempts + 1
    path = st.path or spec.path or default_path(facts.spec, obs.name)
    pod = _attempt_pod(step, spec, facts, attempt, path)
    st.state = "InProgress"
    st.attempts = attempt
    st.pod = pod["metadata"]["name"]
    st.path = path
    st.access = st.access or access_of(facts.spec)
    st.next_attempt_time = None
    st.message = _attempt_message(spec, attempt, path)
    step.act(CreatePod(pod))
    step.event("Normal", "SnapshotStarted", f"attempt {attempt} of {spec.max_retries + 1}: Pod {st.pod} is "
                                            f"{_verb(spec)} {path}")
    return step.done(requeue_after=POLL_SECONDS)


def _verb(spec: SnapshotSpec) -> str:
    return "inspecting" if spec.trigger == "upgrade" else f"copying the checkpoint of stream {spec.stream} to"


def _attempt_message(spec: SnapshotSpec, attempt: int, path: str) -> str:
    return f"attempt {attempt}: {_verb(spec)} {path}"


def _attempt_pod(step: SnapshotStep, spec: SnapshotSpec, facts: StreamFacts, attempt: int, path: str) -> dict[str, Any]:
    obs = step.obs
    ref = SnapshotRef(obs.name, obs.namespace, obs.uid)
    if spec.trigger == "upgrade":
        action: SnapshotAction = "inspect"
        command = inspect_command(path)
    else:
        action = "take"
        identity = StreamIdentity(name=spec.stream, namespace=obs.namespace,
                                  uid=stream_uid(obs.namespace, spec.stream), generation=facts.tx_generation)
        assert facts.checkpoint_dir is not None
        command = take_command(facts.checkpoint_dir, path, identity, facts.spec_hash)
    pod = snapshot_pod(ref, spec.stream, access_of(facts.spec), name=attempt_pod_name(obs.name, attempt),
                       action=action, command=command, attempt=attempt)
    return children.pin_to_node(pod, obs.driver_node if facts.spec.checkpoint.store == "pvc" else None)


def _in_progress(step: SnapshotStep, spec: SnapshotSpec) -> Plan:
    st, obs = step.st, step.obs
    for other in obs.attempt_pods():
        if other.name != st.pod and not other.deleting:
            step.act(DeletePod(other.name, 0 if other.terminal else ATTEMPT_GRACE_SECONDS))
    if st.pod is None or st.path is None:   # not written by this planner; start the attempt again
        st.state = "Pending"
        st.attempts = max(st.attempts - 1, 0)
        return _pending(step, spec)
    pod = obs.pod(st.pod)
    if pod is None:
        # Recorded but not there: the operator stopped between the status write and the create, or the
        # Pod was removed before it finished. The same name again (a 409 if it is there after all).
        facts = stream_facts(obs.stream)
        problem = _stream_problem(spec, facts, obs.namespace)
        if problem is not None:
            return _attempt_failed(step, spec, problem, counted=False)
        assert isinstance(facts, StreamFacts)
        paused = refusal_pause(step)
        if paused is not None:
            return paused
        step.act(CreatePod(_attempt_pod(step, spec, facts, st.attempts, st.path)))
        return step.done(requeue_after=POLL_SECONDS)
    if pod.deleting:
        return step.done(requeue_after=POLL_SECONDS)
    if pod.phase == "Succeeded":
        result = parse_result(pod.message)
        if isinstance(result, str):
            return _attempt_failed(step, spec, f"Pod {pod.name} succeeded but {result}", pod=pod)
        return _completed(step, spec, pod, result)
    if pod.phase == "Failed":
        return _attempt_failed(step, spec, failure_text(pod), pod=pod)
    # Pending or Running. Not running by the stream's start deadline: a failed attempt, as a failed Pod is.
    timeout = start_timeout(stream_facts(obs.stream))
    stuck = past_start_deadline(pod, timeout, obs.now)
    if stuck:
        return _attempt_failed(step, spec, stuck, pod=pod)
    st.message = _attempt_message(spec, st.attempts, st.path)
    if pod.blocked:
        blocked(step, "snapshot", pod, timeout)
    return step.done(requeue_after=POLL_SECONDS)


def _completed(step: SnapshotStep, spec: SnapshotSpec, pod: PodView, result: SnapshotResult) -> Plan:
    st, obs = step.st, step.obs
    st.state = "Completed"
    st.path = result.path or st.path
    st.batch = result.last_batch
    st.checkpoint_id = result.checkpoint_id
    st.stream_uid = result.stream_uid
    st.size_bytes = result.size_bytes
    st.taken_at = result.time
    st.spec_hash = result.spec_hash
    st.pod = None
    st.next_attempt_time = None
    st.last_error = None
    size = f", {result.size_bytes} bytes" if result.size_bytes is not None else ""
    st.message = f"batch {result.last_batch} of stream {spec.stream} at {st.path}"
    step.event("Normal", "SnapshotCompleted", f"snapshot of stream {spec.stream} at batch {result.last_batch}"
                                              f"{size}: {st.path} (attempt {st.attempts})")
    expected = stream_uid(obs.namespace, spec.stream)
    if result.stream_uid is not None and result.stream_uid != expected:
        step.event("Warning", "SnapshotOfAnotherStream",
                   f"the snapshot at {st.path} belongs to stream id {result.stream_uid}, not to {obs.namespace}/"
                   f"{spec.stream} ({expected}): restoring it into {spec.stream} is a fork")
    step.act(DeletePod(pod.name, 0))
    return step.done()


def _attempt_failed(step: SnapshotStep, spec: SnapshotSpec, error: str, *, pod: PodView | None = None,
                    counted: bool = True) -> Plan:
    """One failed attempt (already counted in status.attempts, or ``counted=False``: count it now).
    Retry with backoff while attempts <= maxRetries, else Failed."""
    st, obs = step.st, step.obs
    if not counted:
        st.attempts += 1
    st.last_error = error[:MAX_MESSAGE]
    st.pod = None
    if pod is not None and not pod.deleting:
        step.act(DeletePod(pod.name, 0))
    step.event("Warning", "SnapshotAttemptFailed", f"attempt {st.attempts}: {error}")
    if st.attempts <= spec.max_retries:
        delay = retry_delay(st.attempts)
        st.state = "Pending"
        st.next_attempt_time = fmt_ceil(obs.now + timedelta(seconds=delay))
        st.message = f"attempt {st.attempts} failed; attempt {st.attempts + 1} starts at {st.next_attempt_time}"
        return step.done(requeue_after=delay)
    st.state = "Failed"
    st.next_attempt_time = None
    st.message = f"{st.attempts} attempts failed (spec.maxRetries is {spec.max_retries}); last: {st.last_error}"
    step.event("Warning", "SnapshotFailed", st.message)
    return step.done()
