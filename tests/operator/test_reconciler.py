"""The reconcile loop over fake adapters: write-ahead status, idempotence, crashes at any step."""
from __future__ import annotations

from eos_job.spec import stream_uid  # noqa: E402
import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eos_operator.adapters import KubeError
from eos_operator.reconciler import Deps, reconcile

from .fakes import Crash, FakeClock, FakeKube, FakeProgress, FakeResolver, base_spec


def make(spec=None):
    kube, clock = FakeKube(), FakeClock()
    resolver = FakeResolver(kube=kube)
    kube.add_stream("colors", spec or base_spec())
    return kube, resolver, clock, Deps(kube=kube, resolver=resolver, clock=clock)


def rec(deps):
    return asyncio.run(reconcile("default", "colors", deps))


def status(kube):
    return kube.stream("colors").get("status") or {}


def test_create_resolves_then_submits_one_driver():
    kube, resolver, clock, deps = make()
    out = rec(deps)
    assert kube.created_pods == ["colors-driver-0"]
    assert len(resolver.calls) == 1
    cfg = resolver.calls[0]
    meta = kube.stream("colors")["metadata"]
    assert cfg.stream.uid == stream_uid(meta.get("namespace", cfg.stream.namespace), "colors")
    assert ("default", "colors-run") in kube.config_maps
    assert kube.reasons() == ["Resolved", "Submitted"]
    s = status(kube)
    assert s["lifecycleState"] == "Deploying" and s["driverPod"] == "colors-driver-0"
    assert "pendingLaunch" not in s
    assert s["resolution"]["summary"] == "resolution #1"
    assert out.requeue_after is not None
    # Idempotent: nothing new happens on the next pass.
    rec(deps)
    assert kube.created_pods == ["colors-driver-0"] and len(resolver.calls) == 1
    kube.set_pod_phase("colors-driver-0", "Running")
    rec(deps)
    assert status(kube)["lifecycleState"] == "Running"
    assert kube.reasons()[-1] == "Running"
    ready = [c for c in status(kube)["conditions"] if c["type"] == "Ready"][0]
    assert ready["status"] == "True"


def test_progress_is_read_for_a_running_driver_only():
    kube, resolver, clock, deps = make()
    deps.progress = FakeProgress(batch=41)
    rec(deps)
    assert deps.progress.calls == 0                         # not while deploying
    assert status(kube)["lastCommittedBatch"] == 0          # what resolution reported
    kube.set_pod_phase("colors-driver-0", "Running")
    rec(deps)
    assert status(kube)["lastCommittedBatch"] == 41 and deps.progress.calls == 1
    deps.progress.batch = 42                                 # the ledger moved on
    rec(deps)
    assert status(kube)["lastCommittedBatch"] == 42 and deps.progress.calls == 2


def test_failed_driver_restarts_after_delay_with_resolution():
    kube, resolver, clock, deps = make()
    rec(deps)
    kube.set_pod_phase("colors-driver-0", "Running")
    rec(deps)
    kube.set_pod_phase("colors-driver-0", "Failed", exit_code=137, message="killed")
    out = rec(deps)
    s = status(kube)
    assert s["lifecycleState"] == "Restarting" and s["restartCount"] == 1
    assert "exit code 137" in s["lastError"]
    assert kube.created_pods == ["colors-driver-0"]          # the delay first
    assert out.requeue_after == pytest.approx(10, abs=1)
    clock.advance(11)
    rec(deps)
    assert kube.created_pods == ["colors-driver-0", "colors-driver-1"]
    assert kube.pods[("default", "colors-driver-0")]["status"]["phase"] == "Failed"   # kept for its log
    assert len(resolver.calls) == 2
    assert kube.reasons()[-4:] == ["DriverFailed", "Restarting", "Resolved", "Submitted"]
    assert kube.max_alive_drivers == 1


