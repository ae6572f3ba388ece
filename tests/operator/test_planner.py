"""Table tests of the pure planner: plan(spec, status, observed) -> Plan, no server."""
from __future__ import annotations

from eos_job.spec import stream_uid  # noqa: E402
from datetime import timedelta

import pytest

from eos_job.spec import ExactlyOnceStreamSpec
from eos_job.status import ExactlyOnceStreamStatus, PendingLaunch, ResolutionReport
from eos_operator.conditions import get_condition
from eos_operator.observed import Observed, PodView
from eos_operator.actions import (ApplyConfigMap, ApplyService, CreatePod, DeleteConfigMap, DeletePod, DeleteService,
                                  Plan, Resolve)
from eos_operator.planner import plan, record_resolution, record_resolution_failure
from eos_operator.timeutil import fmt, fmt_ms_ceil, parse
from eos_operator.upgrades import spec_json
from eos_operator.validation import InvalidSpec, validate_spec

from .fakes import T0, base_spec

UID = "0f6c2a1e-1111-2222-3333-444455556666"


def spec(**overrides) -> ExactlyOnceStreamSpec:
    s = validate_spec(base_spec(**overrides))
    assert isinstance(s, ExactlyOnceStreamSpec), s
    return s


def observed(*pods: PodView, at: float = 0.0, generation: int = 1, deleting: bool = False,
             batch: int | None = None) -> Observed:
    return Observed(name="colors", namespace="default", uid=UID, generation=generation,
                    now=T0 + timedelta(seconds=at), pods=tuple(pods), deleting=deleting, last_committed_batch=batch)


def pod(name: str, phase: str = "Running", **kw) -> PodView:
    attempt = int(name.rsplit("-", 1)[1])
    return PodView(name=name, phase=phase, attempt=attempt, owner_uid=UID, **kw)


def running_status(s: ExactlyOnceStreamSpec, attempt: int = 0, **kw) -> ExactlyOnceStreamStatus:
    """Status of a stream whose driver <attempt> was launched with spec s."""
    base = dict(lifecycle_state="Running", driver_pod=f"colors-driver-{attempt}", driver_attempt=attempt,
                last_reconciled_spec=spec_json(s), observed_restart_nonce=s.restart_nonce,
                running_since=fmt(T0))
    base.update(kw)
    return ExactlyOnceStreamStatus(**base)


def reasons(p: Plan) -> list[str]:
    return [e.reason for e in p.events]


def cond(p: Plan, type_: str):
    return get_condition(p.status.conditions, type_)


# ------------------------------------------------------------------- launching
def test_create_records_the_launch_before_doing_anything():
    p = plan(spec(), ExactlyOnceStreamStatus(), observed())
    assert p.actions == []                        # intent first, nothing done yet
    assert p.again
    assert p.status.lifecycle_state == "Deploying"
    assert p.status.pending_launch.attempt == 0
    assert p.status.pending_launch.pod == "colors-driver-0"
    assert p.status.pending_launch.reason == "Create"
    assert p.status.observed_generation == 1
    assert p.status.observed_restart_nonce == 0
    assert cond(p, "Ready").status == "False" and cond(p, "Ready").reason == "Deploying"
    assert cond(p, "Progressing").status == "True"


def test_launch_resolves_before_the_pod():
    s = spec()
    st = ExactlyOnceStreamStatus(lifecycle_state="Deploying", observed_restart_nonce=0,
                                 pending_launch=PendingLaunch(attempt=0, pod="colors-driver-0", reason="Create"))
    p = plan(s, st, observed())
    assert len(p.actions) == 1 and isinstance(p.actions[0], Resolve)
    r = p.actions[0]
    assert r.config.stream.uid == stream_uid(r.config.stream.namespace, r.config.stream.name) and r.config.stream.generation == 0
    assert r.config.checkpoint_dir == "/tmp/eos-test/live"
    assert r.spec_hash == s.spec_hash()
    assert cond(p, "Progressing").reason == "Resolving"


