"""Spec changes: field classification, and the upgrade modes as a write-ahead log in status."""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import pytest

from eos_job.spec import ExactlyOnceStreamSpec, stream_uid
from eos_job.status import ExactlyOnceStreamStatus, ResolutionReport
from eos_operator import children
from eos_operator.adapters import StoreReader, StoreUnreadable
from eos_operator.observed import PodView, SnapshotView
from eos_operator.actions import ApplyConfigMap, CreatePod, CreateSnapshot, DeletePod, Resolve
from eos_operator.planner import plan, record_resolution
from eos_operator.timeutil import parse
from eos_operator.reconciler import Deps, reconcile
from eos_operator.upgrades import classify, plan_spec_change, run_affecting_changes

from .fakes import Crash, FakeClock, FakeKube, FakeResolver, base_spec
from .test_planner import UID, cond, observed, pod, reasons, running_status, spec

REF = children.StreamRef("colors", "default", UID)
SNAP0 = children.snapshot_path(REF, spec(), 0)


# ------------------------------------------------------------- classification
@pytest.mark.parametrize("path, expected", [
    ("restartStrategy.type", "ignore"), ("restartNonce", "ignore"), ("upgradeMode", "ignore"),
    ("job.state", "ignore"),
    ("job.driver.memory", "restart"), ("job.executor.instances", "restart"), ("triggerIntervalMs", "restart"),
    ("source.maxOffsetsPerTrigger", "restart"), ("source.options.kafka.x", "restart"), ("source.acceptDataLoss", "restart"),
    ("sink.producerConfig.linger.ms", "restart"), ("sink.credentials", "restart"),
    ("job.module", "upgrade"), ("job.function", "upgrade"), ("job.args.drop", "upgrade"),
    ("job.sparkConf.spark.x", "upgrade"), ("job.image", "upgrade"), ("job.parallelism", "upgrade"),
    ("job.outputMode", "upgrade"), ("source.topics", "upgrade"), ("sink.topic", "upgrade"),
    ("sink.ledgerTopic", "upgrade"), ("checkpoint.path", "upgrade"), ("somethingNew", "upgrade"),
    ("job.stateful", "upgrade"),   # a prefix of an ignored name is not that name
])
def test_every_field_has_a_class(path, expected):
    assert classify(path) == expected


def test_restart_only_changes_restart_and_mixed_changes_upgrade():
    s = spec()
    assert plan_spec_change(["triggerIntervalMs", "job.driver.cpu"], s).kind == "restart"
    mixed = plan_spec_change(["triggerIntervalMs", "job.args.drop"], s)
    assert mixed.kind == "upgrade" and mixed.mode == "snapshot" and not mixed.bump_tx_generation
    assert plan_spec_change(["job.parallelism"], s).bump_tx_generation


def test_operator_only_fields_are_not_changes():
    old = spec()
    new = spec(upgradeMode="stateless", restartNonce=3,
               restartStrategy={"type": "exponential-delay"})
    assert run_affecting_changes(running_status(old).last_reconciled_spec, new) == []


# ------------------------------------------------------------ planner, snapshot
def upgraded_spec(**kw) -> ExactlyOnceStreamSpec:
    """The changed spec; pre-flight off unless asked (it has its own tests in test_upgrade_safety.py)."""
    job = {"module": "tests.e2e.jobs.sleeper", "parallelism": 2, "args": {"v": "2"}}
    job.update(kw.pop("job", {}))
    kw.setdefault("upgradePreFlight", False)
    return spec(job=job, **kw)


def running(s: ExactlyOnceStreamSpec, **kw) -> ExactlyOnceStreamStatus:
    return running_status(s, snapshot_on_stop=SNAP0, checkpoint_dir="/tmp/eos-test/live", **kw)


def snap(path: str = SNAP0, uid: str = stream_uid("default", "colors"), batch: int = 41) -> SnapshotView:
    return SnapshotView(path=path, stream_uid=uid, batch=batch, time="2026-01-01T12:00:00Z", checkpoint_id="q")


