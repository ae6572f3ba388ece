"""Pre-flight, rollback, restore and snapshot requests/retention in the pure planner."""
from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

import pytest

from eos_job.spec import stream_uid
from eos_job.status import ExactlyOnceStreamStatus
from eos_operator.observed import PodView, RestoreSource, SnapshotInfo
from eos_operator.actions import ApplyConfigMap, CreatePod, CreateSnapshot, DeletePod, DeleteSnapshot, Resolve
from eos_operator.planner import plan, record_resolution, retention
from eos_operator.timeutil import fmt

from eos_job.status import ReplayHorizon, ResolutionReport

from .fakes import T0
from .test_planner import UID, cond, observed, pod, reasons, spec
from .test_upgrades import SNAP0, _with_snapshot, running, snap, upgraded_spec

OWN_UID = stream_uid("default", "colors")


def with_aux(obs, *pods: PodView):
    return replace(obs, aux_pods=tuple(pods))


def aux(name: str, phase: str, **kw) -> PodView:
    return PodView(name=name, phase=phase, attempt=1, **kw)


def go_to_running(new, status, at: float = 0.0):
    """From a recorded snapshot upgrade (step Stopping) to the new driver Running."""
    stop = plan(new, status, observed(pod("colors-driver-0"), at=at))
    taken = plan(new, stop.status, _with_snapshot(observed(at=at), snap(batch=41)))
    resolve = plan(new, taken.status, observed(at=at))
    st, _ = record_resolution(resolve.status, ResolutionReport(stream_uid=OWN_UID, generation=0, slots=2),
                              attempt=1, spec_hash=new.spec_hash(), observed=observed(at=at))
    submit = plan(new, st, observed(at=at))
    assert [type(a) for a in submit.actions] == [CreateSnapshot, ApplyConfigMap, CreatePod]
    seen = plan(new, submit.status, observed(pod("colors-driver-1", "Pending"), at=at))
    return plan(new, seen.status, observed(pod("colors-driver-1"), at=at))


# ------------------------------------------------------------------ pre-flight
def test_pre_flight_runs_the_new_spec_on_a_scratch_copy_before_anything_is_stopped():
    old, new = spec(), upgraded_spec(upgradePreFlight=True)
    p = plan(new, running(old), observed(pod("colors-driver-0")))
    up = p.status.upgrade
    assert up.step == "PreFlight" and up.pre_flight_pod == "colors-preflight-1" and p.actions == []
    check = plan(new, p.status, observed(pod("colors-driver-0")))
    assert [type(a) for a in check.actions] == [ApplyConfigMap, CreatePod]   # no DeletePod: the old one runs
    cm, body = check.actions[0].body, check.actions[1].body
    assert cm["metadata"]["name"] == "colors-preflight"
    run = json.loads(cm["data"]["run.json"])
    assert run["spec"]["job"]["args"] == {"v": "2"}                          # the NEW spec
    command = body["spec"]["containers"][0]["args"]
    assert command[:4] == ["python", "-m", "eos_job", "preflight"]
    assert command[command.index("--from-checkpoint") + 1] == "/tmp/eos-test/live"
    assert command[command.index("--scratch") + 1] == "/tmp/eos-test/preflight-1"
    assert body["metadata"]["labels"]["app.kubernetes.io/component"] == "preflight"
    assert "EOS_SNAPSHOT_ON_STOP" not in {e["name"] for e in body["spec"]["containers"][0]["env"]}
    assert cond(check, "Ready").status == "True"                              # the old driver keeps serving
    # Running: wait, still nothing stopped.
    wait = plan(new, check.status, with_aux(observed(pod("colors-driver-0")), aux("colors-preflight-1", "Running")))
    assert wait.actions == [] and wait.status.upgrade.step == "PreFlight"
    # Passed: then (and only then) the old driver is stopped with its snapshot.
    ok = plan(new, wait.status, with_aux(observed(pod("colors-driver-0")), aux("colors-preflight-1", "Succeeded")))
    assert ok.actions == [DeletePod("colors-preflight-1", 0)] and "PreFlightPassed" in reasons(ok)
    assert ok.status.upgrade.step == "Stopping"
    stop = plan(new, ok.status, observed(pod("colors-driver-0")))
    assert stop.actions == [DeletePod("colors-driver-0", 60)]