def test_a_pvc_checkpoint_is_probed_where_it_is_mounted_before_resolution():
    """store pvc: a probe Pod with the claim reads the checkpoint; its facts go to resolution."""
    import json
    s = spec(checkpoint={"store": "pvc", "claimName": "ckpt", "path": "/ckpt"})
    launch = PendingLaunch(attempt=2, pod="colors-driver-2", reason="Restart")
    st = ExactlyOnceStreamStatus(lifecycle_state="Restarting", observed_restart_nonce=0, pending_launch=launch)
    p = plan(s, st, observed())
    kinds = [type(a) for a in p.actions]
    assert kinds == [ApplyConfigMap, CreatePod], p.actions
    body = p.actions[1].body
    assert body["metadata"]["name"] == "colors-probe-2" and p.actions[0].body["metadata"]["name"] == "colors-probe"
    (c,) = body["spec"]["containers"]
    assert c["args"] == ["python", "-m", "eos_job", "probe", "--config-env", "EOS_RUN_CONFIG"]
    assert {"name": "checkpoint", "persistentVolumeClaim": {"claimName": "ckpt"}} in body["spec"]["volumes"]
    assert cond(p, "Progressing").reason == "Resolving" and "claim ckpt" in cond(p, "Ready").message
    # While it runs: wait. Succeeded: its facts are recorded, the Pod deleted, and resolution gets them.
    running = PodView(name="colors-probe-2", phase="Running", attempt=2, owner_uid=UID)
    assert plan(s, st, Observed(**{**observed().__dict__, "aux_pods": (running,)})).actions == []
    # A probe that cannot start (its claim is missing) says why, once, as a blocked driver does.
    blocked = PodView(name="colors-probe-2", phase="Pending", attempt=2, owner_uid=UID,
                      blocked='Unschedulable: persistentvolumeclaim "ckpt" not found.')
    p = plan(s, st, Observed(**{**observed().__dict__, "aux_pods": (blocked,)}))
    assert cond(p, "Ready").reason == "ProbeStartBlocked" and '"ckpt" not found' in cond(p, "Ready").message
    assert reasons(p) == ["ProbeStartBlocked"] and p.actions == []
    assert reasons(plan(s, p.status, Observed(**{**observed(at=5).__dict__, "aux_pods": (blocked,)}))) == []
    doc = {"reason": "Probed", "checkpointDir": "/ckpt/live", "checkpointId": "q1", "lastOffsetsBatch": 8,
           "lastCommittedBatch": 7, "replayBatch": 8}
    done = PodView(name="colors-probe-2", phase="Succeeded", attempt=2, owner_uid=UID, message=json.dumps(doc))
    p = plan(s, st, Observed(**{**observed().__dict__, "aux_pods": (done,)}))
    assert p.actions == [DeletePod("colors-probe-2", 0)]
    facts = p.status.pending_launch.checkpoint_facts
    assert (facts.checkpoint_id, facts.last_committed_batch, facts.replay_batch) == ("q1", 7, 8)
    p = plan(s, p.status, observed())
    assert [type(a) for a in p.actions] == [Resolve] and p.actions[0].facts == facts
    # A probe that fails is a failed start under the restart strategy.
    failed = PodView(name="colors-probe-2", phase="Failed", attempt=2, owner_uid=UID, exit_code=1,
                     message='{"reason":"CheckpointUnreadable","error":"OSError: gone"}')
    p = plan(s, st, Observed(**{**observed().__dict__, "aux_pods": (failed,)}))
    assert DeletePod("colors-probe-2", 0) in p.actions and "ProbeFailed" in reasons(p)
    assert p.status.restart_count == 1 and "checkpoint probe" in p.status.last_error
    # Other stores read the checkpoint in resolution itself: no probe.
    p = plan(spec(), st, observed())
    assert [type(a) for a in p.actions] == [Resolve] and p.actions[0].facts is None


def test_resolution_report_is_recorded_with_an_event():
    s = spec()
    st = ExactlyOnceStreamStatus(lifecycle_state="Deploying", observed_restart_nonce=0,
                                 pending_launch=PendingLaunch(attempt=0, pod="colors-driver-0", reason="Create"))
    report = ResolutionReport(stream_uid=UID, generation=0, slots=2, last_complete_batch=7, summary="all good")
    new, event = record_resolution(st, report, attempt=0, spec_hash=s.spec_hash(), observed=observed())
    assert new.resolution == report
    assert new.pending_launch.resolved_spec_hash == s.spec_hash()
    assert new.last_committed_batch == 7
    assert event.reason == "Resolved" and "all good" in event.message
    # A report for a launch that was replaced meanwhile is dropped.
    stale, none = record_resolution(st, report, attempt=5, spec_hash=s.spec_hash(), observed=observed())
    assert none is None and stale.resolution is None


def test_submit_creates_configmap_and_pod_after_resolution():
    s = spec()
    st = ExactlyOnceStreamStatus(lifecycle_state="Deploying", observed_restart_nonce=0,
                                 pending_launch=PendingLaunch(attempt=0, pod="colors-driver-0", reason="Create",
                                                              resolved_spec_hash=s.spec_hash()))
    p = plan(s, st, observed())
    kinds = [type(a) for a in p.actions]
    assert kinds == [ApplyConfigMap, CreatePod]
    assert p.actions[1].body["metadata"]["name"] == "colors-driver-0"
    # Write-ahead: the status names the Pod and the spec it runs before the create.
    assert p.status.driver_pod == "colors-driver-0"
    assert p.status.last_reconciled_spec == spec_json(s)
    assert p.status.pending_launch is not None   # cleared only once the Pod is seen


def test_cluster_mode_also_applies_the_headless_service():
    s = spec(job={"module": "m", "deployMode": "cluster"})
    st = ExactlyOnceStreamStatus(observed_restart_nonce=0, lifecycle_state="Deploying",
                                 pending_launch=PendingLaunch(attempt=0, pod="colors-driver-0", reason="Create",
                                                              resolved_spec_hash=s.spec_hash()))
    kinds = [type(a) for a in plan(s, st, observed()).actions]
    assert kinds == [ApplyConfigMap, ApplyService, CreatePod]