def test_snapshot_upgrade_records_intent_then_stops_takes_snapshot_resolves_and_restores():
    old, new = spec(), upgraded_spec()
    # 1. Decide: the write-ahead record, nothing done yet.
    p = plan(new, running(old), observed(pod("colors-driver-0")))
    up = p.status.upgrade
    assert p.actions == [] and p.again
    assert p.status.lifecycle_state == "Upgrading"
    assert (up.mode, up.step, up.from_pod) == ("snapshot", "Stopping", "colors-driver-0")
    assert up.snapshot_path == SNAP0 and up.restore_from == SNAP0
    assert up.snapshot_name == f"colors-{UID[:8]}-a0"
    assert up.checkpoint_dir == f"/tmp/eos-test/ckpt-{UID[:8]}-1" and up.target_spec_hash == new.spec_hash()
    # 2. Stop the driver gracefully (SIGTERM: a clean boundary, then the snapshot).
    stop = plan(new, p.status, observed(pod("colors-driver-0")))
    assert stop.actions == [DeletePod("colors-driver-0", 60)]
    assert "writes snapshot" in cond(stop, "Progressing").message
    # 3. Gone: read the snapshot back; recorded in the history.
    taken = plan(new, stop.status, _with_snapshot(observed(), snap()))
    assert reasons(taken) == ["SnapshotTaken"] and [type(a) for a in taken.actions] == [CreateSnapshot]
    resource = taken.actions[0].body
    assert resource["kind"] == "ExactlyOnceSnapshot" and resource["spec"]["trigger"] == "upgrade"
    assert resource["spec"]["path"] == SNAP0 and resource["metadata"]["name"] == f"colors-{UID[:8]}-a0"
    assert taken.status.upgrade.step == "Stopped"
    assert [(s.name, s.batch) for s in taken.status.snapshots] == [(f"colors-{UID[:8]}-a0", 41)]
    # 4. Resolution for the new location, seeded from the snapshot.
    resolve = plan(new, taken.status, observed())
    assert [type(a) for a in resolve.actions] == [Resolve]
    cfg = resolve.actions[0].config
    assert cfg.checkpoint_dir == f"/tmp/eos-test/ckpt-{UID[:8]}-1" and cfg.restore_from == SNAP0 and cfg.spec == new
    assert cfg.replay_offsets_from == "/tmp/eos-test/live"      # the old driver's offset log
    st, _ = record_resolution(resolve.status, ResolutionReport(stream_uid=UID, generation=0, slots=2),
                              attempt=1, spec_hash=new.spec_hash(), observed=observed())
    # 5. Submit: the same status write names the new checkpoint and closes the upgrade record.
    submit = plan(new, st, observed())
    assert [type(a) for a in submit.actions] == [CreateSnapshot, ApplyConfigMap, CreatePod]   # 409 if it exists
    run = json.loads(submit.actions[1].body["data"]["run.json"])
    assert run["checkpointDir"] == f"/tmp/eos-test/ckpt-{UID[:8]}-1" and run["restoreFrom"] == SNAP0
    env = {e["name"]: e.get("value") for e in submit.actions[2].body["spec"]["containers"][0]["env"]}
    assert env["EOS_SNAPSHOT_ON_STOP"] == f"/tmp/eos-test/snapshots/colors-{UID[:8]}-a1"
    assert submit.status.upgrade is None
    assert submit.status.checkpoint_dir == f"/tmp/eos-test/ckpt-{UID[:8]}-1" and submit.status.restore_from == SNAP0
    assert "Upgraded" in reasons(submit)
    # 6. Seen, then Running: the new spec is the stable one.
    seen = plan(new, submit.status, observed(pod("colors-driver-1", "Pending")))
    up_run = plan(new, seen.status, observed(pod("colors-driver-1")))
    assert up_run.status.lifecycle_state == "Running"
    assert up_run.status.last_stable_spec != up_run.status.last_reconciled_spec   # not before a new batch
    up_run = plan(new, up_run.status, observed(pod("colors-driver-1"), batch=42))
    assert up_run.status.last_stable_spec == up_run.status.last_reconciled_spec
    # A later plain restart keeps the new location and its restore source.
    failed = plan(new, up_run.status, observed(pod("colors-driver-1", "Failed", exit_code=137)))
    assert failed.status.upgrade is None
    relaunch = plan(new, failed.status, observed(at=100))
    cfg = relaunch.actions[0].config
    assert cfg.checkpoint_dir == f"/tmp/eos-test/ckpt-{UID[:8]}-1" and cfg.restore_from == SNAP0