def test_a_failed_driver_pod_stays_for_its_log_until_a_later_driver_commits_a_batch_beyond_its_last():
    kube, resolver, clock, deps = make()
    deps.progress = progress = FakeProgress(batch=3)
    rec(deps)
    kube.set_pod_phase("colors-driver-0", "Running")
    rec(deps)
    kube.set_pod_phase("colors-driver-0", "Failed", exit_code=1, message="boom")
    rec(deps)
    assert status(kube)["failedDriver"]["pod"] == "colors-driver-0" and status(kube)["failedDriver"]["batch"] == 3
    event = [m for (_, _, r, m) in kube.events if r == "DriverFailed"][-1]
    assert "kubectl logs -n default colors-driver-0" in event
    clock.advance(11)
    rec(deps)
    kube.set_pod_phase("colors-driver-1", "Running")
    rec(deps)                          # the ledger still says batch 3: the new driver proved nothing yet
    assert ("default", "colors-driver-0") in kube.pods and status(kube)["failedDriver"]["pod"] == "colors-driver-0"
    # The second one fails too: only the newest failed Pod is kept.
    kube.set_pod_phase("colors-driver-1", "Failed", exit_code=1, message="boom again")
    rec(deps)
    clock.advance(11)
    rec(deps)
    assert ("default", "colors-driver-0") not in kube.pods
    assert kube.pods[("default", "colors-driver-1")]["status"]["phase"] == "Failed"
    kube.set_pod_phase("colors-driver-2", "Running")
    progress.batch = 4
    clock.advance(60)
    rec(deps)
    rec(deps)
    assert ("default", "colors-driver-1") not in kube.pods and "failedDriver" not in status(kube) or \
        status(kube).get("failedDriver") is None
    assert kube.max_alive_drivers == 1


def test_a_sub_second_restart_delay_is_waited_to_the_millisecond_not_to_the_next_second():
    kube, resolver, clock, deps = make(base_spec(restartStrategy={
        "type": "fixed-delay", "fixedDelay": {"attempts": 2, "delaySeconds": 0.3}}))
    rec(deps)
    kube.set_pod_phase("colors-driver-0", "Running")
    rec(deps)
    clock.advance(0.25)
    kube.set_pod_phase("colors-driver-0", "Failed", exit_code=137, message="killed")
    out = rec(deps)
    assert status(kube)["nextRestartTime"] == "2026-01-01T12:00:00.550Z"
    assert out.requeue_after == pytest.approx(0.3)
    clock.advance(0.3)
    rec(deps)
    assert kube.created_pods == ["colors-driver-0", "colors-driver-1"]


def test_exhaustion_then_restart_nonce_resumes():
    kube, resolver, clock, deps = make()
    rec(deps)
    for attempt in range(3):   # 2 restarts allowed, the third failure exhausts
        kube.set_pod_phase(f"colors-driver-{attempt}", "Failed", exit_code=3, message="SinkUnavailable")
        rec(deps)
        clock.advance(11)
        rec(deps)
    s = status(kube)
    assert s["lifecycleState"] == "Failed"
    assert [c for c in s["conditions"] if c["type"] == "Ready"][0]["reason"] == "RestartsExhausted"
    assert "RestartsExhausted" in kube.reasons()
    assert kube.created_pods == ["colors-driver-0", "colors-driver-1", "colors-driver-2"]
    clock.advance(3600)
    rec(deps)
    assert len(kube.created_pods) == 3                        # stays failed
    kube.update_spec("colors", lambda spec: spec.update(restartNonce=1))
    rec(deps)
    s = status(kube)
    assert s["restartCount"] == 0 and s["observedRestartNonce"] == 1
    assert kube.created_pods[-1] == "colors-driver-3"
    assert len(resolver.calls) == 4


def finish_aux_pods(kube) -> list[str]:
    """Play the kubelet for pre-flight and drain Pods: they succeed."""
    done = []
    for (_, name), pod in list(kube.pods.items()):
        labels = pod["metadata"].get("labels") or {}
        if labels.get("streaming.eos.dev/aux") == "true" and (pod.get("status") or {}).get("phase") not in (
                "Succeeded", "Failed"):
            kube.set_pod_phase(name, "Succeeded")
            done.append(name)
    return done


def test_spec_change_stops_the_old_driver_before_the_new_one():
    kube, resolver, clock, deps = make()
    rec(deps)
    kube.set_pod_phase("colors-driver-0", "Running")
    rec(deps)
    kube.update_spec("colors", lambda spec: spec["job"].update(args={"window": "5s"}))
    rec(deps)
    assert kube.created_pods == ["colors-driver-0", "colors-preflight-1"]   # pre-flight first, old one runs
    assert kube.deleted_pods == []
    assert finish_aux_pods(kube) == ["colors-preflight-1"]
    rec(deps)
    assert status(kube)["lifecycleState"] == "Upgrading"
    assert ("colors-driver-0", 60) in kube.deleted_pods      # graceful
    assert kube.created_pods == ["colors-driver-0", "colors-preflight-1"]   # not before the old one is gone
    rec(deps)
    assert kube.created_pods == ["colors-driver-0", "colors-preflight-1"]
    kube.finish_deletions()
    rec(deps)
    assert kube.created_pods == ["colors-driver-0", "colors-preflight-1", "colors-driver-1"]
    assert resolver.calls[-1].spec.job.args == {"window": "5s"}
    assert kube.max_alive_drivers == 1