def test_seen_pod_completes_the_launch():
    s = spec()
    st = ExactlyOnceStreamStatus(lifecycle_state="Deploying", observed_restart_nonce=0, driver_pod="colors-driver-0",
                                 pending_launch=PendingLaunch(attempt=0, pod="colors-driver-0", reason="Create",
                                                              resolved_spec_hash=s.spec_hash()))
    p = plan(s, st, observed(pod("colors-driver-0", "Pending")))
    assert p.status.pending_launch is None
    assert p.status.driver_pod == "colors-driver-0"
    assert reasons(p) == ["Submitted"]
    assert p.actions == []


@pytest.mark.parametrize("resolved", [False, True])
def test_operator_restart_mid_launch_continues_the_same_launch(resolved):
    """Status says launching but there is no Pod: same attempt, same Pod name, never a new one."""
    s = spec()
    st = ExactlyOnceStreamStatus(lifecycle_state="Restarting", observed_restart_nonce=0, driver_attempt=3,
                                 driver_pod="colors-driver-3" if resolved else "colors-driver-2",
                                 restart_count=1,
                                 pending_launch=PendingLaunch(attempt=3, pod="colors-driver-3", reason="Restart",
                                                              resolved_spec_hash=s.spec_hash() if resolved else None))
    p = plan(s, st, observed(at=60))
    if resolved:
        assert [type(a) for a in p.actions] == [ApplyConfigMap, CreatePod]
        assert p.actions[1].body["metadata"]["name"] == "colors-driver-3"
    else:
        assert [type(a) for a in p.actions] == [Resolve]
        assert p.actions[0].attempt == 3
    assert p.status.pending_launch.attempt == 3
    assert p.status.restart_count == 1           # nothing counted twice


def test_operator_restart_after_pod_create_does_not_create_another():
    s = spec()
    st = ExactlyOnceStreamStatus(lifecycle_state="Restarting", observed_restart_nonce=0, driver_attempt=3,
                                 driver_pod="colors-driver-3",
                                 pending_launch=PendingLaunch(attempt=3, pod="colors-driver-3", reason="Restart",
                                                              resolved_spec_hash=s.spec_hash()))
    p = plan(s, st, observed(pod("colors-driver-3", "Running")))
    assert not any(isinstance(a, CreatePod) for a in p.actions)
    assert p.status.pending_launch is None


def test_spec_change_between_resolution_and_submit_resolves_again():
    s = spec()
    st = ExactlyOnceStreamStatus(lifecycle_state="Deploying", observed_restart_nonce=0,
                                 pending_launch=PendingLaunch(attempt=0, pod="colors-driver-0", reason="Create",
                                                              resolved_spec_hash="an-older-spec"))
    assert [type(a) for a in plan(s, st, observed()).actions] == [Resolve]


# --------------------------------------------------------------------- running
def test_running_pod_makes_the_stream_running_once():
    s = spec()
    st = running_status(s, lifecycle_state="Deploying", running_since=None)
    p = plan(s, st, observed(pod("colors-driver-0", "Running"), at=5, batch=12))
    assert p.status.lifecycle_state == "Running"
    assert reasons(p) == ["Running"]
    assert cond(p, "Ready").status == "True" and cond(p, "Ready").reason == "Running"
    assert cond(p, "Progressing").status == "False"
    assert cond(p, "Degraded").status == "False"
    assert p.status.running_since == fmt(T0 + timedelta(seconds=5))
    assert p.status.last_committed_batch == 12   # the progress hook
    again = plan(s, p.status, observed(pod("colors-driver-0", "Running"), at=10))
    assert again.events == [] and again.actions == []
    assert again.status == p.status.model_copy(update={"last_committed_batch": 12})


def test_pending_pod_is_deploying():
    s = spec()
    st = running_status(s, lifecycle_state="Deploying", running_since=None)
    p = plan(s, st, observed(pod("colors-driver-0", "Pending")))
    assert p.status.lifecycle_state == "Deploying"
    assert cond(p, "Ready").reason == "Deploying"
    assert p.requeue_after is not None


def test_leftover_pods_of_earlier_attempts_are_removed():
    s = spec()
    st = running_status(s, attempt=2)
    p = plan(s, st, observed(pod("colors-driver-1", "Failed"), pod("colors-driver-2", "Running")))
    assert p.actions == [DeletePod("colors-driver-1", 0)]