def _with_snapshot(obs, view=None, *, readable=True, state="unknown"):
    from dataclasses import replace
    return replace(obs, snapshot=view, store_readable=readable, checkpoint_state=state)


def through_drain(new: ExactlyOnceStreamSpec, status: ExactlyOnceStreamStatus, at: float = 0.0):
    """An upgrade that does not start from a snapshot first runs the drain Pod with the old spec."""
    from dataclasses import replace
    mark = plan(new, status, observed(at=at))
    assert mark.status.upgrade.step == "Draining" and mark.again
    name = mark.status.upgrade.drain_pod
    start = plan(new, mark.status, observed(at=at))
    assert [type(a) for a in start.actions] == [ApplyConfigMap, CreatePod] and "Draining" in reasons(start)
    drain_pod = start.actions[1].body
    assert drain_pod["metadata"]["name"] == name
    assert drain_pod["spec"]["containers"][0]["args"][-1] == "--drain"
    done = plan(new, start.status, replace(observed(at=at), aux_pods=(PodView(name, "Succeeded", attempt=1),)))
    assert done.status.upgrade.drained and done.status.upgrade.step == "Stopped" and "Drained" in reasons(done)
    return done.status, drain_pod, start.actions[0].body


def test_decisions_repeat_the_same_way_after_an_operator_restart():
    """Each step decides from status and the world alone: replaying a step gives the same plan."""
    old, new = spec(), upgraded_spec()
    p = plan(new, running(old), observed(pod("colors-driver-0")))
    assert plan(new, running(old), observed(pod("colors-driver-0"))).status == p.status
    gone = _with_snapshot(observed(), snap())
    once, twice = plan(new, p.status, gone), plan(new, p.status, gone)
    assert once.status == twice.status and once.actions == twice.actions
    # Taken already: replaying the next step does not record the snapshot twice.
    again = plan(new, once.status, gone)
    assert len(again.status.snapshots) == 1 and [type(a) for a in again.actions] == [Resolve]
    assert [type(a) for a in once.actions] == [CreateSnapshot]   # its ExactlyOnceSnapshot (409 if repeated)


def test_a_snapshot_of_another_stream_is_not_used():
    old, new = spec(), upgraded_spec()
    p = plan(new, running(old), observed(pod("colors-driver-0")))
    foreign = plan(new, p.status, _with_snapshot(observed(), snap(uid="someone-else"), state="intact"))
    assert "SnapshotFallback" in reasons(foreign)
    assert foreign.status.upgrade.restore_from is None


def test_dead_driver_falls_back_to_last_state_on_an_intact_checkpoint_and_says_so():
    old, new = spec(), upgraded_spec()
    failed = running(old, lifecycle_state="Failed", restart_count=2)
    p = plan(new, failed, observed(pod("colors-driver-0", "Failed")))
    assert p.status.upgrade.step == "Stopping"
    cleared = plan(new, p.status, observed(pod("colors-driver-0", "Failed")))
    assert cleared.actions == [DeletePod("colors-driver-0", 0)]
    fb = plan(new, cleared.status, _with_snapshot(observed(), None, state="intact"))
    ev = [e for e in fb.events if e.reason == "SnapshotFallback"][0]
    assert ev.type == "Warning" and "last-state" in ev.message and "not stopped gracefully" in ev.message
    assert "last-state" in cond(fb, "Progressing").message
    up = fb.status.upgrade
    assert up.step == "Stopped" and up.restore_from is None and up.checkpoint_dir == "/tmp/eos-test/live"
    # No clean boundary: the old spec first finishes whatever batch the dead driver left uncommitted.
    drained, drain_pod, drain_cm = through_drain(new, fb.status)
    drain_run = json.loads(drain_cm["data"]["run.json"])
    assert drain_run["spec"]["job"]["args"] == json.loads(drained.last_reconciled_spec)["job"]["args"] != {"v": "2"}
    assert drain_run["checkpointDir"] == "/tmp/eos-test/live" and drain_run["stream"]["generation"] == 0
    resolve = plan(new, drained, observed())
    assert resolve.actions[0].config.checkpoint_dir == "/tmp/eos-test/live"
    assert resolve.actions[0].config.restore_from is None


