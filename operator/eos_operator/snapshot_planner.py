"""The ExactlyOnceSnapshot planner: ``plan_snapshot(spec, status, observed) -> Plan``. Pure, like the
stream planner: no I/O, no clock. One call decides one step.

A snapshot is a one-shot job: Pending -> InProgress (an attempt Pod runs) -> Completed, or Failed
after ``spec.maxRetries`` retried attempts; a deleted snapshot has its files disposed first (see
snapshots.py for the Pods and why they are owned the way they are).
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

from eos_job.spec import StreamIdentity, stream_uid
from eos_job.snapshot_resource import ExactlyOnceSnapshotStatus, SnapshotSpec
from eos_job.spec_rules import store_problem

from . import children
from .actions import CreatePod, DeletePod, Plan, Step
from .observed import PodView
from .snapshots import (ATTEMPT_GRACE_SECONDS, DISPOSE_ATTEMPTS, MAX_LABEL_VALUE, MAX_MESSAGE, POLL_SECONDS,
                        TERMINAL_STATES, SnapshotAction, SnapshotObserved, SnapshotRef, SnapshotResult,
                        StreamFacts, access_of, attempt_pod_name, default_path, dispose_command, dispose_pod_name,
                        dispose_retry_delay, failure_text, inspect_command, parse_result, retry_delay, snapshot_pod,
                        stream_facts, take_command)
from .timeutil import fmt_ceil, parse, seconds_between
from .validation import InvalidSpec

class _Step(Step):
    st: ExactlyOnceSnapshotStatus
    obs: SnapshotObserved
    max_message = MAX_MESSAGE


def plan_snapshot(spec: SnapshotSpec | InvalidSpec, status: ExactlyOnceSnapshotStatus,
                  observed: SnapshotObserved) -> Plan:
    step = _Step(status, observed)
    if observed.deleting:
        return _deletion(step, spec)
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


def _terminal(step: _Step) -> Plan:
    """Completed and Failed stay so; leftovers of an interrupted step are removed."""
    for pod in step.obs.attempt_pods():
        if not pod.deleting:
            step.act(DeletePod(pod.name, 0 if pod.terminal else ATTEMPT_GRACE_SECONDS))
    return step.done()


def _failed(step: _Step, message: str) -> Plan:
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


def _path_problem(spec: SnapshotSpec, facts: StreamFacts | InvalidSpec | None) -> str | None:
    """spec.path must lie in the stream's store (spec_rules.store_problem): the snapshot's Pods run with the
    stream's volume and keys, which must not copy to, inspect or dispose of anything else."""
    if spec.path is None or not isinstance(facts, StreamFacts):
        return None
    problem = store_problem(facts.spec.checkpoint, spec.path)
    return f"spec.path: {problem}" if problem else None


def _pending(step: _Step, spec: SnapshotSpec) -> Plan:
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
    problem = _path_problem(spec, facts)
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
    verb = "inspecting" if spec.trigger == "upgrade" else "copying the checkpoint of stream " + spec.stream + " to"
    st.message = f"attempt {attempt}: {verb} {path}"
    step.act(CreatePod(pod))
    step.event("Normal", "SnapshotStarted", f"attempt {attempt} of {spec.max_retries + 1}: Pod {st.pod} is "
                                            f"{verb} {path}")
    return step.done(requeue_after=POLL_SECONDS)


def _attempt_pod(step: _Step, spec: SnapshotSpec, facts: StreamFacts, attempt: int, path: str) -> dict[str, Any]:
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


def _in_progress(step: _Step, spec: SnapshotSpec) -> Plan:
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
    return step.done(requeue_after=POLL_SECONDS)


def _completed(step: _Step, spec: SnapshotSpec, pod: PodView, result: SnapshotResult) -> Plan:
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