# -------------------------------------------------------------------- failures
def test_failed_pod_restarts_after_the_strategy_delay():
    s = spec()   # fixed-delay, 2 attempts, 10 s
    st = running_status(s)
    failed = pod("colors-driver-0", "Failed", exit_code=1, reason="Error", message="sink unreachable")
    p = plan(s, st, observed(failed, at=30))
    assert p.status.lifecycle_state == "Restarting"
    assert reasons(p) == ["DriverFailed", "Restarting"]
    assert p.status.restart_count == 1
    assert "exit code 1" in p.status.last_error and "sink unreachable" in p.status.last_error
    launch = p.status.pending_launch
    assert launch.attempt == 1 and launch.pod == "colors-driver-1" and launch.reason == "Restart"
    assert launch.not_before == "2026-01-01T12:00:40.000Z" == fmt_ms_ceil(T0 + timedelta(seconds=40))
    assert p.status.next_restart_time == launch.not_before
    assert cond(p, "Degraded").status == "True" and cond(p, "Degraded").reason == "DriverFailed"
    assert p.actions == []

    # Before the delay: wait, do nothing.
    wait = plan(s, p.status, observed(failed, at=35))
    assert wait.actions == [] and wait.events == []
    assert wait.requeue_after == pytest.approx(5.0)
    # After it: resolution, then the new Pod. The failed Pod stays for its log (it ended: never a second
    # driver) until a later driver commits a batch beyond its last.
    assert p.status.failed_driver.pod == "colors-driver-0" and p.status.failed_driver.batch is None
    assert "kubectl logs -n default colors-driver-0" in p.events[0].message
    go = plan(s, p.status, observed(failed, at=41))
    assert [type(a) for a in go.actions] == [Resolve]


def test_an_oom_killed_driver_is_a_failure_whose_message_says_which_field_to_raise():
    s = spec()
    killed = pod("colors-driver-0", "Failed", exit_code=137, reason="OOMKilled")
    p = plan(s, running_status(s), observed(killed, at=30))
    assert p.status.restart_count == 1 and reasons(p) == ["DriverFailed", "Restarting"]
    (failed,) = [e for e in p.events if e.reason == "DriverFailed"]
    assert "OOMKilled" in failed.message and "job.driver.memory 1Gi" in failed.message
    assert "JVM heap 480 MiB" in failed.message and "raise job.driver.memory" in failed.message
    assert "kubectl logs -n default colors-driver-0" in failed.message
    # Status says it too, with the fix, before the log's tail (which a long log cuts, not the advice).
    assert p.status.last_error.startswith("driver Pod colors-driver-0 failed (exit code 137, OOMKilled): the "
                                          "container passed its memory limit, job.driver.memory 1Gi (")
    assert "raise job.driver.memory" in p.status.last_error
    long_log = plan(s, running_status(s), observed(pod("colors-driver-0", "Failed", exit_code=137, reason="OOMKilled",
                                                       message="x" * 5000), at=30))
    assert "raise job.driver.memory. Log: xxx" in long_log.status.last_error
    # Another failure gets no memory advice.
    other = plan(s, running_status(s), observed(pod("colors-driver-0", "Failed", exit_code=137), at=30))
    assert not [e for e in other.events if "raise job.driver.memory" in e.message]


def test_a_sub_second_restart_delay_is_kept_to_the_millisecond_and_so_is_the_wait():
    """Whole seconds rounded up would add up to a second to every recovery."""
    s = spec(restartStrategy={"type": "fixed-delay", "fixedDelay": {"attempts": 2, "delaySeconds": 0.3}})
    failed = pod("colors-driver-0", "Failed", exit_code=137)
    p = plan(s, running_status(s), observed(failed, at=30.25))
    launch = p.status.pending_launch
    assert launch.not_before == "2026-01-01T12:00:30.550Z" == p.status.next_restart_time
    assert (parse(launch.not_before) - observed(at=30.25).now).total_seconds() == pytest.approx(0.3)
    wait = plan(s, p.status, observed(failed, at=30.4))
    assert wait.actions == [] and wait.requeue_after == pytest.approx(0.15)
    go = plan(s, p.status, observed(failed, at=30.55))
    assert [type(a) for a in go.actions] == [Resolve]   # the failed Pod is kept


def test_a_zero_restart_delay_waits_for_no_second_boundary():
    s = spec(restartStrategy={"type": "fixed-delay", "fixedDelay": {"attempts": 2, "delaySeconds": 0}})
    failed = pod("colors-driver-0", "Failed", exit_code=137)
    p = plan(s, running_status(s), observed(failed, at=30.2504))
    assert p.status.pending_launch.not_before == "2026-01-01T12:00:30.251Z"   # never before now: rounded up
    go = plan(s, p.status, observed(failed, at=30.252))
    assert [type(a) for a in go.actions] == [Resolve]   # the failed Pod is kept


def test_a_restart_time_an_older_operator_wrote_in_whole_seconds_is_still_honoured():
    s = spec()
    st = running_status(s, lifecycle_state="Restarting", driver_pod=None, running_since=None, restart_count=1,
                        next_restart_time="2026-01-01T12:00:40Z",
                        pending_launch=PendingLaunch(attempt=1, pod="colors-driver-1", reason="Restart",
                                                     not_before="2026-01-01T12:00:40Z"))
    failed = pod("colors-driver-0", "Failed", exit_code=1)
    wait = plan(s, st, observed(failed, at=39.75))
    assert wait.actions == [] and wait.requeue_after == pytest.approx(0.25)
    go = plan(s, st, observed(failed, at=40))
    assert go.actions == [DeletePod("colors-driver-0", 0)]