@pytest.mark.parametrize("state", ["damaged", "unknown"])
def test_no_snapshot_and_no_intact_checkpoint_blocks_the_upgrade(state):
    old, new = spec(), upgraded_spec()
    p = plan(new, running(old, lifecycle_state="Failed"), observed(pod("colors-driver-0", "Failed")))
    blocked = plan(new, p.status, _with_snapshot(observed(), None, state=state))
    assert blocked.status.lifecycle_state == "Failed" and blocked.actions == []
    assert blocked.status.pending_launch is None and blocked.status.upgrade.step == "Blocked"
    assert "UpgradeBlocked" in reasons(blocked) and "never silently stateless" in cond(blocked, "Ready").message
    # It stays blocked, quietly.
    still = plan(new, blocked.status, observed(at=30))
    assert still.actions == [] and still.events == [] and still.status.lifecycle_state == "Failed"
    # Asking for last-state explicitly unblocks it.
    explicit = spec(job=new.job.wire(), upgradeMode="last-state", upgradePreFlight=False)
    go = plan(explicit, still.status, observed(at=31))
    assert go.status.upgrade.mode == "last-state" and go.status.pending_launch is not None
    drained, _, _ = through_drain(explicit, go.status, at=31)
    assert [type(a) for a in plan(explicit, drained, observed(at=31)).actions] == [Resolve]


def test_unreadable_store_proceeds_unverified_and_says_so():
    old, new = spec(), upgraded_spec()
    p = plan(new, running(old), observed(pod("colors-driver-0")))
    un = plan(new, p.status, _with_snapshot(observed(), None, readable=False))
    assert "SnapshotUnverified" in reasons(un)
    assert un.status.upgrade.step == "Stopped" and un.status.upgrade.restore_from == SNAP0


def test_last_state_and_stateless_modes():
    old = spec()
    last = plan(upgraded_spec(upgradeMode="last-state"), running(old), observed(pod("colors-driver-0")))
    assert (last.status.upgrade.step, last.status.upgrade.checkpoint_dir) == ("Stopped", "/tmp/eos-test/live")
    assert last.status.upgrade.restore_from is None
    less = plan(upgraded_spec(upgradeMode="stateless"), running(old), observed(pod("colors-driver-0")))
    up = less.status.upgrade
    assert (up.step, up.checkpoint_dir, up.restore_from) == ("Stopped", f"/tmp/eos-test/ckpt-{UID[:8]}-1", None)
    assert "ledger skips nothing" in less.events[0].message


def test_restart_only_change_restarts_on_the_live_checkpoint_even_in_snapshot_mode():
    old = spec()
    p = plan(spec(triggerIntervalMs=2000), running(old), observed(pod("colors-driver-0")))
    assert p.status.pending_launch.reason == "SpecChange" and p.status.upgrade is None
    stop = plan(spec(triggerIntervalMs=2000), p.status, observed(pod("colors-driver-0")))
    resolve = plan(spec(triggerIntervalMs=2000), stop.status, observed())
    assert resolve.actions[0].config.checkpoint_dir == "/tmp/eos-test/live"


def test_parallelism_change_bumps_the_generation_once_and_an_abandoned_upgrade_restores_it():
    old, new = spec(), upgraded_spec(job={"parallelism": 4})
    p = plan(new, running(old), observed(pod("colors-driver-0")))
    assert p.status.tx_generation == 1 and "new transactional-id generation" in p.events[0].message
    # The user asks for a restart mid-upgrade: the upgrade is decided again, not bumped twice.
    nonce = spec(job=new.job.wire(), restartNonce=1)
    r = plan(nonce, p.status, observed(pod("colors-driver-0")))
    assert r.status.upgrade is None and r.status.tx_generation == 0
    again = plan(nonce, r.status, observed(pod("colors-driver-0")))
    assert again.status.upgrade is not None and again.status.tx_generation == 1