def test_suspend_and_resume():
    kube, resolver, clock, deps = make()
    rec(deps)
    kube.set_pod_phase("colors-driver-0", "Running")
    rec(deps)
    kube.update_spec("colors", lambda spec: spec["job"].update(state="suspended"))
    rec(deps)
    assert ("colors-driver-0", 60) in kube.deleted_pods
    kube.finish_deletions()
    rec(deps)
    assert status(kube)["lifecycleState"] == "Suspended"
    assert "Suspended" in kube.reasons()
    kube.update_spec("colors", lambda spec: spec["job"].update(state="running"))
    rec(deps)
    assert "Resumed" in kube.reasons()
    assert kube.created_pods == ["colors-driver-0", "colors-driver-1"]
    assert len(resolver.calls) == 2


def test_invalid_spec_is_reported_and_nothing_is_created():
    kube, resolver, clock, deps = make(base_spec(sink={"bootstrapServers": "localhost:9092", "topic": "in"}))
    rec(deps)
    rec(deps)
    s = status(kube)
    assert s["lifecycleState"] == "Invalid"
    ready = [c for c in s["conditions"] if c["type"] == "Ready"][0]
    assert ready["reason"] == "InvalidSpec" and "spec.sink.topic" in ready["message"]
    assert kube.reasons() == ["InvalidSpec"]
    assert kube.created_pods == [] and resolver.calls == [] and kube.config_maps == {}


def test_deletion_stops_the_driver_and_removes_children():
    kube, resolver, clock, deps = make()
    rec(deps)
    kube.set_pod_phase("colors-driver-0", "Running")
    rec(deps)
    kube.mark_stream_deleted("colors")
    out = rec(deps)
    assert not out.finished and ("colors-driver-0", 60) in kube.deleted_pods
    kube.finish_deletions()
    out = rec(deps)
    assert out.finished and kube.config_maps == {} and kube.pods == {}


def test_status_conflict_is_observed_again():
    kube, resolver, clock, deps = make()
    kube.conflict_next_status_patch = 2
    rec(deps)
    assert kube.created_pods == ["colors-driver-0"]


def test_failed_create_is_retried_with_the_same_name():
    kube, resolver, clock, deps = make()
    kube.fail_create_pod = 1
    with pytest.raises(KubeError):
        rec(deps)
    rec(deps)
    assert kube.created_pods == ["colors-driver-0"]
    assert len(resolver.calls) == 1                          # the resolved launch was not redone


def test_resolution_failure_delays_the_start():
    kube, resolver, clock, deps = make()
    resolver.fail_next = 1
    rec(deps)
    s = status(kube)
    assert s["lifecycleState"] == "Restarting" and s["restartCount"] == 1
    assert "sink unreachable" in s["lastError"]
    assert kube.created_pods == []
    clock.advance(11)
    rec(deps)
    assert kube.created_pods == ["colors-driver-0"]


@pytest.mark.parametrize("where", ["after-resolution", "after-create", "after-intent"])
def test_operator_killed_mid_launch_resumes_with_exactly_one_driver(where):
    kube, resolver, clock, deps = make()
    if where == "after-resolution":
        resolver.crash_after = True
    elif where == "after-create":
        kube.crash_after_create_pod = True
    else:
        kube.crash_after_status_patch_containing = "pendingLaunch"
    with pytest.raises(Crash):
        rec(deps)
    # A new operator process: same status, same world.
    rec(deps)
    assert kube.created_pods == ["colors-driver-0"]
    assert list(kube.pods) == [("default", "colors-driver-0")]
    assert "pendingLaunch" not in status(kube)
    assert kube.reasons().count("Submitted") == 1


FAULTS = st.sampled_from(["none", "resolve-crash", "create-crash", "status-crash", "conflict", "create-fails",
                          "resolve-fails"])