def test_succeeded_pod_while_running_is_a_failure():
    s = spec()
    p = plan(s, running_status(s), observed(pod("colors-driver-0", "Succeeded", exit_code=0)))
    assert p.status.lifecycle_state == "Restarting"
    assert "while job.state is running" in p.status.last_error


def test_vanished_pod_is_a_failure():
    s = spec()
    p = plan(s, running_status(s), observed())
    assert p.status.lifecycle_state == "Restarting"
    assert "disappeared" in p.status.last_error


def test_terminating_pod_is_waited_for():
    s = spec()
    p = plan(s, running_status(s), observed(pod("colors-driver-0", "Running", deleting=True)))
    assert p.actions == [] and p.status.pending_launch is None
    assert cond(p, "Progressing").reason == "DriverTerminating"


def test_exhausted_restarts_fail_the_stream_and_keep_it_failed():
    s = spec()
    st = running_status(s, attempt=2, restart_count=2)
    failed = pod("colors-driver-2", "Failed", exit_code=3, message="SinkUnavailable")
    p = plan(s, st, observed(failed))
    assert p.status.lifecycle_state == "Failed"
    assert reasons(p) == ["DriverFailed", "RestartsExhausted"]
    assert p.status.pending_launch is None
    ready = cond(p, "Ready")
    assert ready.status == "False" and ready.reason == "RestartsExhausted"
    assert "SinkUnavailable" in ready.message and "exit code 3" in ready.message
    assert p.actions == []                       # checkpoint, ledger and the failed Pod untouched
    stay = plan(s, p.status, observed(failed, at=3600))
    assert stay.actions == [] and stay.events == [] and stay.status == p.status


def test_a_refused_batch_fails_the_stream_at_once_and_a_nonce_retries():
    s = spec()   # two restarts allowed: none is spent on a batch that would be refused again
    st = running_status(s)
    summary = ('{"reason": "BatchRefused", "error": "batch 7 was planned over events[0] 10..31, but the '
               'ledger\'s batch 7 of this checkpoint is events[0] 10..20"}')
    refused = pod("colors-driver-0", "Failed", exit_code=1, message=summary)
    p = plan(s, st, observed(refused))
    assert p.status.lifecycle_state == "Failed"
    assert reasons(p) == ["BatchRefused"]
    assert p.status.restart_count == 0 and p.status.pending_launch is None and p.actions == []
    ready = cond(p, "Ready")
    assert ready.reason == "BatchRefused" and "10..31" in ready.message and "10..20" in ready.message
    assert "restartNonce" in cond(p, "Progressing").message
    stay = plan(s, p.status, observed(refused, at=3600))
    assert stay.actions == [] and stay.events == [] and stay.status == p.status
    again = plan(spec(restartNonce=1), p.status, observed(refused, at=3700))
    assert again.status.pending_launch is not None and again.status.pending_launch.reason == "RestartRequested"


def test_a_spec_the_jobs_plan_contradicts_fails_at_once_and_the_spec_change_starts_it_again():
    """The driver refused its spec (job.slotsFrom sourcePartitions on a job that shuffles): no restart would
    help, so none is spent; changing the field the message names upgrades the stream (a new generation)."""
    s = spec(job={"module": "tests.e2e.jobs.sleeper", "parallelism": 2, "slotsFrom": "sourcePartitions"})
    st = running_status(s)
    summary = ('{"reason": "InvalidSpec", "error": "job.slotsFrom sourcePartitions needs a map-only job (one Kafka '
               'source, no shuffle), but the batch\'s plan has a ShuffleDependency in its lineage"}')
    refused = pod("colors-driver-0", "Failed", exit_code=1, message=summary)
    p = plan(s, st, observed(refused))
    assert p.status.lifecycle_state == "Failed" and reasons(p) == ["InvalidSpec"]
    assert p.status.restart_count == 0 and p.status.pending_launch is None and p.actions == []
    assert "job.slotsFrom" in cond(p, "Ready").message
    assert "change the field" in cond(p, "Progressing").message
    stay = plan(s, p.status, observed(refused, at=3600))
    assert stay.actions == [] and stay.events == [] and stay.status == p.status
    fixed = spec(job={"module": "tests.e2e.jobs.sleeper", "parallelism": 2, "slotsFrom": "key"})
    again = plan(fixed, p.status, observed(refused, at=3700))
    assert again.status.upgrade is not None or again.status.pending_launch is not None, again
    assert "job.slotsFrom changed: new transactional-id generation" in " ".join(e.message for e in again.events)


def test_restart_nonce_resumes_a_failed_stream_and_resets_counters():
    s = spec()
    failed_status = plan(s, running_status(s, attempt=2, restart_count=2),
                         observed(pod("colors-driver-2", "Failed"))).status
    bumped = spec(restartNonce=1)
    p = plan(bumped, failed_status, observed(pod("colors-driver-2", "Failed"), at=100))
    assert p.status.restart_count == 0
    assert p.status.observed_restart_nonce == 1
    assert p.status.lifecycle_state == "Restarting"
    assert p.status.pending_launch.attempt == 3 and p.status.pending_launch.reason == "RestartRequested"
    assert p.status.pending_launch.not_before is None
    assert "Restarting" in reasons(p)
    nxt = plan(bumped, p.status, observed(pod("colors-driver-2", "Failed"), at=100))
    assert [type(a) for a in nxt.actions] == [Resolve]         # the failed Pod stays for its log