def test_failed_pre_flight_blocks_the_upgrade_and_keeps_the_old_job_running():
    old, new = spec(), upgraded_spec(upgradePreFlight=True)
    p = plan(new, running(old), observed(pod("colors-driver-0")))
    check = plan(new, p.status, observed(pod("colors-driver-0")))
    failed = plan(new, check.status, with_aux(
        observed(pod("colors-driver-0")),
        aux("colors-preflight-1", "Failed", exit_code=4,
            message='{"reason": "PreFlightFailed", "error": "StateSchemaNotCompatible: key schema changed"}')))
    assert DeletePod("colors-preflight-1", 0) in failed.actions
    assert not any(isinstance(a, DeletePod) and a.name == "colors-driver-0" for a in failed.actions)
    st = failed.status
    assert st.upgrade is None and st.pending_launch is None and st.tx_generation == 0
    assert st.rejected_spec.reason == "PreFlightFailed" and "key schema changed" in st.rejected_spec.message
    assert "UpgradeBlocked" in reasons(failed)
    # The status that records the refusal carries its conditions too (it is written before the next look).
    assert cond(failed, "Ready").status == "True"
    assert (cond(failed, "Degraded").status, cond(failed, "Degraded").reason) == ("True", "UpgradeBlocked")
    # Next look: Ready (old spec runs), Degraded UpgradeBlocked, and no new upgrade attempt.
    steady = plan(new, st, observed(pod("colors-driver-0")))
    assert steady.actions == [] and steady.status.lifecycle_state == "Running"
    assert cond(steady, "Ready").status == "True"
    assert (cond(steady, "Degraded").status, cond(steady, "Degraded").reason) == ("True", "UpgradeBlocked")
    assert plan(new, steady.status, observed(pod("colors-driver-0"), at=60)).actions == []
    # A driver failure restarts the OLD spec, never the refused one.
    crash = plan(new, steady.status, observed(pod("colors-driver-0", "Failed", exit_code=137)))
    relaunch = plan(new, crash.status, observed(at=100))
    assert [type(a) for a in relaunch.actions] == [Resolve]
    assert relaunch.actions[0].config.spec.job.args == old.job.args
    # Changing the spec again tries again.
    newer = upgraded_spec(upgradePreFlight=True, job={"args": {"v": "3"}})
    retry = plan(newer, steady.status, observed(pod("colors-driver-0")))
    assert retry.status.rejected_spec is None and retry.status.upgrade.step == "PreFlight"
    assert "SpecChanged" in reasons(retry)


def test_stateless_upgrades_skip_pre_flight():
    p = plan(upgraded_spec(upgradeMode="stateless", upgradePreFlight=True), running(spec()),
             observed(pod("colors-driver-0")))
    assert p.status.upgrade.step == "Stopped"


# -------------------------------------------------------------------- rollback
def test_an_upgrade_that_commits_a_batch_in_time_is_verified():
    old, new = spec(), upgraded_spec()
    p = plan(new, running(old, last_stable_spec=running(old).last_reconciled_spec), observed(pod("colors-driver-0")))
    up = go_to_running(new, p.status)
    chk = up.status.upgrade_check
    assert chk is not None and chk.baseline_batch == 41 and chk.rollback_snapshot == SNAP0
    assert json.loads(chk.previous_spec)["job"] == json.loads(running(old).last_reconciled_spec)["job"]
    assert up.status.last_stable_spec != up.status.last_reconciled_spec   # not stable until verified
    assert cond(up, "Progressing").reason == "VerifyingUpgrade"
    same = plan(new, up.status, observed(pod("colors-driver-1"), batch=41))
    assert same.status.upgrade_check is not None
    ok = plan(new, same.status, observed(pod("colors-driver-1"), batch=42))
    assert ok.status.upgrade_check is None and "UpgradeVerified" in reasons(ok)
    assert ok.status.last_stable_spec == ok.status.last_reconciled_spec


