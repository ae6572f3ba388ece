"""The ExactlyOnceSnapshot resource: the pure planner, its Pods, and the reconciler over the fake Kube."""
from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import pytest

from eos_job.spec import ExactlyOnceStreamSpec, stream_uid
from eos_job.snapshot_resource import ExactlyOnceSnapshotStatus, SnapshotSpec
from eos_operator import children
from eos_operator import snapshots as snaps
from eos_operator.adapters import KubeError
from eos_operator.handlers import OperatorConfig, build_registry
from eos_operator.actions import CreatePod, DeletePod
from eos_operator.reconciler import Deps, reconcile
from eos_operator.snapshot_reconciler import reconcile_snapshot
from eos_operator.snapshot_planner import plan_snapshot
from eos_operator.observed import PodView, pod_view
from eos_operator.snapshots import SnapshotObserved, parse_result, retry_delay, snapshot_resource
from eos_operator.upgrades import spec_json
from eos_operator.validation import InvalidSpec

from .fakes import T0, FakeClock, FakeKube, FakeResolver, base_spec

NS = "default"
UID = "snap-uid-1"
CKPT = "/tmp/eos-test"
GOOD = json.dumps({"reason": "SnapshotTaken", "path": f"{CKPT}/snapshots/s1", "lastBatch": 7,
                   "checkpointId": "q-1", "streamUid": stream_uid(NS, "colors"), "time": "2026-01-01T12:00:05Z",
                   "sizeBytes": 1234, "specHash": "abc"}, separators=(",", ":"))


# ------------------------------------------------------------------- helpers
def stream_obj(spec: dict | None = None, status: dict | None = None) -> dict:
    spec = spec or base_spec()
    if status is None:
        status = {"checkpointDir": f"{CKPT}/ckpt-3", "txGeneration": 2,
                  "lastReconciledSpec": spec_json(ExactlyOnceStreamSpec.model_validate(spec))}
    return {"metadata": {"name": "colors", "namespace": NS, "uid": "stream-uid"}, "spec": spec, "status": status}


def observed(*pods: PodView, stream: dict | None | str = "default", now=T0, deleting=False,
             name="s1") -> SnapshotObserved:
    return SnapshotObserved(name=name, namespace=NS, uid=UID, generation=1, now=now,
                            stream=stream_obj() if stream == "default" else stream, pods=tuple(pods),
                            deleting=deleting)


def spec(**kw) -> SnapshotSpec:
    return SnapshotSpec(stream="colors", **kw)


def status(**kw) -> ExactlyOnceSnapshotStatus:
    return ExactlyOnceSnapshotStatus(**kw)


def pod(name="s1-snap-1", phase="Running", *, action="take", exit_code=None, message=None, finished_at=None,
        owner=UID, deleting=False) -> PodView:
    return PodView(name=name, action=action, phase=phase, exit_code=exit_code, message=message,
                       finished_at=finished_at, owner_uid=owner, deleting=deleting)


def in_progress(attempts=1, **kw) -> ExactlyOnceSnapshotStatus:
    return status(state="InProgress", attempts=attempts, pod=f"s1-snap-{attempts}",
                  path=f"{CKPT}/snapshots/s1", **kw)


def created(plan) -> list[dict]:
    return [a.body for a in plan.actions if isinstance(a, CreatePod)]


def deleted(plan) -> list[tuple[str, int]]:
    return [(a.name, a.grace_seconds) for a in plan.actions if isinstance(a, DeletePod)]


def reasons(plan) -> list[str]:
    return [e.reason for e in plan.events]