def test_restart_nonce_restarts_a_running_driver_gracefully():
    s = spec()
    p = plan(spec(restartNonce=7), running_status(s), observed(pod("colors-driver-0")))
    assert p.status.pending_launch.reason == "RestartRequested"
    nxt = plan(spec(restartNonce=7), p.status, observed(pod("colors-driver-0")))
    assert nxt.actions == [DeletePod("colors-driver-0", 60)]


def test_resolution_failure_counts_as_a_failed_start():
    s = spec()
    st = ExactlyOnceStreamStatus(lifecycle_state="Deploying", observed_restart_nonce=0,
                                 pending_launch=PendingLaunch(attempt=0, pod="colors-driver-0", reason="Create"))
    p = record_resolution_failure(s, st, "KafkaException: broker down", attempt=0, observed=observed())
    assert p.status.lifecycle_state == "Restarting"
    assert p.status.restart_count == 1
    assert p.status.pending_launch.pod == "colors-driver-0"     # no Pod was made: same name
    assert p.status.pending_launch.not_before == fmt_ms_ceil(T0 + timedelta(seconds=10))
    assert "broker down" in p.status.last_error
    assert reasons(p) == ["ResolutionFailed", "Restarting"]
    exhausted = record_resolution_failure(s, p.status.model_copy(update={"restart_count": 2}), "down",
                                          attempt=0, observed=observed(at=20))
    assert exhausted.status.lifecycle_state == "Failed"
    assert cond(exhausted, "Ready").reason == "RestartsExhausted"


# ------------------------------------------------------------ suspend / resume
def test_suspend_stops_the_driver_gracefully_then_is_suspended():
    s = spec(job={"module": "m", "state": "suspended"})
    st = running_status(spec(job={"module": "m"}))
    p = plan(s, st, observed(pod("colors-driver-0")))
    assert p.actions == [DeletePod("colors-driver-0", 60)]
    assert cond(p, "Progressing").reason == "Suspending"
    terminating = plan(s, p.status, observed(pod("colors-driver-0", deleting=True)))
    assert terminating.actions == []
    gone = plan(s, terminating.status, observed())
    assert gone.status.lifecycle_state == "Suspended"
    assert reasons(gone) == ["Suspended"]
    assert gone.status.driver_pod is None
    assert cond(gone, "Ready").reason == "Suspended"
    assert plan(s, gone.status, observed()).events == []


def test_suspend_cancels_a_pending_restart():
    s = spec(job={"module": "m", "state": "suspended"})
    st = running_status(spec(job={"module": "m"}), lifecycle_state="Restarting",
                        pending_launch=PendingLaunch(attempt=1, pod="colors-driver-1", reason="Restart",
                                                     not_before=fmt(T0 + timedelta(seconds=99))))
    p = plan(s, st, observed(pod("colors-driver-0", "Failed")))
    assert p.status.pending_launch is None
    assert p.actions == [DeletePod("colors-driver-0", 0)]


def test_resume_launches_with_resolution_first():
    s = spec(job={"module": "m"})
    st = ExactlyOnceStreamStatus(lifecycle_state="Suspended", observed_restart_nonce=0, driver_attempt=4,
                                 last_reconciled_spec=spec_json(s))
    p = plan(s, st, observed())
    assert reasons(p) == ["Resumed"]
    assert p.status.pending_launch.attempt == 5 and p.status.pending_launch.reason == "Resume"
    nxt = plan(s, p.status, observed())
    assert [type(a) for a in nxt.actions] == [Resolve]


def test_created_suspended_starts_nothing():
    s = spec(job={"module": "m", "state": "suspended"})
    p = plan(s, ExactlyOnceStreamStatus(), observed())
    assert p.status.lifecycle_state == "Suspended" and p.actions == []


# ----------------------------------------------------------------- spec change
def test_spec_change_restarts_with_resolution():
    old = spec()
    new = spec(job={"module": "tests.e2e.jobs.sleeper", "parallelism": 2, "args": {"x": "1"}},
               upgradeMode="last-state", upgradePreFlight=False)   # snapshot mode, pre-flight: own tests
    p = plan(new, running_status(old), observed(pod("colors-driver-0")))
    assert p.status.lifecycle_state == "Upgrading"
    assert p.status.pending_launch.reason == "SpecChange"
    assert "job.args" in p.events[0].message
    stop = plan(new, p.status, observed(pod("colors-driver-0")))
    assert stop.actions == [DeletePod("colors-driver-0", 60)]     # graceful: a clean batch boundary
    from .test_upgrades import through_drain
    drained, _, _ = through_drain(new, stop.status)               # last-state: the old spec finishes its batch
    resolve = plan(new, drained, observed())
    assert [type(a) for a in resolve.actions] == [Resolve]
    assert resolve.actions[0].config.spec == new