def test_an_upgrade_not_ready_by_the_deadline_rolls_back_from_its_snapshot():
    old, new = spec(), upgraded_spec(upgradeReadinessTimeoutSeconds=60)
    stable = running(old).last_reconciled_spec
    p = plan(new, running(old, last_stable_spec=stable), observed(pod("colors-driver-0")))
    up = go_to_running(new, p.status)
    # Running but never commits a batch after 41.
    late = plan(new, up.status, observed(pod("colors-driver-1"), batch=41, at=61))
    assert "UpgradeRolledBack" in reasons(late)
    st = late.status
    assert st.rejected_spec.reason == "RolledBack" and st.upgrade.rollback and st.upgrade.restore_from == SNAP0
    assert st.pending_launch.reason == "Rollback"
    assert (cond(late, "Degraded").status, cond(late, "Degraded").reason) == ("True", "UpgradeRolledBack")
    stop = plan(new, st, observed(pod("colors-driver-1"), at=61))
    assert stop.actions == [DeletePod("colors-driver-1", 60)]
    resolve = plan(new, stop.status, observed(at=62))
    cfg = resolve.actions[0].config
    assert cfg.restore_from == SNAP0 and cfg.spec.job.args == old.job.args   # the old spec, the old state
    assert cfg.checkpoint_dir == f"/tmp/eos-test/ckpt-{UID[:8]}-2"
    # the failed driver's batches after the snapshot are re-run with their original offsets
    assert cfg.replay_offsets_from == f"/tmp/eos-test/ckpt-{UID[:8]}-1"
    st2, _ = record_resolution(resolve.status, ResolutionReport(stream_uid=OWN_UID, generation=0, slots=2),
                               attempt=2, spec_hash=cfg.spec.spec_hash(), observed=observed(at=62))
    submit = plan(new, st2, observed(at=62))
    assert [type(a) for a in submit.actions] == [ApplyConfigMap, CreatePod]
    assert submit.status.upgrade_check is None           # a rollback is not verified again
    seen = plan(new, submit.status, observed(pod("colors-driver-2"), at=63))
    running_old = plan(new, seen.status, observed(pod("colors-driver-2"), at=63))
    assert running_old.status.lifecycle_state == "Running"
    assert cond(running_old, "Ready").status == "True" and cond(running_old, "Degraded").status == "True"
    assert plan(new, running_old.status, observed(pod("colors-driver-2"), at=500)).actions == []


def horizon(at: float, backlog: int = 0, lost: int = 0, batch: int = 41) -> ReplayHorizon:
    return ReplayHorizon(state="Exceeded" if lost else "Safe", batch=batch, backlog_records=backlog,
                         lost_records=lost, checked_at=fmt(T0 + timedelta(seconds=at)))


def test_an_upgrade_on_an_idle_source_is_verified_not_rolled_back():
    """No input during the readiness window means no batch to commit: ready if the driver ran throughout."""
    old, new = spec(), upgraded_spec(upgradeReadinessTimeoutSeconds=60)
    p = plan(new, running(old, last_stable_spec=running(old).last_reconciled_spec), observed(pod("colors-driver-0")))
    up = go_to_running(new, p.status)
    idle = replace(observed(pod("colors-driver-1"), batch=41, at=61), replay_horizon=horizon(at=45))
    ok = plan(new, up.status, idle)
    assert "UpgradeVerified" in reasons(ok) and "UpgradeRolledBack" not in reasons(ok)
    assert ok.status.upgrade_check is None and ok.status.rejected_spec is None
    assert ok.status.last_stable_spec == ok.status.last_reconciled_spec
    assert not any(isinstance(a, (DeletePod, Resolve)) for a in ok.actions)
    # Without that proof it rolls back: input waiting, records lost, a reading from before the window,
    # no reading at all, or a driver that is not the upgrade's (it failed and was restarted).
    for obs in (replace(idle, replay_horizon=horizon(at=45, backlog=7)),
                replace(idle, replay_horizon=horizon(at=45, lost=3)),
                replace(idle, replay_horizon=horizon(at=-5)),
                replace(idle, replay_horizon=None)):
        assert "UpgradeRolledBack" in reasons(plan(new, up.status, obs)), obs.replay_horizon
    restarted = replace(observed(pod("colors-driver-2"), batch=41, at=61), replay_horizon=horizon(at=45))
    assert "UpgradeVerified" not in reasons(plan(new, up.status.model_copy(update={"driver_pod": "colors-driver-2"}),
                                                 restarted))