EVENTS = st.sampled_from(["pod-fails", "pod-runs", "time-passes", "deletions-finish", "spec-change", "nothing"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(FAULTS, EVENTS), min_size=1, max_size=25))
def test_never_two_drivers_whatever_crashes(steps):
    kube, resolver, clock, deps = make(base_spec(restartStrategy={
        "type": "exponential-delay", "exponentialDelay": {"initialDelaySeconds": 1, "maxDelaySeconds": 5}}))
    for fault, event in steps:
        if fault == "resolve-crash":
            resolver.crash_after = True
        elif fault == "create-crash":
            kube.crash_after_create_pod = True
        elif fault == "status-crash":
            kube.crash_after_status_patch_containing = "pendingLaunch"
        elif fault == "conflict":
            kube.conflict_next_status_patch = 1
        elif fault == "create-fails":
            kube.fail_create_pod = 1
        elif fault == "resolve-fails":
            resolver.fail_next = 1
        try:
            rec(deps)
        except (Crash, KubeError):
            pass
        current = (kube.stream("colors").get("status") or {}).get("driverPod")
        if event == "pod-fails" and current and ("default", current) in kube.pods:
            kube.set_pod_phase(current, "Failed", exit_code=1)
        elif event == "pod-runs" and current and ("default", current) in kube.pods:
            kube.set_pod_phase(current, "Running")
        elif event == "time-passes":
            clock.advance(10)
        elif event == "deletions-finish":
            kube.finish_deletions()
            finish_aux_pods(kube)
        elif event == "spec-change":
            kube.update_spec("colors", lambda spec: spec["job"].setdefault("args", {}).update(
                n=str(len(kube.created_pods))))
        assert kube.max_alive_drivers <= 1
        assert len(kube.created_pods) == len(set(kube.created_pods))   # a name is never reused
    # Calm weather: it converges to exactly one running driver.
    resolver.crash_after, resolver.fail_next = False, 0
    kube.crash_after_create_pod, kube.crash_after_status_patch_containing = False, None
    kube.conflict_next_status_patch = kube.fail_create_pod = 0
    for _ in range(10):
        kube.finish_deletions()
        finish_aux_pods(kube)
        clock.advance(10)
        rec(deps)
        current = status(kube).get("driverPod")
        if current and ("default", current) in kube.pods:
            kube.set_pod_phase(current, "Running")
    rec(deps)
    assert status(kube)["lifecycleState"] == "Running"
    assert len(kube.alive_drivers("default", "colors")) == 1
    assert kube.max_alive_drivers <= 1


def test_a_refused_driver_pod_is_reported_once_and_retried_after_a_pause():
    """Pod Security (or a quota) refuses the Pod: status and one event say so, no tight retry loop, and
    the launch (resolved once) goes on when the refusal ends."""
    kube, resolver, clock, deps = make()
    kube.fail_create_pod, kube.fail_create_status = 3, 403
    rec(deps)
    s = status(kube)
    ready = next(c for c in s["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "Refused" and "Pod colors-driver-0 was refused" in ready["message"], ready
    assert "injected create failure" in s["pendingLaunch"]["refused"] and kube.created_pods == []
    rec(deps)                                       # within the pause: no new create
    assert kube.fail_create_pod == 2
    clock.advance(31)
    rec(deps)                                       # refused again, same reason: no second event
    assert kube.fail_create_pod == 1
    assert [e for e in kube.events if e[2] == "Refused"].__len__() == 1
    clock.advance(31)
    rec(deps)
    clock.advance(31)
    rec(deps)
    assert kube.created_pods == ["colors-driver-0"] and len(resolver.calls) == 1


def test_an_invalid_driver_pod_422_is_refused_with_the_servers_message():
    """422: the API server finds the Pod invalid (a field only it checks). Status says so in the server's words,
    one event, no restart counted; the launch keeps its place and creates the Pod once the server accepts it."""
    kube, resolver, clock, deps = make()
    kube.fail_create_pod, kube.fail_create_status = 2, 422
    kube.fail_create_message = ('Pod "colors-driver-0" is invalid: spec.containers[0].resources.requests: '
                                'Invalid value: "2": must be less than or equal to cpu limit')
    rec(deps)
    s = status(kube)
    ready = next(c for c in s["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "Refused"), ready
    assert "Pod colors-driver-0 was refused" in ready["message"] and kube.fail_create_message in ready["message"]
    assert kube.messages_for("ExactlyOnceStream", "Refused") == [ready["message"]]
    assert kube.created_pods == [] and s.get("restartCount", 0) == 0
    clock.advance(31)
    rec(deps)                                       # refused again, the same words: no second event
    assert kube.fail_create_pod == 0 and len(kube.messages_for("ExactlyOnceStream", "Refused")) == 1
    clock.advance(31)
    rec(deps)
    assert kube.created_pods == ["colors-driver-0"] and len(resolver.calls) == 1


def test_a_missing_secret_waits_with_its_reason_instead_of_counting_restarts():
    """The S3 keys' Secret does not exist: resolution cannot read the checkpoint; no restart helps until
    someone creates it, so the launch waits (CheckpointSecretMissing), no failure counted."""
    s3 = {"store": "s3", "path": "/streams/colors", "s3": {"bucket": "ckpt", "accessKeyId": {"name": "keys", "key": "id"},
                                                          "secretAccessKey": {"name": "keys", "key": "secret"}}}
    kube, resolver, clock, deps = make(base_spec(checkpoint=s3))
    rec(deps)
    s = status(kube)
    ready = next(c for c in s["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "CheckpointSecretMissing" and "default/keys does not exist" in ready["message"], ready
    assert s.get("restartCount", 0) == 0 and kube.created_pods == [] and resolver.calls == []