@pytest.mark.parametrize("change", [
    {"restartStrategy": {"type": "exponential-delay"}},
    {"upgradeMode": "stateless"},
])
def test_operator_only_changes_do_not_restart(change):
    old = spec()
    new = spec(**change)
    p = plan(new, running_status(old), observed(pod("colors-driver-0")))
    assert p.status.pending_launch is None and p.actions == []
    assert p.status.lifecycle_state == "Running"


def test_spec_change_relaunches_a_failed_stream():
    old = spec()
    failed = running_status(old, lifecycle_state="Failed", restart_count=2)
    new = spec(job={"module": "fixed.module"})
    p = plan(new, failed, observed(pod("colors-driver-0", "Failed")))
    assert p.status.pending_launch.reason == "SpecChange"


# ------------------------------------------------------------------ invalid spec
def test_invalid_spec_sets_condition_and_event_and_does_nothing_else():
    bad = validate_spec(base_spec(sink={"bootstrapServers": "localhost:9092", "topic": "in"}))
    assert isinstance(bad, InvalidSpec)
    p = plan(bad, ExactlyOnceStreamStatus(), observed())
    assert p.actions == []
    assert p.status.lifecycle_state == "Invalid"
    ready = cond(p, "Ready")
    assert ready.status == "False" and ready.reason == "InvalidSpec" and "spec.sink.topic" in ready.message
    assert reasons(p) == ["InvalidSpec"]
    assert plan(bad, p.status, observed()).events == []   # not repeated every pass


def test_invalid_spec_leaves_a_running_driver_alone():
    s = spec()
    bad = InvalidSpec(("spec.job.module: broken",))
    p = plan(bad, running_status(s), observed(pod("colors-driver-0")))
    assert p.actions == [] and p.status.lifecycle_state == "Running"
    assert cond(p, "Ready").reason == "InvalidSpec"


def test_fixing_an_invalid_spec_launches():
    bad = InvalidSpec(("spec.job.module: broken",))
    invalid_status = plan(bad, ExactlyOnceStreamStatus(), observed()).status
    p = plan(spec(), invalid_status, observed(generation=2))
    assert p.status.pending_launch.attempt == 0
    assert p.status.observed_generation == 2


# -------------------------------------------------------------------- deletion
def test_deletion_stops_drivers_then_removes_children():
    s = spec()
    p = plan(s, running_status(s), observed(pod("colors-driver-0"), deleting=True))
    assert p.actions == [DeletePod("colors-driver-0", 60)] and not p.finished
    done = plan(s, running_status(s), observed(deleting=True))
    assert done.actions == [DeleteConfigMap("colors-run", UID), DeleteConfigMap("colors-preflight", UID),
                            DeleteConfigMap("colors-drain", UID), DeleteConfigMap("colors-probe", UID), DeleteConfigMap("colors-check", UID), DeleteService("colors-driver", UID)]
    assert done.finished


# ------------------------------------------------------------------ conditions
def test_last_transition_time_moves_only_when_status_flips():
    s = spec()
    st = running_status(s, lifecycle_state="Deploying", running_since=None)
    deploying = plan(s, st, observed(pod("colors-driver-0", "Pending"), at=0))
    still = plan(s, deploying.status, observed(pod("colors-driver-0", "Pending"), at=30))
    assert cond(still, "Ready").last_transition_time == cond(deploying, "Ready").last_transition_time
    running = plan(s, still.status, observed(pod("colors-driver-0", "Running"), at=60))
    assert cond(running, "Ready").last_transition_time == fmt(T0 + timedelta(seconds=60))
    # Progressing: True (DriverStarting) -> False (Running) flips too.
    assert cond(running, "Progressing").last_transition_time == fmt(T0 + timedelta(seconds=60))
    # Degraded stayed False: its time is from the first pass.
    assert cond(running, "Degraded").last_transition_time == fmt(T0)
    for c in running.status.conditions:
        assert c.observed_generation == 1


def test_plan_is_pure_and_deterministic():
    s = spec(restartStrategy={"type": "exponential-delay"})
    st = running_status(s)
    obs = observed(pod("colors-driver-0", "Failed"), at=700)
    before = st.model_copy(deep=True)
    a, b = plan(s, st, obs), plan(s, st, obs)
    assert a.status == b.status and a.events == b.events and a.actions == b.actions
    assert st == before                          # the input status is not mutated


