"""Stream and snapshot documents in every state a GitOps tool tells apart, as the operator writes them, with
the health Argo CD and kstatus should compute for each.

Each document comes from the operator's own code: the reconcile loop over the fake API server
(fakes.FakeKube keeps the object as the API server would after the operator's status merge patches), or,
where the fakes cannot reach a state cheaply (a blocked upgrade, a rollback), the pure planner's status
serialised as the reconciler serialises it (loop.dump_status) and merged as FakeKube merges a patch. Nothing
in a status is written by hand. The expectations are stated by hand, per state: they are what the docs
promise (the chart README: GitOps health) and what the Lua health checks and the kstatus library are tested against
(test_gitops_health.py, over the real API server), and the Reconciling/Stalled conditions against
(test_gitops_conditions.py).
"""
from __future__ import annotations

import asyncio
import copy
import functools
import json
from dataclasses import dataclass
from typing import Any, Callable

from eos_job.spec import ExactlyOnceStreamSpec, stream_uid
from eos_job.status import ExactlyOnceStreamStatus, ReplayHorizon, ResolutionReport
from eos_operator.actions import Resolve
from eos_operator.loop import dump_status
from eos_operator.planner import plan, record_resolution
from eos_operator.reconciler import Deps, reconcile
from eos_operator.snapshot_reconciler import reconcile_snapshot
from eos_operator.timeutil import fmt
from eos_operator.upgrades import spec_json

from .fakes import T0, FakeClock, FakeKube, FakeProgress, FakeResolver, base_spec
from .test_planner import UID, observed, pod, spec
from .test_upgrade_safety import go_to_running
from .test_upgrades import _with_snapshot, running, upgraded_spec

NS = "default"
API_VERSION = "streaming.eos.dev/v1beta1"
GOOD_SNAPSHOT = json.dumps({"reason": "SnapshotTaken", "path": "/tmp/eos-test/snapshots/s1", "lastBatch": 7})


@dataclass(frozen=True)
class State:
    """A document and the health each tool should give it: Argo CD's status (Healthy, Progressing, Degraded,
    Suspended) and kstatus's (Current, InProgress, Failed, Terminating)."""
    name: str
    doc: dict[str, Any]
    argocd: str
    kstatus: str

    @property
    def kind(self) -> str:
        return self.doc["kind"]


# ------------------------------------------------------------------ streams, through the reconcile loop
class StreamRig:
    def __init__(self, spec_doc: dict[str, Any] | None = None, progress: FakeProgress | None = None):
        self.kube, self.clock = FakeKube(), FakeClock()
        self.kube.add_stream("colors", spec_doc or base_spec())
        self.deps = Deps(kube=self.kube, resolver=FakeResolver(kube=self.kube), clock=self.clock,
                         progress=progress)

    def rec(self) -> None:
        asyncio.run(reconcile(NS, "colors", self.deps))

    def doc(self) -> dict[str, Any]:
        return copy.deepcopy(self.kube.stream("colors"))

    def running(self) -> StreamRig:
        self.rec()
        self.kube.set_pod_phase("colors-driver-0", "Running")
        self.rec()
        return self

    def spec(self, mutate: Callable[[dict[str, Any]], None]) -> StreamRig:
        self.kube.update_spec("colors", mutate)
        return self