@pytest.mark.parametrize("job", [{"parallelism": 4}, {"slotsFrom": "sourcePartitions"}],
                         ids=["parallelism", "slotsFrom"])
def test_no_automatic_rollback_across_a_change_of_the_slots(job):
    """A new generation may have rewritten slots the older snapshot's generation committed: no blind rollback."""
    old, new = spec(), upgraded_spec(job=job, upgradeReadinessTimeoutSeconds=60)
    p = plan(new, running(old, last_stable_spec=running(old).last_reconciled_spec), observed(pod("colors-driver-0")))
    up = go_to_running(new, p.status)
    late = plan(new, up.status, observed(pod("colors-driver-1"), at=61))
    assert "UpgradeNotReady" in reasons(late) and "restoreFrom" in late.events[-1].message
    assert "UpgradeRolledBack" not in reasons(late)
    assert late.status.pending_launch is None and late.status.rejected_spec is None


# --------------------------------------------------------------------- restore
def test_a_new_stream_with_restore_from_starts_from_that_snapshot():
    s = spec(restoreFrom="colors-p1")
    src = RestoreSource(ref="colors-p1", path="/tmp/eos-test/snapshots/colors-p1", stream_uid=OWN_UID, batch=9)
    create = plan(s, ExactlyOnceStreamStatus(), observed())
    wait = plan(s, create.status, observed())
    assert wait.actions == [] and cond(wait, "Ready").reason == "RestoreSourceNotReady"
    assert "not found" in cond(wait, "Ready").message and wait.requeue_after
    obs = replace(observed(), restore_source=src)
    rec = plan(s, wait.status, obs)
    assert rec.status.upgrade.restore_from == src.path and rec.status.upgrade.checkpoint_dir == f"/tmp/eos-test/ckpt-{UID[:8]}-0"
    resolve = plan(s, rec.status, obs)
    cfg = resolve.actions[0].config
    assert cfg.restore_from == src.path and cfg.checkpoint_dir == f"/tmp/eos-test/ckpt-{UID[:8]}-0"
    st, _ = record_resolution(resolve.status, ResolutionReport(stream_uid=OWN_UID, generation=0, slots=2),
                              attempt=0, spec_hash=s.spec_hash(), observed=obs)
    submit = plan(s, st, obs)
    restored = [e for e in submit.events if e.reason == "Restored"][0]
    assert "the same stream" in restored.message and "skipped" in restored.message
    assert submit.status.restored_from_snapshot == "colors-p1" and submit.status.upgrade_check is None


def test_restoring_a_snapshot_of_another_stream_says_it_is_a_fork():
    s = spec(restoreFrom="/tmp/eos-test/other/snapshots/x")   # a path must lie in the stream's store
    src = RestoreSource(ref=s.restore_from, path=s.restore_from, stream_uid="another", batch=3)
    obs = replace(observed(), restore_source=src)
    st = plan(s, ExactlyOnceStreamStatus(), obs).status
    st = plan(s, st, obs).status
    resolve = plan(s, st, obs)
    st, _ = record_resolution(resolve.status, ResolutionReport(stream_uid=OWN_UID, generation=0, slots=2),
                              attempt=0, spec_hash=s.spec_hash(), observed=obs)
    restored = [e for e in plan(s, st, obs).events if e.reason == "Restored"][0]
    assert "fork" in restored.message and "another sink topic" in restored.message