# ------------------------------------------------------------- a driver that cannot start
def test_a_driver_that_cannot_start_says_why_once_then_fails_at_its_deadline():
    from eos_operator.observed import pod_view
    from eos_operator.timeutil import fmt as fmt_

    s = spec(job={"module": "m", "driver": {"startTimeoutSeconds": 60}})
    st = running_status(s, lifecycle_state="Deploying", running_since=None)
    raw = {"metadata": {"name": "colors-driver-0", "creationTimestamp": fmt_(T0),
                        "labels": {"streaming.eos.dev/attempt": "0"},
                        "ownerReferences": [{"uid": UID, "controller": True}]},
           "status": {"phase": "Pending", "containerStatuses": [{"name": "driver", "state": {"waiting": {
               "reason": "CreateContainerConfigError", "message": 'secret "sink-creds" not found'}}}]}}
    blocked = pod_view(raw)
    assert blocked.blocked == 'CreateContainerConfigError: secret "sink-creds" not found'
    p = plan(s, st, observed(blocked, at=10))
    assert cond(p, "Ready").reason == "DriverStartBlocked" and "sink-creds" in cond(p, "Ready").message
    assert reasons(p) == ["DriverStartBlocked"] and p.actions == []
    again = plan(s, p.status, observed(blocked, at=20))
    assert reasons(again) == []                                 # one event per distinct cause
    late = plan(s, again.status, observed(blocked, at=61))
    assert "DriverFailed" in reasons(late) and late.status.pending_launch.reason == "Restart"
    assert "did not start within 60s" in late.status.last_error and "sink-creds" in late.status.last_error
    # Unschedulable: the scheduler's condition is the reason.
    raw["status"] = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                     "reason": "Unschedulable", "message": "0/1 nodes are available"}]}
    assert pod_view(raw).blocked == "Unschedulable: 0/1 nodes are available"
    # A Pod that is merely being created is not blocked.
    raw["status"] = {"phase": "Pending", "containerStatuses": [{"state": {"waiting": {"reason": "ContainerCreating"}}}]}
    assert pod_view(raw).blocked is None


def test_a_deletion_that_waits_on_a_driver_that_does_not_stop_says_so_once():
    from dataclasses import replace as dc_replace

    from eos_operator.planner import plan_deletion
    from eos_operator.timeutil import fmt as fmt_
    st = running_status(spec())
    going = pod("colors-driver-0", deleting=True, deleting_since=fmt_(T0))
    early = plan_deletion(st, dc_replace(observed(going, at=30), deleting=True))
    assert reasons(early) == [] and not early.finished
    late = plan_deletion(st, dc_replace(observed(going, at=200), deleting=True))
    assert reasons(late) == ["DeletionWaiting"] and "colors-driver-0" in late.events[0].message
    again = plan_deletion(late.status, dc_replace(observed(going, at=210), deleting=True))
    assert reasons(again) == []


def test_a_failed_cluster_mode_driver_is_not_kept_since_it_owns_its_executors():
    s = spec(job={"module": "tests.e2e.jobs.sleeper", "parallelism": 2, "deployMode": "cluster"})
    failed = pod("colors-driver-0", "Failed", exit_code=1)
    p = plan(s, running_status(s), observed(failed, at=30))
    assert p.status.failed_driver is None and "kubectl logs" not in p.events[0].message
    go = plan(s, p.status, observed(failed, at=41))
    assert go.actions == [DeletePod("colors-driver-0", 0)]


# -------------------------------------------------------------------- eviction (a drain): a planned stop
def test_an_evicted_driver_is_a_planned_stop_not_a_counted_failure():
    s = spec()
    st = running_status(s)
    # The Eviction API deleted it: DisruptionTarget set, SIGTERM sent; the operator waits, says evicted.
    terminating = plan(s, st, observed(pod("colors-driver-0", "Running", deleting=True, evicted=True)))
    assert terminating.actions == [] and terminating.status.pending_launch is None
    assert cond(terminating, "Progressing").reason == "DriverEvicted"
    assert reasons(terminating) == ["DriverEvicting"]
    # Gone: a new driver at once, no attempt of the strategy consumed, no failure recorded.
    gone = plan(s, terminating.status, observed(at=30))
    assert reasons(gone) == ["DriverEvicted"]
    assert gone.status.restart_count == 0 and gone.status.failure_times == []
    launch = gone.status.pending_launch
    assert launch.reason == "Restart" and launch.pod == "colors-driver-1" and launch.not_before is None
    assert cond(gone, "Degraded").reason != "DriverFailed"
    # An evicted Pod seen ended (not yet deleted) is the same planned stop.
    ended = plan(s, st, observed(pod("colors-driver-0", "Failed", exit_code=143, evicted=True)))
    assert reasons(ended) == ["DriverEvicted"] and ended.status.restart_count == 0


def test_negative_control_the_same_disappearance_without_an_eviction_is_counted():
    s = spec()
    st = running_status(s)
    terminating = plan(s, st, observed(pod("colors-driver-0", "Running", deleting=True)))
    gone = plan(s, terminating.status, observed(at=30))
    assert "DriverFailed" in reasons(gone) and gone.status.restart_count == 1
    assert gone.status.pending_launch.reason == "Restart"


def test_pod_view_reads_the_eviction_condition():
    from eos_operator.observed import pod_view
    evicted = {"metadata": {"name": "d-0", "deletionTimestamp": "2026-01-01T12:00:00Z"},
               "status": {"phase": "Running", "conditions": [
                   {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}]}}
    assert pod_view(evicted).evicted
    other = {"metadata": {"name": "d-0"}, "status": {"phase": "Running", "conditions": [
        {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}]}}
    assert not pod_view(other).evicted