def _stream_states() -> list[State]:
    out: list[State] = []
    first = StreamRig()
    # kstatus has nothing to go by before the operator's first status write: "Resource is current".
    out.append(State("stream-created", first.doc(), "Progressing", "Current"))
    first.rec()
    out.append(State("stream-deploying", first.doc(), "Progressing", "InProgress"))
    first.kube.block_pod("colors-driver-0", "ImagePullBackOff", 'Back-off pulling image "eos:missing"',
                         created_at=first.clock.now())
    first.clock.advance(5)
    first.rec()
    out.append(State("stream-driver-start-blocked", first.doc(), "Progressing", "InProgress"))

    run = StreamRig().running()
    out.append(State("stream-running", run.doc(), "Healthy", "Current"))
    run.spec(lambda s: s["job"].update(args={"window": "5s"}))
    out.append(State("stream-spec-not-yet-observed", run.doc(), "Progressing", "InProgress"))

    crash = StreamRig().running()
    crash.kube.set_pod_phase("colors-driver-0", "Failed", exit_code=137, message="killed")
    crash.rec()
    out.append(State("stream-restarting-after-failure", crash.doc(), "Degraded", "InProgress"))

    exhausted = StreamRig()
    exhausted.rec()
    for attempt in range(3):   # 2 restarts allowed: the third failure exhausts them
        exhausted.kube.set_pod_phase(f"colors-driver-{attempt}", "Failed", exit_code=3, message="SinkUnavailable")
        exhausted.rec()
        exhausted.clock.advance(11)
        exhausted.rec()
    out.append(State("stream-restarts-exhausted", exhausted.doc(), "Degraded", "Failed"))

    refused_batch = StreamRig().running()
    refused_batch.kube.set_pod_phase("colors-driver-0", "Failed", exit_code=4, message=json.dumps(
        {"reason": "BatchRefused", "error": "batch 42 is in the ledger with other input"}))
    refused_batch.rec()
    out.append(State("stream-batch-refused", refused_batch.doc(), "Degraded", "Failed"))

    invalid = StreamRig(base_spec(sink={"bootstrapServers": "localhost:9092", "topic": "in"}))
    invalid.rec()
    out.append(State("stream-invalid-spec", invalid.doc(), "Degraded", "Failed"))

    refused = StreamRig()
    refused.kube.fail_create_pod, refused.kube.fail_create_status = 1, 403
    refused.kube.fail_create_message = 'pods "colors-driver-0" is forbidden: violates PodSecurity "restricted"'
    refused.rec()
    out.append(State("stream-driver-pod-refused", refused.doc(), "Progressing", "InProgress"))

    suspend = StreamRig().running().spec(lambda s: s["job"].update(state="suspended"))
    suspend.rec()
    out.append(State("stream-suspending", suspend.doc(), "Progressing", "InProgress"))
    suspend.kube.finish_deletions()
    suspend.rec()
    # kstatus knows no suspension: Ready is False, so InProgress (the chart README: GitOps health).
    out.append(State("stream-suspended", suspend.doc(), "Suspended", "InProgress"))

    upgrade = StreamRig().running().spec(lambda s: s.update(upgradePreFlight=True) or s["job"].update(
        args={"window": "5s"}))
    upgrade.rec()
    out.append(State("stream-upgrade-pre-flight", upgrade.doc(), "Progressing", "InProgress"))
    upgrade.kube.set_pod_phase("colors-preflight-1", "Failed", exit_code=4, message=json.dumps(
        {"reason": "PreFlightFailed", "error": "StateSchemaNotCompatible: key schema changed"}))
    upgrade.rec()
    out.append(State("stream-upgrade-refused-by-pre-flight", upgrade.doc(), "Degraded", "Failed"))

    upgrading = StreamRig().running().spec(lambda s: s["job"].update(args={"window": "5s"}))
    upgrading.rec()
    upgrading.kube.set_pod_phase("colors-preflight-1", "Succeeded")
    upgrading.rec()
    out.append(State("stream-upgrading", upgrading.doc(), "Progressing", "InProgress"))

    shrinking = ReplayHorizon(state="Shrinking", batch=41, checked_at=fmt(T0), backlog_records=500,
                              seconds_left=120.0, partition="in/0",
                              message="retention deletes unprocessed records of in/0 in about 120 s")
    horizon = StreamRig(progress=FakeProgress(batch=41, horizon=shrinking)).running()
    out.append(State("stream-replay-horizon-shrinking", horizon.doc(), "Degraded", "Current"))

    exceeded = shrinking.model_copy(update={"state": "Exceeded", "lost_records": 10, "seconds_left": None,
                                            "message": "retention deleted 10 records of in/0 the stream had not read"})
    lost = StreamRig(progress=FakeProgress(batch=41, horizon=exceeded)).running()
    out.append(State("stream-replay-horizon-exceeded", lost.doc(), "Degraded", "Current"))

    gone = StreamRig().running()
    gone.kube.mark_stream_deleted("colors")
    gone.rec()
    out.append(State("stream-deleting", gone.doc(), "Progressing", "Terminating"))
    return out + _planned_stream_states()


# ------------------------------------------------------------------ streams, through the pure planner
def _planned_doc(spec_doc: dict[str, Any], status: ExactlyOnceStreamStatus) -> dict[str, Any]:
    """The object after the operator wrote ``status`` for its current generation: the reconciler's
    serialisation, merged as the API server merges the patch (a None removes the field)."""
    meta = {"name": "colors", "namespace": NS, "uid": UID, "generation": status.observed_generation}
    return {"apiVersion": API_VERSION, "kind": "ExactlyOnceStream", "metadata": meta,
            "spec": spec_doc, "status": {k: v for k, v in dump_status(status).items() if v is not None}}