def test_changing_restore_from_on_a_running_stream_restores_it():
    old = spec()
    new = spec(restoreFrom="colors-p1", upgradePreFlight=False)
    src = RestoreSource(ref="colors-p1", path="/tmp/eos-test/snapshots/colors-p1", stream_uid=OWN_UID, batch=9)
    missing = plan(new, running(old), observed(pod("colors-driver-0")))
    assert missing.actions == [] and cond(missing, "Ready").reason == "RestoreSourceNotReady"
    obs = replace(observed(pod("colors-driver-0")), restore_source=src)
    p = plan(new, running(old), obs)
    up = p.status.upgrade
    assert up.restore_from == src.path and up.snapshot_path == SNAP0 and up.step == "Stopping"
    stop = plan(new, p.status, obs)
    assert stop.actions == [DeletePod("colors-driver-0", 60)]
    gone = replace(_with_snapshot(observed(), snap()), restore_source=src)
    after = plan(new, stop.status, gone)
    assert after.status.upgrade.step == "Stopped" and after.status.upgrade.restore_from == src.path
    resolve = plan(new, after.status, gone)
    assert resolve.actions[0].config.restore_from == src.path   # not the stop snapshot, and no drain


# ------------------------------------------------------------ snapshot requests
def test_snapshot_nonce_requests_one_snapshot_resource():
    s0, s1 = spec(), spec(snapshotNonce=1)
    first = plan(s0, running(s0), observed(pod("colors-driver-0")))
    assert first.status.observed_snapshot_nonce == 0 and not any(isinstance(a, CreateSnapshot) for a in first.actions)
    p = plan(s1, first.status, observed(pod("colors-driver-0")))
    created = [a for a in p.actions if isinstance(a, CreateSnapshot)]
    assert len(created) == 1 and "SnapshotRequested" in reasons(p)
    body = created[0].body
    assert body["metadata"]["name"] == "colors-n1" and body["spec"] == {
        "stream": "colors", "trigger": "nonce", "maxRetries": 3, "disposeOnDelete": True}
    assert "ownerReferences" not in body["metadata"]          # a snapshot outlives its stream
    assert not any(isinstance(a, CreateSnapshot) for a in plan(s1, p.status, observed(pod("colors-driver-0"))).actions)


def test_periodic_snapshots_while_running_with_deterministic_names():
    s = spec(snapshots={"intervalSeconds": 60})
    st = running(s, running_since=fmt(T0))
    early = plan(s, st, observed(pod("colors-driver-0"), at=30))
    assert not any(isinstance(a, CreateSnapshot) for a in early.actions)
    due = plan(s, st, observed(pod("colors-driver-0"), at=61))
    created = [a for a in due.actions if isinstance(a, CreateSnapshot)]
    assert len(created) == 1 and created[0].body["spec"]["trigger"] == "periodic"
    name = created[0].body["metadata"]["name"]
    assert plan(s, st, observed(pod("colors-driver-0"), at=61)).actions == due.actions   # a replay: same name
    taken = replace(observed(pod("colors-driver-0"), at=62), snapshots=(
        SnapshotInfo(name, "periodic", "InProgress", created=fmt(T0 + timedelta(seconds=61))),))
    assert not any(isinstance(a, CreateSnapshot) for a in plan(s, st, taken).actions)
    # Not while the stream is not running.
    stopped = plan(s, running(s, lifecycle_state="Failed", driver_pod=None), observed(at=200))
    assert not any(isinstance(a, CreateSnapshot) for a in stopped.actions)


# -------------------------------------------------------------------- retention
def info(name: str, age: float, state: str = "Completed", path: str | None = None) -> SnapshotInfo:
    return SnapshotInfo(name=name, trigger="periodic", state=state, path=path or f"/s/{name}",
                        created=fmt(T0 - timedelta(seconds=age)))


def test_retention_keeps_the_newest_max_count():
    s = spec(snapshots={"maxCount": 2})
    snaps = [info(f"s{i}", age=100 - i) for i in range(5)]   # s4 newest
    assert retention(snaps, s, ExactlyOnceStreamStatus(), T0) == ["s0", "s1", "s2"]


def test_retention_never_deletes_unfinished_the_newest_completed_or_a_restore_source():
    s = spec(snapshots={"maxCount": 1, "maxAgeSeconds": 60}, restoreFrom="s1")
    snaps = [info("s0", 500, path="/s/restored"), info("s1", 400), info("s2", 300), info("s3", 200, "Failed"),
             info("s4", 100, "InProgress"), info("s5", 90, "Pending")]
    st = ExactlyOnceStreamStatus(restore_from="/s/restored")
    # s2 is the newest Completed one; s0 the stream was restored from; s1 is named by restoreFrom.
    assert retention(snaps, s, st, T0) == ["s3"]


