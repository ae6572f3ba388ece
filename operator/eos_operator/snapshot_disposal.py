"""A deleted ExactlyOnceSnapshot: stop its attempt, then dispose of its files behind kopf's finalizer.

Dispose Pods ``<snap>-dispose-<k>`` carry no owner reference (snapshots.py says why); a failed one is kept
until the end as the record of that failure, so the count of failures (at most DISPOSE_ATTEMPTS) is observed,
not remembered. A dispose Pod that does not start by its deadline counts as failed and is kept the same way
(snapshot_step.py: Pods that do not start).
"""
from __future__ import annotations

from datetime import timedelta

from eos_job.snapshot_resource import SnapshotSpec

from .actions import CreatePod, DeletePod, Plan
from .observed import PodView
from .snapshot_step import SnapshotStep, blocked, path_problem, refusal_pause, start_timeout
from .snapshots import (ATTEMPT_GRACE_SECONDS, DISPOSE_ATTEMPTS, POLL_SECONDS, SnapshotRef, StreamFacts, access_of,
                        dispose_command, dispose_pod_name, dispose_retry_delay, failure_text, snapshot_pod,
                        stream_facts)
from .start_failures import past_start_deadline
from .timeutil import parse, seconds_between
from .validation import InvalidSpec


def plan_disposal(step: SnapshotStep, spec: SnapshotSpec | InvalidSpec) -> Plan:
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
        return released(step)
    if not valid or not spec.dispose_on_delete:
        if leftovers:
            return released(step)
        why = "spec.disposeOnDelete is false" if valid else "the spec is invalid"
        step.event("Normal", "SnapshotKept", f"{why}: the snapshot's files are kept at {path}")
        return released(step)
    if st.path is None and path_problem(spec, stream_facts(obs.stream)) is not None:
        step.event("Normal", "SnapshotKept", f"spec.path {path} is outside the stream's store: nothing is disposed")
        return released(step)

    facts = stream_facts(obs.stream)
    timeout = start_timeout(facts)
    disposers = obs.dispose_pods()
    done = next((p for p in disposers if p.phase == "Succeeded"), None)
    if done is not None:
        what = (f"what its interrupted attempt left at {path}.partial" if leftovers
                else f"the snapshot's files at {path}")
        step.event("Normal", "SnapshotDisposed", f"removed {what} (Pod {done.name})")
        return released(step)
    # A dispose Pod not running by its deadline failed; like a Failed one it is kept as the record of that.
    stuck = {p.name: text for p in disposers if (text := past_start_deadline(p, timeout, obs.now))}
    failed = [p for p in disposers if p.phase == "Failed" or p.name in stuck]

    def failure_of(pod: PodView) -> str:
        return stuck.get(pod.name) or failure_text(pod)

    if len(failed) >= DISPOSE_ATTEMPTS:
        step.event("Warning", "SnapshotDisposeFailed",
                   f"could not remove the snapshot's files in {len(failed)} attempts (last: "
                   f"{failure_of(failed[-1])}): the files at {path} must be removed by hand")
        return released(step)
    waiting = [p for p in disposers if not p.terminal and p.name not in stuck]
    if waiting:
        st.message = f"being deleted: removing the files at {path}"
        held = next((p for p in waiting if p.blocked), None)
        if held is not None:
            blocked(step, "dispose", held, timeout)
        return step.done(requeue_after=POLL_SECONDS, finished=False)
    if failed:
        finished_at = parse(failed[-1].finished_at)
        if finished_at is not None:
            wait = seconds_between(obs.now, finished_at + timedelta(seconds=dispose_retry_delay(len(failed))))
            if wait > 0:
                st.message = f"being deleted: removing the files at {path} failed {len(failed)} times, retrying"
                return step.done(requeue_after=wait, finished=False)

    paused = refusal_pause(step, finished=False)
    if paused is not None:
        return paused
    # The stream's current image and volume if it is there, else those recorded at the first attempt.
    access = access_of(facts.spec) if isinstance(facts, StreamFacts) else st.access
    if access is None:
        assert valid
        why = ("does not exist any more" if facts is None else "has an invalid spec")
        step.event("Warning", "SnapshotDisposeSkipped",
                   f"stream {spec.stream} {why} and the snapshot recorded no image and checkpoint volume (taken "
                   f"by an older operator): the snapshot's files at {path} must be removed by hand")
        return released(step)
    index = max((p.index for p in disposers), default=-1) + 1
    name = dispose_pod_name(obs.name, index)
    ref = SnapshotRef(obs.name, obs.namespace, obs.uid)
    step.act(CreatePod(snapshot_pod(ref, spec.stream, access, name=name, action="dispose",
                                    command=dispose_command(path), owned=False)))
    if failed:
        step.event("Warning", "SnapshotDisposeRetry",
                   f"{failure_of(failed[-1])}; retrying as {name} ({len(failed)} of {DISPOSE_ATTEMPTS} failed)")
    else:
        step.event("Normal", "SnapshotDisposing", f"removing the snapshot's files at {path} (Pod {name})")
    st.message = f"being deleted: removing the files at {path}"
    return step.done(requeue_after=POLL_SECONDS, finished=False)


def released(step: SnapshotStep) -> Plan:
    """Nothing left to do but remove our Pods; then the finalizer may go."""
    for pod in step.obs.pods:
        if not pod.deleting:
            step.act(DeletePod(pod.name, 0))
    return step.done(finished=True)