def test_a_pending_restart_that_would_start_a_changed_spec_becomes_an_upgrade():
    old, new = spec(), upgraded_spec()
    failed = plan(old, running(old), observed(pod("colors-driver-0", "Failed")))
    assert failed.status.pending_launch.reason == "Restart"
    p = plan(new, failed.status, observed(pod("colors-driver-0", "Failed")))
    assert p.status.pending_launch.reason == "SpecChange" and p.status.upgrade is not None
    assert p.status.pending_launch.not_before == failed.status.pending_launch.not_before


def test_a_parallelism_change_on_the_live_checkpoint_drains_under_the_old_generation_first():
    old, new = spec(), upgraded_spec(job={"parallelism": 4}, upgradeMode="last-state")
    p = plan(new, running(old), observed(pod("colors-driver-0")))
    assert p.status.tx_generation == 1 and p.status.upgrade.step == "Stopped"
    stop = plan(new, p.status, observed(pod("colors-driver-0")))
    assert stop.actions == [DeletePod("colors-driver-0", 60)]
    drained, drain_pod, drain_cm = through_drain(new, stop.status)
    run = json.loads(drain_cm["data"]["run.json"])
    assert run["spec"]["job"]["parallelism"] == 2 and run["stream"]["generation"] == 0   # old slots, old ids
    labels = drain_pod["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "drain" and "app.kubernetes.io/component=driver" not in labels
    resolve = plan(new, drained, observed())
    cfg = resolve.actions[0].config
    assert cfg.spec.job.parallelism == 4 and cfg.stream.generation == 1


def test_a_failed_drain_is_a_failed_start_and_runs_again_after_the_delay():
    from dataclasses import replace
    old, new = spec(), upgraded_spec(upgradeMode="last-state")
    p = plan(new, running(old), observed(pod("colors-driver-0")))
    stop = plan(new, p.status, observed())
    start = plan(new, stop.status, observed())
    name = start.status.upgrade.drain_pod
    failed = plan(new, start.status, replace(observed(), aux_pods=(PodView(name, "Failed", exit_code=3,
                                                                                   attempt=1),)))
    assert DeletePod(name, 0) in failed.actions and "DrainFailed" in reasons(failed)
    assert failed.status.upgrade.step == "Draining" and not failed.status.upgrade.drained
    assert failed.status.pending_launch.not_before is not None
    later = parse(failed.status.pending_launch.not_before)
    again = plan(new, failed.status, observed(at=(later - observed().now).total_seconds() + 1))
    assert [type(a) for a in again.actions] == [ApplyConfigMap, CreatePod]


# ------------------------------------------------------------- the store adapter
def test_local_store_reads_manifests_and_checkpoint_states(tmp_path):
    store, s = StoreReader(), spec(checkpoint={"store": "local", "path": str(tmp_path)})
    run = asyncio.run
    assert run(store.read_snapshot(s, str(tmp_path / "none"))) is None
    (tmp_path / "snap").mkdir()
    (tmp_path / "snap" / "eos-snapshot.json").write_text(json.dumps(
        {"stream": {"uid": UID}, "lastBatch": 3, "time": "t", "checkpointId": "q"}))
    assert run(store.read_snapshot(s, str(tmp_path / "snap"))) == SnapshotView(str(tmp_path / "snap"), UID, 3, "t", "q")
    ck = tmp_path / "ck"
    assert run(store.checkpoint_state(s, str(ck))) == "empty"
    ck.mkdir()
    (ck / "metadata").write_text('{"id":"q"}\n')
    assert run(store.checkpoint_state(s, str(ck))) == "damaged"
    (ck / "offsets").mkdir()
    (ck / "offsets" / "0").write_text("v1\n")
    assert run(store.checkpoint_state(s, str(ck))) == "intact"
    pvc = spec(checkpoint={"store": "pvc", "claimName": "c", "path": "/data"})
    with pytest.raises(StoreUnreadable):
        run(store.read_snapshot(pvc, "/data/snapshots/x"))


# --------------------------------------------------- the reconcile loop, crashes
@dataclass
class FakeStore:
    """Snapshots appear when a driver Pod with EOS_SNAPSHOT_ON_STOP is deleted gracefully (as the runtime does)."""
    kube: FakeKube
    written: dict[str, SnapshotView] = field(default_factory=dict)
    reads: int = 0

    def sync(self) -> None:
        for pod_ in self.kube.pods.values():
            if pod_["metadata"].get("deletionTimestamp"):
                env = {e["name"]: e.get("value") for e in pod_["spec"]["containers"][0]["env"]}
                path = env.get("EOS_SNAPSHOT_ON_STOP")
                if path:
                    # What the runtime writes: the stream id of its run config, not metadata.uid.
                    uid = stream_uid(pod_["metadata"]["namespace"], pod_["metadata"]["ownerReferences"][0]["name"])
                    self.written[path] = SnapshotView(path=path, stream_uid=uid, batch=len(self.written) + 5)

    async def read_snapshot(self, spec_, path, s3=None):
        self.reads += 1
        return self.written.get(path)

    async def checkpoint_state(self, spec_, path, s3=None):
        return "intact"


@pytest.mark.parametrize("crash", [None, "upgrade", "Stopped", "resolvedSpecHash", "create"])
def test_killed_operator_finishes_the_upgrade_exactly_once(crash):
    kube, clock = FakeKube(), FakeClock()
    resolver = FakeResolver(kube=kube)
    kube.add_stream("colors", base_spec())
    store = FakeStore(kube)
    deps = Deps(kube=kube, resolver=resolver, clock=clock, store=store)

    def rec():
        try:
            asyncio.run(reconcile("default", "colors", deps))
        except Crash:
            pass

    rec()
    kube.set_pod_phase("colors-driver-0", "Running")
    rec()
    kube.update_spec("colors", lambda s: (s["job"].update(args={"v": "2"}), s.update(upgradePreFlight=False)))
    if crash == "create":
        kube.crash_after_create_pod = True
    elif crash:
        kube.crash_after_status_patch_containing = crash
    for _ in range(8):
        rec()
        store.sync()
        kube.finish_deletions()
        clock.advance(2)
    status = kube.stream("colors")["status"]
    assert kube.created_pods == ["colors-driver-0", "colors-driver-1"]
    assert kube.max_alive_drivers == 1
    assert "upgrade" not in status and "pendingLaunch" not in status
    uid = kube.stream("colors")["metadata"]["uid"]
    assert status["checkpointDir"] == f"/tmp/eos-test/ckpt-{uid[:8]}-1"
    assert status["restoreFrom"] == status["snapshots"][0]["path"]
    assert len(status["snapshots"]) == 1
    # Events follow the status write: a crash right after the write may lose one, never repeat one.
    expected = {"SnapshotTaken": 0 if crash == "Stopped" else 1, "Upgraded": 1}
    assert {r: kube.reasons().count(r) for r in expected} == expected
    assert resolver.calls[-1].restore_from == status["restoreFrom"]


# ------------------------------------------------------- S3 keys from the stream's Secret
def test_s3_options_read_the_named_secret_keys_in_the_streams_namespace():
    import base64

    from eos_operator.adapters import s3_options
    kube = FakeKube()
    s = spec(checkpoint={"store": "s3", "path": "/streams/colors",
                         "s3": {"bucket": "ckpt", "endpoint": "http://minio:9000", "pathStyleAccess": True,
                                "accessKeyId": {"name": "s3-keys", "key": "id"},
                                "secretAccessKey": {"name": "s3-keys", "key": "secret"}}})
    with pytest.raises(StoreUnreadable, match="Secret team-a/s3-keys does not exist"):
        asyncio.run(s3_options(kube, "team-a", s))
    kube.secrets[("team-a", "s3-keys")] = {"data": {"id": base64.b64encode(b"AKIA1").decode()}}
    with pytest.raises(StoreUnreadable, match="has no key 'secret'") as err:
        asyncio.run(s3_options(kube, "team-a", s))
    assert "AKIA1" not in str(err.value)
    kube.secrets[("team-a", "s3-keys")]["data"]["secret"] = base64.b64encode(b"hunter2").decode()
    opts = asyncio.run(s3_options(kube, "team-a", s))
    assert (opts.endpoint, opts.path_style, opts.access_key, opts.secret_key) == \
        ("http://minio:9000", True, "AKIA1", "hunter2")
    assert "hunter2" not in repr(opts) and "AKIA1" not in repr(opts)
    assert {ns for ns, _ in kube.secret_reads} == {"team-a"}, "only the stream's own namespace is read"
    local = spec(checkpoint={"store": "local", "path": "/tmp/x"})
    before = len(kube.secret_reads)
    assert asyncio.run(s3_options(kube, "team-a", local)) is None and len(kube.secret_reads) == before


def test_a_field_a_newer_operator_adds_with_its_default_is_no_change():
    """An operator upgrade that adds spec fields (e.g. job.podTemplate.securityContext, job.driver.
    startTimeoutSeconds) must not upgrade every running stream."""
    s = spec()
    old = json.loads(running_status(s).last_reconciled_spec)
    del old["job"]["podTemplate"]["securityContext"]
    del old["job"]["driver"]["startTimeoutSeconds"]
    assert run_affecting_changes(json.dumps(old), s) == []
    old["job"]["driver"]["memory"] = "3Gi"
    assert run_affecting_changes(json.dumps(old), s) == ["job.driver.memory"]


def _decision(p) -> tuple:
    """What a pass decided for a running stream: a restart is written as intent first (a pending launch, the
    state Upgrading), then acted on."""
    return (p.status.lifecycle_state, p.status.pending_launch is not None, [type(a).__name__ for a in p.actions],
            [e.reason for e in p.events])


def test_a_stored_stream_keeps_its_driver_when_an_upgraded_operator_sizes_its_memory_anew(monkeypatch):
    """The memory split (eos_job.memory) is derived from the spec, never recorded: an operator that computes
    another heap for a stored stream sees the same spec (hash, recorded form, restart decision) and restarts
    nothing, though a driver Pod it made now would differ. And job.driver.memory's default is the one earlier
    operators recorded (1Gi): the API server fills a stored stream's unset field with the CRD's default as it
    is read, so a new default would be a spec change."""
    import eos_job.memory
    raw = base_spec()
    raw["job"].pop("driver", None)                       # the field left unset, as most streams do
    stored = ExactlyOnceStreamSpec.model_validate(raw)   # read with the CRD's (the model's) default
    recorded = running_status(stored)                    # an earlier operator's status: memory 1Gi
    assert json.loads(recorded.last_reconciled_spec)["job"]["driver"]["memory"] == "1Gi"
    running_driver = observed(pod("colors-driver-0"))
    def heap() -> str:
        env = children.driver_pod(REF, stored, attempt=0, tx_generation=0)["spec"]["containers"][0]["env"]
        return next(e["value"] for e in env if e["name"] == "EOS_DRIVER_HEAP")

    heap_before = heap()
    before = (stored.spec_hash(), run_affecting_changes(recorded.last_reconciled_spec, stored),
              _decision(plan(stored, recorded, running_driver)))
    assert before[1:] == ([], ("Running", False, [], []))

    monkeypatch.setattr(eos_job.memory, "PYTHON_BASE_MIB", eos_job.memory.PYTHON_BASE_MIB - 64)   # a new split
    assert (heap_before, heap()) == ("480m", "544m"), "the split must change the Pod, or this test shows nothing"
    after = (stored.spec_hash(), run_affecting_changes(recorded.last_reconciled_spec, stored),
             _decision(plan(stored, recorded, running_driver)))
    assert after == before

    # Control: the reverted 2Gi default (the same stored stream read as 2Gi) is a change, and the driver restarts.
    raw["job"]["driver"] = {"memory": "2Gi"}
    moved = ExactlyOnceStreamSpec.model_validate(raw)
    assert run_affecting_changes(recorded.last_reconciled_spec, moved) == ["job.driver.memory"]
    assert moved.spec_hash() != stored.spec_hash()
    assert _decision(plan(moved, recorded, running_driver)) == ("Upgrading", True, [], ["Upgrading"])


def test_on_a_pvc_a_check_pod_verifies_the_snapshot_and_reads_the_checkpoint_state():
    """The operator mounts no claim: once the old driver is gone, <stream>-check-<n> reads the snapshot's
    manifest and the checkpoint's state where they are; the upgrade then goes on as for a store it reads."""
    from dataclasses import replace
    claim = {"store": "pvc", "claimName": "ckpt", "path": "/tmp/eos-test"}
    old, new = spec(checkpoint=claim), upgraded_spec(checkpoint=claim)
    p = plan(new, running(old), observed(pod("colors-driver-0")))
    gone = _with_snapshot(observed(), None, readable=False)        # what the operator itself sees on a pvc
    check = plan(new, p.status, gone)
    created = [a for a in check.actions if isinstance(a, CreatePod)]
    assert [a.body["metadata"]["name"] for a in created] == ["colors-check-1"], check.actions
    (c,) = created[0].body["spec"]["containers"]
    assert c["args"][-2:] == ["--snapshot", SNAP0] and "SnapshotUnverified" not in reasons(check)
    manifest = {"path": SNAP0, "streamUid": stream_uid("default", "colors"), "batch": 41, "checkpointId": "q"}
    done = PodView(name="colors-check-1", phase="Succeeded", attempt=1, owner_uid=gone.uid, message=json.dumps(
        {"reason": "Probed", "checkpointDir": "/tmp/eos-test/live", "state": "intact", "snapshot": manifest}))
    recorded = plan(new, check.status, replace(gone, aux_pods=(done,)))
    assert recorded.status.upgrade.checked.snapshot.batch == 41
    verified = plan(new, recorded.status, gone)
    assert "SnapshotTaken" in reasons(verified) and verified.status.upgrade.restore_from == SNAP0
    assert verified.status.snapshots[-1].batch == 41
    # No snapshot on the claim, an intact checkpoint: last-state fallback, as for a store the operator reads.
    fallback = {"reason": "Probed", "checkpointDir": "/tmp/eos-test/live", "state": "intact"}
    done = replace(done, message=json.dumps(fallback))
    recorded = plan(new, check.status, replace(gone, aux_pods=(done,)))
    fell_back = plan(new, recorded.status, gone)
    assert "SnapshotFallback" in reasons(fell_back) and fell_back.status.upgrade.restore_from is None


def test_a_secret_the_operator_may_not_read_names_the_grant_to_add():
    """A cluster-wide install reads Secrets only in the namespaces granted (rbac.secretNamespaces): a 403
    is a clear error naming the namespace and the chart value, for the S3 keys and the Kafka credentials."""
    from eos_job.kafka_security import KafkaSecretMissing

    from eos_operator.adapters import KubeError, kafka_secrets, s3_options

    class Refusing(FakeKube):
        async def read_secret(self, namespace, name):
            raise KubeError(403, f'secrets "{name}" is forbidden')

    s3 = spec(checkpoint={"store": "s3", "path": "/streams/colors",
                          "s3": {"bucket": "ckpt", "accessKeyId": {"name": "s3-keys", "key": "id"},
                                 "secretAccessKey": {"name": "s3-keys", "key": "secret"}}})
    with pytest.raises(StoreUnreadable, match=r"may not read Secret team-a/s3-keys \(403\).*"
                                              r"add team-a to the chart's rbac.secretNamespaces"):
        asyncio.run(s3_options(Refusing(), "team-a", s3))
    credentials = {"mechanism": "SCRAM-SHA-512", "username": {"name": "kafka-user", "key": "u"},
                   "password": {"name": "kafka-user", "key": "p"}}
    secured = spec(sink={"bootstrapServers": "localhost:9092", "topic": "out", "credentials": credentials})
    with pytest.raises(KafkaSecretMissing, match="may not read Secret team-a/kafka-user"):
        asyncio.run(kafka_secrets(Refusing(), "team-a", secured))

    class Failing(FakeKube):
        async def read_secret(self, namespace, name):
            raise KubeError(500, "etcd timeout")
    with pytest.raises(KubeError):                 # not a grant to add: retried like any API failure
        asyncio.run(s3_options(Failing(), "team-a", s3))