def test_retention_by_age():
    s = spec(snapshots={"maxCount": 10, "maxAgeSeconds": 3600})
    snaps = [info("old", 7200), info("older", 9000), info("new", 60)]
    assert retention(snaps, s, ExactlyOnceStreamStatus(), T0) == ["old", "older"]


def test_housekeeping_deletes_what_retention_selects():
    s = spec(snapshots={"maxCount": 1})
    obs = replace(observed(pod("colors-driver-0")), snapshots=(info("a", 200), info("b", 100)))
    p = plan(s, running(s), obs)
    assert DeleteSnapshot("a") in p.actions and "SnapshotPruned" in reasons(p)


@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_retention_never_leaves_zero_completed_snapshots(count):
    s = spec(snapshots={"maxCount": count, "maxAgeSeconds": 60})
    snaps = [info(f"s{i}", age=1000 + i) for i in range(10)]   # all too old
    kept = {x.name for x in snaps} - set(retention(snaps, s, ExactlyOnceStreamStatus(), T0))
    assert kept == {"s0"}   # the newest completed one survives any policy


def test_retention_keeps_a_snapshot_another_stream_has_yet_to_restore_from():
    s = spec(snapshots={"maxCount": 1})
    snaps = [info("s0", 300), info("s1", 200, path="/s/by-path"), info("s2", 100)]
    assert retention(snaps, s, ExactlyOnceStreamStatus(), T0) == ["s0", "s1"]
    assert retention(snaps, s, ExactlyOnceStreamStatus(), T0, wanted=frozenset({"s0", "/s/by-path"})) == []


def test_the_reconciler_reads_what_other_streams_want_to_restore_from():
    import asyncio

    from eos_operator.reconciler import _wanted_by_others

    from .fakes import FakeClock, FakeKube, FakeResolver, base_spec
    from eos_operator.reconciler import Deps
    kube = FakeKube()
    kube.add_stream("colors", base_spec())
    kube.add_stream("fork", base_spec(restoreFrom="colors-p1"))
    done = kube.add_stream("old-fork", base_spec(restoreFrom="colors-p0"))
    done["status"] = {"restoredFromSnapshot": "colors-p0"}
    deps = Deps(kube=kube, resolver=FakeResolver(), clock=FakeClock())
    assert asyncio.run(_wanted_by_others(deps, "default", "colors")) == frozenset({"colors-p1"})


def test_a_snapshot_being_deleted_is_no_restore_source():
    """Retention may delete the oldest snapshot a moment before a user names it in restoreFrom: a
    snapshot with a deletionTimestamp is being disposed, so the stream waits (RestoreSourceNotReady)
    instead of launching a driver that cannot find its files."""
    import asyncio

    from eos_job.spec import ExactlyOnceStreamSpec
    from eos_operator.reconciler import Deps, _restore_source

    from .fakes import FakeClock, FakeKube, FakeResolver, base_spec
    kube = FakeKube()
    body = {"metadata": {"name": "colors-p1", "namespace": "default"}, "spec": {"stream": "colors"},
            "status": {"state": "Completed", "path": "/s/colors-p1", "batch": 7}}
    kube.snapshots[("default", "colors-p1")] = body
    deps = Deps(kube=kube, resolver=FakeResolver(), clock=FakeClock())
    s = ExactlyOnceStreamSpec.model_validate(base_spec(restoreFrom="colors-p1"))
    ok = asyncio.run(_restore_source("default", s, deps))
    assert ok.path == "/s/colors-p1" and ok.problem is None
    body["metadata"]["deletionTimestamp"] = "2026-11-24T00:00:00Z"
    gone = asyncio.run(_restore_source("default", s, deps))
    assert gone.path is None and "being deleted" in gone.problem