def _planned_stream_states() -> list[State]:
    old = spec()
    # An upgrade with no snapshot and a damaged checkpoint: blocked (never silently stateless).
    new = upgraded_spec()
    failed = plan(new, running(old, lifecycle_state="Failed"), observed(pod("colors-driver-0", "Failed")))
    blocked = plan(new, failed.status, _with_snapshot(observed(), None, state="damaged"))
    assert blocked.status.upgrade.step == "Blocked", blocked.status.upgrade
    out = [State("stream-upgrade-blocked", _planned_doc(_wire(new), blocked.status), "Degraded", "Failed")]

    # An upgrade whose new driver does not commit a batch by its deadline: rolled back, the old spec runs.
    new = upgraded_spec(upgradeReadinessTimeoutSeconds=60)
    start = plan(new, running(old, last_stable_spec=spec_json(old)), observed(pod("colors-driver-0")))
    verifying = go_to_running(new, start.status)
    out.append(State("stream-verifying-upgrade", _planned_doc(_wire(new), verifying.status), "Progressing",
                     "InProgress"))
    rolled = plan(new, verifying.status, observed(pod("colors-driver-1"), batch=41, at=61))
    steps = [rolled]
    for obs in (observed(pod("colors-driver-1"), at=61), observed(at=62)):
        steps.append(plan(new, steps[-1].status, obs))
    out.append(State("stream-rolling-back", _planned_doc(_wire(new), steps[-1].status), "Degraded",
                     "InProgress"))
    resolve = steps[-1].actions[0]
    assert isinstance(resolve, Resolve), steps[-1].actions
    report = ResolutionReport(stream_uid=stream_uid(NS, "colors"), generation=0, slots=2)
    st, _ = record_resolution(steps[-1].status, report, attempt=2, spec_hash=resolve.config.spec.spec_hash(),
                              observed=observed(at=62))
    for obs in (observed(at=62), observed(pod("colors-driver-2"), at=63), observed(pod("colors-driver-2"), at=63)):
        st = plan(new, st, obs).status
    assert st.lifecycle_state == "Running" and st.rejected_spec is not None, st
    out.append(State("stream-rolled-back", _planned_doc(_wire(new), st), "Degraded", "Failed"))
    return out


def _wire(s) -> dict[str, Any]:
    return json.loads(spec_json(s))


# ------------------------------------------------------------------ snapshots, through the reconcile loop
class SnapshotRig:
    def __init__(self, max_retries: int = 1, stream: str = "colors"):
        self.kube, self.clock = FakeKube(), FakeClock()
        stream_spec = base_spec(job={"module": "m", "driver": {"startTimeoutSeconds": 60}})
        self.kube.add_stream("colors", stream_spec)["status"] = {
            "checkpointDir": "/tmp/eos-test/live", "txGeneration": 0,
            "lastReconciledSpec": spec_json(ExactlyOnceStreamSpec.model_validate(stream_spec))}
        self.kube.add_snapshot({"apiVersion": API_VERSION, "kind": "ExactlyOnceSnapshot", "metadata": {"name": "s1"},
                                "spec": {"stream": stream, "maxRetries": max_retries}})
        self.deps = Deps(kube=self.kube, resolver=FakeResolver(), clock=self.clock)

    def rec(self) -> None:
        asyncio.run(reconcile_snapshot(NS, "s1", self.deps))

    def doc(self) -> dict[str, Any]:
        return copy.deepcopy(self.kube.snapshot("s1"))


def _snapshot_states() -> list[State]:
    out: list[State] = []
    take = SnapshotRig()
    out.append(State("snapshot-created", take.doc(), "Progressing", "Current"))
    take.rec()
    out.append(State("snapshot-in-progress", take.doc(), "Progressing", "InProgress"))
    take.kube.block_pod("s1-snap-1", "ErrImagePull", 'failed to pull image "eos:missing": not found',
                        created_at=take.clock.now())
    take.clock.advance(5)
    take.rec()
    out.append(State("snapshot-start-blocked", take.doc(), "Progressing", "InProgress"))
    take.kube.set_snapshot_pod("s1-snap-1", "Failed", exit_code=1, message="copy failed")
    take.rec()
    out.append(State("snapshot-waiting-to-retry", take.doc(), "Progressing", "InProgress"))
    take.clock.advance(3600)
    take.rec()
    take.kube.set_snapshot_pod("s1-snap-2", "Succeeded", message=GOOD_SNAPSHOT)
    take.rec()
    out.append(State("snapshot-completed", take.doc(), "Healthy", "Current"))
    take.kube.snapshot("s1")["metadata"]["deletionTimestamp"] = "2026-01-01T13:00:00Z"
    take.rec()
    out.append(State("snapshot-deleting", take.doc(), "Progressing", "Terminating"))

    failed = SnapshotRig(max_retries=0)
    failed.rec()
    failed.kube.set_snapshot_pod("s1-snap-1", "Failed", exit_code=1, message="copy failed")
    failed.rec()
    out.append(State("snapshot-failed", failed.doc(), "Degraded", "Failed"))

    orphan = SnapshotRig(stream="absent")
    orphan.rec()
    out.append(State("snapshot-of-a-missing-stream", orphan.doc(), "Degraded", "Failed"))
    return out


@functools.cache
def gitops_states() -> tuple[State, ...]:
    """Every state, streams first; names are unique. Built once (the fakes give objects random uids): the
    documents are shared, so a test copies one before changing it."""
    states = tuple(_stream_states() + _snapshot_states())
    assert len({s.name for s in states}) == len(states)
    return states


def by_name() -> dict[str, State]:
    return {s.name: s for s in gitops_states()}