def _attempt_failed(step: _Step, spec: SnapshotSpec, error: str, *, pod: PodView | None = None,
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


# ------------------------------------------------------------------ deletion
def _deletion(step: _Step, spec: SnapshotSpec | InvalidSpec) -> Plan:
    """Stop any attempt, then dispose the files (or say where they stay); ``finished`` lets the finalizer go."""
    st, obs = step.st, step.obs
    attempts = obs.attempt_pods()
    running = [p for p in attempts if not p.terminal]
    if running:
        for pod in running:
            if not pod.deleting:
                step.act(DeletePod(pod.name, ATTEMPT_GRACE_SECONDS))
        names = ", ".join(p.name for p in running)
        st.message = f"being deleted: stopping {names} first"
        return step.done(requeue_after=POLL_SECONDS, finished=False)

    current = obs.pod(st.pod)
    valid = isinstance(spec, SnapshotSpec)
    written = (st.state == "Completed" or (valid and spec.trigger == "upgrade")
               or (current is not None and current.phase == "Succeeded"))
    path = st.path or (spec.path if valid else None)
    # An attempt that was started but never wrote the snapshot may have left a partial copy next to it.
    leftovers = not written and st.attempts > 0 and st.access is not None
    if not path or not (written or leftovers):
        return _released(step)
    if not valid or not spec.dispose_on_delete:
        if leftovers:
            return _released(step)
        why = "spec.disposeOnDelete is false" if valid else "the spec is invalid"
        step.event("Normal", "SnapshotKept", f"{why}: the snapshot's files are kept at {path}")
        return _released(step)
    if st.path is None and _path_problem(spec, stream_facts(obs.stream)) is not None:
        step.event("Normal", "SnapshotKept", f"spec.path {path} is outside the stream's store: nothing is disposed")
        return _released(step)

    disposers = obs.dispose_pods()
    done = next((p for p in disposers if p.phase == "Succeeded"), None)
    if done is not None:
        what = (f"what its interrupted attempt left at {path}.partial" if leftovers
                else f"the snapshot's files at {path}")
        step.event("Normal", "SnapshotDisposed", f"removed {what} (Pod {done.name})")
        return _released(step)
    failed = [p for p in disposers if p.phase == "Failed"]
    if len(failed) >= DISPOSE_ATTEMPTS:
        step.event("Warning", "SnapshotDisposeFailed",
                   f"could not remove the snapshot's files in {len(failed)} attempts (last: {failure_text(failed[-1])})"
                   f": the files at {path} must be removed by hand")
        return _released(step)
    if any(not p.terminal for p in disposers):
        st.message = f"being deleted: removing the files at {path}"
        return step.done(requeue_after=POLL_SECONDS, finished=False)
    if failed:
        finished_at = parse(failed[-1].finished_at)
        if finished_at is not None:
            wait = seconds_between(obs.now, finished_at + timedelta(seconds=dispose_retry_delay(len(failed))))
            if wait > 0:
                st.message = f"being deleted: removing the files at {path} failed {len(failed)} times, retrying"
                return step.done(requeue_after=wait, finished=False)

    facts = stream_facts(obs.stream)
    # The stream's current image and volume if it is there, else those recorded at the first attempt.
    access = access_of(facts.spec) if isinstance(facts, StreamFacts) else st.access
    if access is None:
        assert valid
        why = ("does not exist any more" if facts is None else "has an invalid spec")
        step.event("Warning", "SnapshotDisposeSkipped",
                   f"stream {spec.stream} {why} and the snapshot recorded no image and checkpoint volume (taken "
                   f"by an older operator): the snapshot's files at {path} must be removed by hand")
        return _released(step)
    index = max((p.index for p in disposers), default=-1) + 1
    name = dispose_pod_name(obs.name, index)
    ref = SnapshotRef(obs.name, obs.namespace, obs.uid)
    step.act(CreatePod(snapshot_pod(ref, spec.stream, access, name=name, action="dispose",
                                    command=dispose_command(path), owned=False)))
    if failed:
        step.event("Warning", "SnapshotDisposeRetry",
                   f"{failure_text(failed[-1])}; retrying as {name} ({len(failed)} of {DISPOSE_ATTEMPTS} failed)")
    else:
        step.event("Normal", "SnapshotDisposing", f"removing the snapshot's files at {path} (Pod {name})")
    st.message = f"being deleted: removing the files at {path}"
    return step.done(requeue_after=POLL_SECONDS, finished=False)


def _released(step: _Step) -> Plan:
    """Nothing left to do but remove our Pods; then the finalizer may go."""
    for pod in step.obs.pods:
        if not pod.deleting:
            step.act(DeletePod(pod.name, 0))
    return step.done(finished=True)