def test_a_restore_from_applied_while_an_upgrade_is_on_its_way_is_not_lost():
    """An upgrade stopped the old driver for spec A; the user then sets restoreFrom (spec B). Launching B
    with A's plan would start from A's stop snapshot and record B as running: the restore silently lost.
    The launch is decided afresh for B instead."""
    old, a = spec(), spec(upgradePreFlight=False, job={"module": "tests.e2e.jobs.sleeper", "parallelism": 2,
                                                         "args": {"v": "2"}})
    b = spec(upgradePreFlight=False, restoreFrom="colors-p1",
             job={"module": "tests.e2e.jobs.sleeper", "parallelism": 2, "args": {"v": "2"}})
    src = RestoreSource(ref="colors-p1", path="/tmp/eos-test/snapshots/colors-p1", stream_uid=OWN_UID, batch=9)
    p = plan(a, running(old), observed(pod("colors-driver-0")))
    stop = plan(a, p.status, observed(pod("colors-driver-0")))
    after = plan(a, stop.status, _with_snapshot(observed(), snap()))
    assert after.status.upgrade.step == "Stopped" and after.status.upgrade.restore_from == SNAP0
    gone = replace(_with_snapshot(observed(), snap()), restore_source=src)
    again = plan(b, after.status, gone)
    up = again.status.upgrade
    assert up.target_spec_hash == b.spec_hash() and up.restore_from == src.path, up
    resolved = plan(b, again.status, gone)
    while not any(isinstance(x, Resolve) for x in resolved.actions) and resolved.again:
        resolved = plan(b, resolved.status, gone)
    assert [x.config.restore_from for x in resolved.actions if isinstance(x, Resolve)] == [src.path]


def test_a_drain_pod_that_cannot_start_fails_at_the_start_deadline_with_its_reason():
    from eos_operator.timeutil import fmt as fmt_
    old = spec()
    new = spec(upgradePreFlight=False, upgradeMode="last-state", job={"module": "tests.e2e.jobs.sleeper",
               "parallelism": 2, "args": {"v": "2"}, "driver": {"startTimeoutSeconds": 30}})
    st = running(old)
    p = plan(new, st, observed(pod("colors-driver-0")))
    for _ in range(6):                                  # stop the old driver, then to the drain
        obs = observed() if p.status.upgrade and p.status.upgrade.step != "Stopping" else observed(pod("colors-driver-0"))
        if p.status.upgrade and p.status.upgrade.step == "Draining":
            break
        p = plan(new, p.status, obs)
    assert p.status.upgrade.step == "Draining", p.status.upgrade
    name = p.status.upgrade.drain_pod
    blocked = PodView(name=name, phase="Pending", created_at=fmt_(T0), blocked="ImagePullBackOff: Back-off")
    waiting = plan(new, p.status, with_aux(observed(at=10), blocked))
    assert "ImagePullBackOff" in cond(waiting, "Progressing").message
    late = plan(new, waiting.status, with_aux(observed(at=31), blocked))
    assert "DrainFailed" in reasons(late) and "did not start within 30s" in late.status.last_error


def test_on_a_pvc_the_pre_flight_lands_on_the_running_drivers_node():
    """A ReadWriteOnce claim the driver holds can be mounted only on its node: the pre-flight Pod (which
    runs while the driver still does) is pinned there; on S3 or local it is not pinned."""
    claim = {"store": "pvc", "claimName": "ckpt", "path": "/tmp/eos-test"}
    old = spec(checkpoint=claim)
    new = upgraded_spec(upgradePreFlight=True, checkpoint=claim)
    on_node = pod("colors-driver-0", node="node-7")
    p = plan(new, running(old), observed(on_node))
    check = plan(new, p.status, observed(on_node))
    body = next(a.body for a in check.actions if isinstance(a, CreatePod))
    assert body["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "node-7"}
    s3_old, s3_new = spec(), upgraded_spec(upgradePreFlight=True)
    p = plan(s3_new, running(s3_old), observed(on_node))
    check = plan(s3_new, p.status, observed(on_node))
    body = next(a.body for a in check.actions if isinstance(a, CreatePod))
    assert "nodeSelector" not in body["spec"]