def argv_value(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


# ----------------------------------------------------------- Pending -> take
def test_pending_creates_the_take_pod_and_records_it_first():
    plan = plan_snapshot(spec(), status(), observed())
    st = plan.status
    assert (st.state, st.attempts, st.pod, st.path) == ("InProgress", 1, "s1-snap-1", f"{CKPT}/snapshots/s1")
    assert st.observed_generation == 1 and reasons(plan) == ["SnapshotStarted"]
    [body] = created(plan)
    meta, pod_spec = body["metadata"], body["spec"]
    assert meta["name"] == "s1-snap-1"
    assert meta["labels"] == {"app.kubernetes.io/managed-by": "eos-operator", "app.kubernetes.io/component": "snapshot",
                              "streaming.eos.dev/snapshot": "s1", "streaming.eos.dev/stream": "colors",
                              "streaming.eos.dev/snapshot-action": "take", "streaming.eos.dev/attempt": "1"}
    assert meta["ownerReferences"] == [{"apiVersion": "streaming.eos.dev/v1beta1", "kind": "ExactlyOnceSnapshot",
                                        "name": "s1", "uid": UID, "controller": True, "blockOwnerDeletion": False}]
    assert pod_spec["restartPolicy"] == "Never" and [v["name"] for v in pod_spec["volumes"]] == ["eos-scratch"]
    [container] = pod_spec["containers"]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert container["image"] == ExactlyOnceStreamSpec.model_validate(base_spec()).job.image
    command = container["args"]
    assert command[:5] == ["python", "-m", "eos_job", "snapshot", "take"]
    assert argv_value(command, "--checkpoint") == f"{CKPT}/ckpt-3"          # status.checkpointDir
    assert argv_value(command, "--dest") == f"{CKPT}/snapshots/s1"
    assert json.loads(argv_value(command, "--stream-json")) == {
        "name": "colors", "namespace": NS, "uid": stream_uid(NS, "colors"), "generation": 2}
    assert argv_value(command, "--spec-hash") == ExactlyOnceStreamSpec.model_validate(base_spec()).spec_hash()


def test_take_falls_back_to_live_under_the_launched_spec_and_hashes_that_spec():
    launched = base_spec(checkpoint={"store": "local", "path": "/old"})
    current = base_spec(checkpoint={"store": "local", "path": "/new"})
    obj = stream_obj(current, {"lastReconciledSpec": spec_json(ExactlyOnceStreamSpec.model_validate(launched))})
    [body] = created(plan_snapshot(spec(), status(), observed(stream=obj)))
    command = body["spec"]["containers"][0]["args"]
    assert argv_value(command, "--checkpoint") == "/old/live"
    assert argv_value(command, "--spec-hash") == ExactlyOnceStreamSpec.model_validate(launched).spec_hash()
    assert json.loads(argv_value(command, "--stream-json"))["generation"] == 0
    assert argv_value(command, "--dest") == "/new/snapshots/s1"   # snapshots go under the current spec's path


def test_pvc_store_mounts_the_claim_like_the_driver_and_uses_its_service_account():
    pvc = base_spec(checkpoint={"store": "pvc", "claimName": "ckpt-claim", "path": "/ckpt"},
                    job={"module": "m", "serviceAccountName": "spark-eos-driver", "image": "img:1"})
    plan = plan_snapshot(spec(), status(), observed(stream=stream_obj(pvc)))
    [body] = created(plan)
    pod_spec = body["spec"]
    assert pod_spec["volumes"][0] == {"name": "checkpoint", "persistentVolumeClaim": {"claimName": "ckpt-claim"}}
    assert pod_spec["containers"][0]["volumeMounts"][0] == {"name": "checkpoint", "mountPath": "/ckpt"}
    assert [v["name"] for v in pod_spec["volumes"]] == ["checkpoint", "eos-scratch"]
    assert pod_spec["serviceAccountName"] == "spark-eos-driver"
    assert pod_spec["containers"][0]["image"] == "img:1"
    assert plan.status.path == "/ckpt/snapshots/s1"
    assert "nodeSelector" not in pod_spec
    # The running driver holds the (ReadWriteOnce) claim: the take lands on its node.
    from dataclasses import replace
    pinned = plan_snapshot(spec(), status(), replace(observed(stream=stream_obj(pvc)), driver_node="node-7"))
    assert created(pinned)[0]["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "node-7"}


def test_spec_path_is_the_destination():
    plan = plan_snapshot(spec(path=f"{CKPT}/elsewhere/s1"), status(), observed())
    assert plan.status.path == f"{CKPT}/elsewhere/s1"
    assert argv_value(created(plan)[0]["spec"]["containers"][0]["args"], "--dest") == f"{CKPT}/elsewhere/s1"


@pytest.mark.parametrize("path", ["/elsewhere/s1", "file:///elsewhere/s1", "s3a://checkpoints/streams/s1"])
def test_a_spec_path_outside_the_streams_store_fails_before_any_pod(path):
    # The snapshot's Pods run with the stream's volume and keys: they copy to, inspect and dispose of nothing else.
    plan = plan_snapshot(spec(path=path), status(), observed())
    assert plan.status.state == "Failed" and not created(plan) and plan.status.path is None
    assert plan.status.last_error.startswith("spec.path: ") and f"checkpoint.path ({CKPT})" in plan.status.last_error
    up = spec(trigger="upgrade", path=path)   # an upgrade snapshot's files are disposed whatever its state: not these
    failed = plan_snapshot(up, status(), observed()).status
    assert failed.state == "Failed" and failed.path is None
    gone = plan_snapshot(up, failed, observed(deleting=True))
    assert gone.finished and not created(gone) and reasons(gone) == ["SnapshotKept"]
    assert "outside the stream's store" in gone.events[0].message


def test_a_spec_path_of_an_s3_stream_must_be_in_its_bucket():
    keys = {"accessKeyId": {"name": "keys", "key": "id"}, "secretAccessKey": {"name": "keys", "key": "secret"}}
    s3 = base_spec(checkpoint={"store": "s3", "path": "/streams/colors", "s3": {"bucket": "checkpoints", **keys}})
    inside = plan_snapshot(spec(path="s3a://checkpoints/other/s1"), status(), observed(stream=stream_obj(s3)))
    assert inside.status.state == "InProgress"
    for path in ("s3a://other-team/streams/s1", "/streams/colors/s1"):
        plan = plan_snapshot(spec(path=path), status(), observed(stream=stream_obj(s3)))
        assert plan.status.state == "Failed" and "s3a://checkpoints/<key>" in plan.status.last_error, path


def test_upgrade_trigger_inspects_the_drivers_snapshot_instead_of_taking_one():
    never_started = stream_obj(status={})                 # an upgrade snapshot needs no live checkpoint
    plan = plan_snapshot(spec(trigger="upgrade", path="/tmp/eos-test/snapshots/colors-a1"), status(),
                         observed(stream=never_started))
    [body] = created(plan)
    assert body["spec"]["containers"][0]["args"] == [
        "python", "-m", "eos_job", "snapshot", "inspect", "--path", "/tmp/eos-test/snapshots/colors-a1"]
    assert body["metadata"]["labels"]["streaming.eos.dev/snapshot-action"] == "inspect"
    assert plan.status.path == "/tmp/eos-test/snapshots/colors-a1"


def test_upgrade_trigger_without_a_path_fails_naming_the_field():
    plan = plan_snapshot(spec(trigger="upgrade"), status(), observed())
    assert plan.status.state == "Failed" and "spec.path is required" in plan.status.message
    assert not created(plan)


# --------------------------------------------------------- the stream's state
def test_missing_stream_fails_a_never_started_snapshot_with_the_fix():
    plan = plan_snapshot(spec(), status(), observed(stream=None))
    st = plan.status
    assert st.state == "Failed" and st.attempts == 0
    assert "stream colors does not exist in namespace default" in st.message
    assert "create the ExactlyOnceStream colors" in st.message
    assert reasons(plan) == ["SnapshotFailed"] and not plan.actions


def test_invalid_stream_fails_the_snapshot_naming_the_streams_field():
    broken = stream_obj(base_spec(sink={"bootstrapServers": "localhost:9092", "topic": "in"}))
    plan = plan_snapshot(spec(), status(), observed(stream=broken))
    assert plan.status.state == "Failed"
    assert "invalid spec" in plan.status.message and "spec.sink.topic" in plan.status.message


def test_stream_without_a_checkpoint_counts_as_a_failed_attempt():
    plan = plan_snapshot(spec(), status(), observed(stream=stream_obj(status={})))
    st = plan.status
    assert (st.state, st.attempts) == ("Pending", 1) and "no checkpoint yet" in st.last_error
    assert st.next_attempt_time == "2026-01-01T12:00:10Z"
    assert not created(plan) and reasons(plan) == ["SnapshotAttemptFailed"]


def test_stream_gone_during_retries_counts_as_an_attempt():
    waiting = status(state="Pending", attempts=1, last_error="x", next_attempt_time="2026-01-01T11:59:00Z")
    plan = plan_snapshot(spec(), waiting, observed(stream=None))
    assert (plan.status.state, plan.status.attempts) == ("Pending", 2) and "does not exist" in plan.status.last_error


# ---------------------------------------------------------- InProgress -> ...
def test_success_parses_the_termination_message_and_deletes_the_pod():
    done = pod(phase="Succeeded", exit_code=0, message=GOOD)
    plan = plan_snapshot(spec(), in_progress(), observed(done))
    st = plan.status
    assert st.state == "Completed"
    assert (st.batch, st.checkpoint_id, st.stream_uid, st.size_bytes, st.taken_at, st.spec_hash) == (
        7, "q-1", stream_uid(NS, "colors"), 1234, "2026-01-01T12:00:05Z", "abc")
    assert st.pod is None and st.last_error is None and st.path == f"{CKPT}/snapshots/s1"
    assert reasons(plan) == ["SnapshotCompleted"] and "batch 7" in plan.events[0].message
    assert deleted(plan) == [("s1-snap-1", 0)] and not created(plan)


def test_a_snapshot_of_another_stream_id_is_flagged():
    other = GOOD.replace(stream_uid(NS, "colors"), "f" * 32)
    plan = plan_snapshot(spec(), in_progress(), observed(pod(phase="Succeeded", message=other)))
    assert plan.status.state == "Completed" and reasons(plan) == ["SnapshotCompleted", "SnapshotOfAnotherStream"]


@pytest.mark.parametrize("message", [None, "", "Traceback (most recent call last):\n  boom", "[1, 2]", "null",
                                     '{"reason": "SnapshotTaken"}', '{"lastBatch": "7"}', '{"lastBatch": true}',
                                     '{"lastBatch": -1}', '{"lastBatch": 7, "path": 3}',
                                     '{"lastBatch": 7, "sizeBytes": "big"}', '{"lastBatch": 7'])
def test_success_with_an_unreadable_message_is_a_failed_attempt(message):
    plan = plan_snapshot(spec(), in_progress(), observed(pod(phase="Succeeded", exit_code=0, message=message)))
    st = plan.status
    assert st.state == "Pending" and st.attempts == 1 and st.batch is None
    assert "s1-snap-1 succeeded but" in st.last_error
    assert deleted(plan) == [("s1-snap-1", 0)] and reasons(plan) == ["SnapshotAttemptFailed"]


def test_parse_result_accepts_the_clis_document():
    result = parse_result(GOOD)
    assert not isinstance(result, str)
    assert (result.last_batch, result.size_bytes, result.path) == (7, 1234, f"{CKPT}/snapshots/s1")
    assert isinstance(parse_result('{"lastBatch": 0}'), snaps.SnapshotResult)   # batch 0 is a batch


@pytest.mark.parametrize("exit_code,message,expected", [
    (5, '{"reason":"NothingToSnapshot","message":"no committed batch in /c yet"}',
     "exit code 5 (no committed batch yet): NothingToSnapshot: no committed batch in /c yet"),
    (4, '{"reason":"PreflightFailed","error":"state schema changed"}',
     "exit code 4 (preflight failed): PreflightFailed: state schema changed"),
    (6, '{"reason":"NotASnapshot","error":"/p has no manifest"}', "exit code 6 (not a snapshot)"),
    (1, "line 1\nline 2\nOSError: disk full\n", "exit code 1: line 1 | line 2 | OSError: disk full"),
    (137, None, "exit code 137"),
])
def test_failure_text_says_what_the_exit_code_means(exit_code, message, expected):
    plan = plan_snapshot(spec(), in_progress(), observed(pod(phase="Failed", exit_code=exit_code, message=message)))
    assert expected in plan.status.last_error
    assert plan.status.last_error.startswith("Pod s1-snap-1 failed with exit code")


def test_failed_attempts_retry_with_exponential_backoff_then_fail():
    sp = spec(max_retries=2)
    st, now = status(), T0
    delays = []
    for attempt in (1, 2, 3):
        plan = plan_snapshot(sp, st, observed(now=now))
        assert created(plan)[0]["metadata"]["name"] == f"s1-snap-{attempt}"
        st = plan.status
        failed = pod(f"s1-snap-{attempt}", "Failed", exit_code=5, message="no batch")
        plan = plan_snapshot(sp, st, observed(failed, now=now))
        assert deleted(plan) == [(f"s1-snap-{attempt}", 0)]
        st = plan.status
        if attempt < 3:
            assert st.state == "Pending" and "no committed batch yet" in st.last_error
            assert reasons(plan) == ["SnapshotAttemptFailed"]
            delays.append(plan.requeue_after)
            # Not before the delay: nothing happens.
            early = plan_snapshot(sp, st, observed(now=now + timedelta(seconds=plan.requeue_after - 1)))
            assert not early.actions and early.status.state == "Pending"
            now += timedelta(seconds=plan.requeue_after)
    assert delays == [10, 20]
    assert st.state == "Failed" and st.attempts == 3 and st.next_attempt_time is None
    assert reasons(plan) == ["SnapshotAttemptFailed", "SnapshotFailed"]
    assert "3 attempts failed" in st.message and "maxRetries is 2" in st.message


def test_retry_delay_doubles_up_to_five_minutes():
    assert [retry_delay(n) for n in (1, 2, 3, 4, 5, 6, 7, 20)] == [10, 20, 40, 80, 160, 300, 300, 300]


def test_zero_retries_fail_at_the_first_failure():
    plan = plan_snapshot(spec(max_retries=0), in_progress(), observed(pod(phase="Failed", exit_code=1)))
    assert plan.status.state == "Failed"


def test_running_pod_is_waited_for():
    plan = plan_snapshot(spec(), in_progress(), observed(pod(phase="Running")))
    assert not plan.actions and plan.status.state == "InProgress" and plan.requeue_after == snaps.POLL_SECONDS


def test_recorded_pod_missing_is_created_again_under_the_same_name():
    plan = plan_snapshot(spec(), in_progress(attempts=2), observed())
    assert [b["metadata"]["name"] for b in created(plan)] == ["s1-snap-2"]
    assert plan.status.attempts == 2 and plan.status.state == "InProgress"


def test_pods_of_an_earlier_snapshot_of_the_same_name_are_not_adopted():
    foreign = pod(phase="Succeeded", message=GOOD, owner="old-uid")
    plan = plan_snapshot(spec(), in_progress(), observed(foreign))
    assert plan.status.state == "InProgress" and [b["metadata"]["name"] for b in created(plan)] == ["s1-snap-1"]


@pytest.mark.parametrize("state", ["Completed", "Failed"])
def test_terminal_states_never_run_again(state):
    st = status(state=state, attempts=1, path="/p", batch=3 if state == "Completed" else None)
    plan = plan_snapshot(spec(), st, observed(now=T0 + timedelta(days=1)))
    assert not plan.actions and not plan.events and plan.status.state == state
    # A leftover Pod of the last step is removed, nothing else.
    plan = plan_snapshot(spec(), st, observed(pod(phase="Succeeded", message=GOOD)))
    assert deleted(plan) == [("s1-snap-1", 0)] and not created(plan) and plan.status.state == state


def test_invalid_snapshot_spec_and_too_long_names_fail():
    plan = plan_snapshot(InvalidSpec(("spec.stream: required",)), status(), observed())
    assert plan.status.state == "Failed" and "spec.stream: required" in plan.status.message
    long = "s" * 64
    plan = plan_snapshot(spec(), status(), observed(name=long))
    assert plan.status.state == "Failed" and "at most 63" in plan.status.message


# ------------------------------------------------------------------ deletion
def completed(**kw) -> ExactlyOnceSnapshotStatus:
    return status(state="Completed", attempts=1, path=f"{CKPT}/snapshots/s1", batch=7, **kw)


def test_deletion_disposes_the_files_with_an_unowned_pod_then_lets_go():
    plan = plan_snapshot(spec(), completed(), observed(deleting=True))
    assert not plan.finished and reasons(plan) == ["SnapshotDisposing"]
    [body] = created(plan)
    assert body["metadata"]["name"] == "s1-dispose-0" and "ownerReferences" not in body["metadata"]
    assert body["spec"]["containers"][0]["args"] == [
        "python", "-m", "eos_job", "snapshot", "dispose", "--path", f"{CKPT}/snapshots/s1"]
    assert body["metadata"]["labels"]["streaming.eos.dev/snapshot"] == "s1"
    running = pod("s1-dispose-0", "Running", action="dispose", owner=None)
    plan = plan_snapshot(spec(), completed(), observed(running, deleting=True))
    assert not plan.finished and not plan.actions
    ok = pod("s1-dispose-0", "Succeeded", action="dispose", owner=None)
    plan = plan_snapshot(spec(), completed(), observed(ok, deleting=True))
    assert plan.finished and reasons(plan) == ["SnapshotDisposed"] and deleted(plan) == [("s1-dispose-0", 0)]
    assert f"{CKPT}/snapshots/s1" in plan.events[0].message


def test_deletion_without_dispose_keeps_the_files_and_says_where():
    plan = plan_snapshot(spec(dispose_on_delete=False), completed(), observed(deleting=True))
    assert plan.finished and not created(plan)
    assert reasons(plan) == ["SnapshotKept"] and f"kept at {CKPT}/snapshots/s1" in plan.events[0].message


def test_deletion_stops_a_running_attempt_first_then_removes_what_it_left():
    started = plan_snapshot(spec(), status(), observed()).status
    assert started.state == "InProgress" and started.access is not None
    plan = plan_snapshot(spec(), started, observed(pod(phase="Running"), deleting=True))
    assert not plan.finished and deleted(plan) == [("s1-snap-1", snaps.ATTEMPT_GRACE_SECONDS)]
    plan = plan_snapshot(spec(), started, observed(deleting=True))        # stopped before it wrote the snapshot
    assert not plan.finished and [b["metadata"]["name"] for b in created(plan)] == ["s1-dispose-0"]
    ok = pod("s1-dispose-0", "Succeeded", action="dispose", owner=None)
    plan = plan_snapshot(spec(), started, observed(ok, deleting=True))
    assert plan.finished and reasons(plan) == ["SnapshotDisposed"]
    assert f"{CKPT}/snapshots/s1.partial" in plan.events[0].message
    kept = plan_snapshot(spec(dispose_on_delete=False), started, observed(deleting=True))
    assert kept.finished and not kept.actions and not kept.events


def test_deletion_of_a_never_started_snapshot_has_nothing_to_remove():
    plan = plan_snapshot(spec(), in_progress(), observed(deleting=True))   # no attempt recorded its access
    assert plan.finished and not plan.actions and not plan.events


def test_deletion_of_an_attempt_that_just_succeeded_disposes_what_it_wrote():
    plan = plan_snapshot(spec(), in_progress(), observed(pod(phase="Succeeded", message=GOOD), deleting=True))
    assert not plan.finished and [b["metadata"]["name"] for b in created(plan)] == ["s1-dispose-0"]


def test_deletion_of_an_upgrade_snapshot_disposes_the_drivers_files_whatever_its_state():
    up = spec(trigger="upgrade", path="/tmp/eos-test/snapshots/colors-a1")
    plan = plan_snapshot(up, status(state="Failed", attempts=4), observed(deleting=True))
    assert created(plan)[0]["spec"]["containers"][0]["args"][-1] == "/tmp/eos-test/snapshots/colors-a1"


def test_failed_disposal_retries_with_backoff_and_gives_up_after_five():
    failures: list[PodView] = []
    now = T0
    for k in range(snaps.DISPOSE_ATTEMPTS):
        plan = plan_snapshot(spec(), completed(), observed(*failures, deleting=True, now=now))
        assert not plan.finished and [b["metadata"]["name"] for b in created(plan)] == [f"s1-dispose-{k}"]
        assert reasons(plan) == (["SnapshotDisposing"] if k == 0 else ["SnapshotDisposeRetry"])
        finished_at = now + timedelta(seconds=1)
        failures.append(pod(f"s1-dispose-{k}", "Failed", action="dispose", owner=None, exit_code=1,
                            message='{"reason":"SnapshotFailed","error":"Permission denied"}',
                            finished_at=finished_at.strftime("%Y-%m-%dT%H:%M:%SZ")))
        if k + 1 < snaps.DISPOSE_ATTEMPTS:
            wait = plan_snapshot(spec(), completed(), observed(*failures, deleting=True, now=finished_at))
            assert not wait.finished and not created(wait)                # backoff
            assert wait.requeue_after == pytest.approx(snaps.dispose_retry_delay(k + 1))
        now = finished_at + timedelta(seconds=snaps.dispose_retry_delay(k + 1))
    plan = plan_snapshot(spec(), completed(), observed(*failures, deleting=True, now=now))
    assert plan.finished and not created(plan)
    assert reasons(plan) == ["SnapshotDisposeFailed"]
    message = plan.events[0].message
    assert f"the files at {CKPT}/snapshots/s1 must be removed by hand" in message and "Permission denied" in message
    assert sorted(n for n, _ in deleted(plan)) == [f"s1-dispose-{k}" for k in range(5)]


def test_deletion_after_the_stream_is_gone_disposes_with_what_the_first_attempt_recorded():
    first = plan_snapshot(spec(), status(), observed())
    access = first.status.access
    assert access is not None and access.mount_path == CKPT and access.image == created(first)[0]["spec"][
        "containers"][0]["image"]
    pvc = access.model_copy(update={"store": "pvc", "claim_name": "colors-ckpt", "service_account_name": "spark"})
    plan = plan_snapshot(spec(), completed(access=pvc), observed(stream=None, deleting=True))
    assert not plan.finished and reasons(plan) == ["SnapshotDisposing"]
    [body] = created(plan)
    assert body["spec"]["serviceAccountName"] == "spark"
    assert body["spec"]["volumes"][:1] == [{"name": children.CHECKPOINT_VOLUME,
                                        "persistentVolumeClaim": {"claimName": "colors-ckpt"}}]
    assert body["spec"]["containers"][0]["volumeMounts"][0]["mountPath"] == CKPT


def test_deletion_after_the_stream_is_gone_without_a_record_leaves_the_files_with_a_warning():
    plan = plan_snapshot(spec(), completed(), observed(stream=None, deleting=True))
    assert plan.finished and not created(plan) and reasons(plan) == ["SnapshotDisposeSkipped"]
    assert "removed by hand" in plan.events[0].message and f"{CKPT}/snapshots/s1" in plan.events[0].message


def test_deletion_of_a_failed_take_has_nothing_to_dispose():
    plan = plan_snapshot(spec(), status(state="Failed", attempts=4, path="/p"), observed(deleting=True))
    assert plan.finished and not plan.actions and not plan.events


# ------------------------------------------------------------------ builders
def test_snapshot_resource_is_labelled_and_never_owned_by_its_stream():
    body = snapshot_resource("ns", "colors", "colors-n3", "nonce", max_retries=2, dispose_on_delete=False)
    assert body["kind"] == "ExactlyOnceSnapshot" and body["apiVersion"] == "streaming.eos.dev/v1beta1"
    assert body["metadata"] == {"name": "colors-n3", "namespace": "ns", "labels": {
        "app.kubernetes.io/managed-by": "eos-operator", "streaming.eos.dev/stream": "colors"}}
    assert body["spec"] == {"stream": "colors", "trigger": "nonce", "maxRetries": 2, "disposeOnDelete": False}
    with_path = snapshot_resource("ns", "colors", "c-a1", "upgrade", path="/s", max_retries=0, dispose_on_delete=True)
    assert with_path["spec"]["path"] == "/s"
    with pytest.raises(ValueError):
        snapshot_resource("ns", "colors", "x", "sometimes", max_retries=1, dispose_on_delete=True)


def test_pod_view_reads_the_kubelets_status():
    raw = {"metadata": {"name": "s1-snap-2", "labels": {"streaming.eos.dev/snapshot-action": "take",
                                                        "streaming.eos.dev/attempt": "2"},
                        "ownerReferences": [{"uid": UID, "controller": True}], "deletionTimestamp": "t"},
           "status": {"phase": "Failed", "containerStatuses": [{"name": "snapshot", "state": {"terminated": {
               "exitCode": 5, "message": "m", "finishedAt": "2026-01-01T12:00:00Z"}}}]}}
    view = pod_view(raw)
    assert (view.name, view.phase, view.exit_code, view.message, view.attempt, view.owner_uid, view.deleting,
            view.index) == ("s1-snap-2", "Failed", 5, "m", 2, UID, True, 2)


def test_the_snapshot_handlers_are_registered():
    registry = build_registry(OperatorConfig(interval=3))
    handlers = {(h.id, h.selector.plural) for reg in (registry._changing, registry._spawning)
                for h in reg.get_all_handlers()}
    for id_ in ("snapshot-on-create", "snapshot-on-update/spec", "snapshot-on-resume", "dispose",
                "snapshot-periodically"):
        assert (id_, "exactlyoncesnapshots") in handlers
    timer = next(h for h in registry._spawning.get_all_handlers() if h.id == "snapshot-periodically")
    assert timer.interval == 3
    assert timer.when(status={"state": "InProgress"}) and not timer.when(status={"state": "Completed"})


# ------------------------------------------------- the reconciler, fake Kube
def make(spec_overrides: dict | None = None, *, stream_status: dict | None = None, snapshot_spec: dict | None = None,
         with_stream: bool = True):
    kube, clock = FakeKube(), FakeClock()
    if with_stream:
        sspec = base_spec(**(spec_overrides or {}))
        obj = kube.add_stream("colors", sspec)
        obj["status"] = stream_status if stream_status is not None else {
            "checkpointDir": f"{CKPT}/live", "txGeneration": 0,
            "lastReconciledSpec": spec_json(ExactlyOnceStreamSpec.model_validate(sspec))}
    kube.add_snapshot({"apiVersion": "streaming.eos.dev/v1beta1", "kind": "ExactlyOnceSnapshot",
                       "metadata": {"name": "s1"}, "spec": snapshot_spec or {"stream": "colors"}})
    return kube, clock, Deps(kube=kube, resolver=FakeResolver(), clock=clock)


def rec(deps, name="s1"):
    return asyncio.run(reconcile_snapshot(NS, name, deps))


def test_reconciler_takes_completes_and_removes_the_pod():
    kube, clock, deps = make()
    out = rec(deps)
    st = kube.snapshot_status("s1")
    assert (out.state, st["state"], st["attempts"], st["pod"]) == ("InProgress", "InProgress", 1, "s1-snap-1")
    assert kube.created_pods == ["s1-snap-1"]
    assert kube.reasons_for("ExactlyOnceSnapshot", "s1") == ["SnapshotStarted"]
    assert kube.reasons_for("ExactlyOnceStream") == []
    rec(deps)                                                    # idempotent while it runs
    assert kube.created_pods == ["s1-snap-1"]
    kube.set_snapshot_pod("s1-snap-1", "Succeeded", message=GOOD)
    rec(deps)
    st = kube.snapshot_status("s1")
    assert st["state"] == "Completed" and st["batch"] == 7 and st["sizeBytes"] == 1234
    assert "pod" not in st and ("default", "s1-snap-1") not in kube.pods
    assert kube.reasons_for("ExactlyOnceSnapshot") == ["SnapshotStarted", "SnapshotCompleted"]
    clock.advance(3600)
    rec(deps)
    assert kube.created_pods == ["s1-snap-1"]                    # terminal


def test_reconciler_writes_the_attempt_before_creating_the_pod():
    kube, clock, deps = make()
    kube.fail_create_pod = 1
    with pytest.raises(KubeError):
        rec(deps)
    assert kube.snapshot_status("s1")["pod"] == "s1-snap-1" and kube.created_pods == []
    rec(deps)                                                    # the same attempt, the same name
    assert kube.created_pods == ["s1-snap-1"] and kube.snapshot_status("s1")["attempts"] == 1


def test_reconciler_observes_again_on_a_status_conflict():
    kube, clock, deps = make()
    kube.conflict_next_snapshot_patch = 2
    rec(deps)
    assert kube.created_pods == ["s1-snap-1"] and kube.snapshot_status("s1")["attempts"] == 1


def test_reconciler_retries_after_the_delay_then_fails():
    kube, clock, deps = make(snapshot_spec={"stream": "colors", "maxRetries": 1})
    rec(deps)
    kube.set_snapshot_pod("s1-snap-1", "Failed", exit_code=5, message='{"reason":"NothingToSnapshot"}')
    out = rec(deps)
    assert kube.snapshot_status("s1")["state"] == "Pending" and out.requeue_after == 10
    assert ("default", "s1-snap-1") not in kube.pods
    clock.advance(5)
    rec(deps)
    assert kube.created_pods == ["s1-snap-1"]
    clock.advance(5)
    rec(deps)
    assert kube.created_pods == ["s1-snap-1", "s1-snap-2"]
    kube.set_snapshot_pod("s1-snap-2", "Failed", exit_code=1, message="boom")
    rec(deps)
    st = kube.snapshot_status("s1")
    assert st["state"] == "Failed" and "boom" in st["lastError"]
    assert kube.reasons_for("ExactlyOnceSnapshot")[-2:] == ["SnapshotAttemptFailed", "SnapshotFailed"]


def test_reconciler_fails_a_snapshot_of_a_missing_stream():
    kube, clock, deps = make(with_stream=False)
    rec(deps)
    st = kube.snapshot_status("s1")
    assert st["state"] == "Failed" and "stream colors does not exist" in st["message"] and kube.created_pods == []
    [message] = kube.messages_for("ExactlyOnceSnapshot", "SnapshotFailed")
    assert "create the ExactlyOnceStream colors" in message


def test_reconciler_disposes_on_deletion_and_the_finalizer_goes_last():
    kube, clock, deps = make()
    rec(deps)
    kube.set_snapshot_pod("s1-snap-1", "Succeeded", message=GOOD)
    rec(deps)
    asyncio.run(kube.delete_snapshot(NS, "s1"))                  # held by kopf's finalizer
    out = rec(deps)
    assert not out.finished and kube.created_pods[-1] == "s1-dispose-0"
    assert "ownerReferences" not in kube.pods[(NS, "s1-dispose-0")]["metadata"]
    kube.set_snapshot_pod("s1-dispose-0", "Succeeded", message='{"reason":"SnapshotDisposed"}')
    out = rec(deps)
    assert out.finished and ("default", "s1-dispose-0") not in kube.pods
    assert kube.reasons_for("ExactlyOnceSnapshot")[-1] == "SnapshotDisposed"
    kube.release_finalizers("s1")
    assert not kube.snapshots and not kube.pods
    assert rec(deps).exists is False


def test_reconciler_deletion_while_taking_stops_the_pod_then_removes_its_leftovers():
    kube, clock, deps = make()
    rec(deps)
    kube.set_snapshot_pod("s1-snap-1", "Running")
    asyncio.run(kube.delete_snapshot(NS, "s1"))
    out = rec(deps)
    assert not out.finished and ("s1-snap-1", snaps.ATTEMPT_GRACE_SECONDS) in kube.deleted_pods
    kube.finish_deletions()
    out = rec(deps)
    assert not out.finished and kube.created_pods == ["s1-snap-1", "s1-dispose-0"]   # a partial copy may be left
    kube.set_snapshot_pod("s1-dispose-0", "Succeeded", message='{"reason":"SnapshotDisposed"}')
    out = rec(deps)
    assert out.finished and kube.reasons_for("ExactlyOnceSnapshot")[-1] == "SnapshotDisposed"


def test_snapshot_pods_are_not_the_streams_drivers():
    """A snapshot Pod carries the stream label; the stream reconciler must still see no driver."""
    kube, clock, deps = make()
    rec(deps)
    kube.set_snapshot_pod("s1-snap-1", "Running")
    asyncio.run(reconcile(NS, "colors", deps))
    assert kube.created_pods == ["s1-snap-1", "colors-driver-0"]
    assert ("default", "s1-snap-1") in kube.pods and kube.max_alive_drivers == 1


def test_list_snapshots_and_create_snapshot_through_the_fake():
    kube, clock, deps = make()
    asyncio.run(kube.create_snapshot(NS, snapshot_resource(NS, "colors", "colors-n1", "nonce", max_retries=3,
                                                           dispose_on_delete=True)))
    asyncio.run(kube.create_snapshot(NS, snapshot_resource(NS, "colors", "colors-n1", "nonce", max_retries=3,
                                                           dispose_on_delete=True)))     # 409 = success
    names = [o["metadata"]["name"] for o in asyncio.run(kube.list_snapshots(NS, "colors"))]
    assert names == ["colors-n1"]          # s1 was applied without the label: only labelled ones are the stream's


def test_snapshot_pods_run_where_the_streams_pods_may_even_after_the_stream_is_gone():
    """The stream's placement (scheduler, tolerations, node selector, affinity, priority class, pull Secrets) is
    recorded with the snapshot's access at its first attempt: the take Pod has it, and so has a dispose Pod
    made from the status alone once the stream is deleted (a pool of tainted nodes, a private registry)."""
    template = {"schedulerName": "pool-scheduler", "nodeSelector": {"pool": "streams"},
                "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "streams", "effect": "NoSchedule"}],
                "imagePullSecrets": ["registry-creds"], "priorityClassName": "streaming",
                "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 1, "preference": {"matchExpressions": [
                        {"key": "zone", "operator": "In", "values": ["a"]}]}}]}}}
    placed = base_spec(job={"module": "m", "image": "img:1", "podTemplate": template})
    want = {"schedulerName": "pool-scheduler", "nodeSelector": {"pool": "streams"},
            "tolerations": template["tolerations"], "imagePullSecrets": [{"name": "registry-creds"}],
            "priorityClassName": "streaming", "affinity": template["affinity"]}

    plan = plan_snapshot(spec(), status(), observed(stream=stream_obj(placed)))
    [take] = created(plan)
    assert {k: take["spec"].get(k) for k in want} == want
    # Its stream deleted, the snapshot's files are disposed of by a Pod built from the recorded access alone.
    recorded = ExactlyOnceSnapshotStatus.model_validate(json.loads(json.dumps(plan.status.wire())))
    done = recorded.model_copy(update={"state": "Completed"})
    [dispose] = created(plan_snapshot(spec(), done, observed(stream=None, deleting=True)))
    assert dispose["metadata"]["name"] == "s1-dispose-0"
    assert {k: dispose["spec"].get(k) for k in want} == want
    # A stream without a template: nothing of the kind, as before.
    [plain] = created(plan_snapshot(spec(), status(), observed()))
    assert not {"schedulerName", "tolerations", "imagePullSecrets", "priorityClassName", "affinity"} & set(plain["spec"])
