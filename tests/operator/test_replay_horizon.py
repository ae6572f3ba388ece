"""The planner records the replay horizon, warns once per change, and reports it in Degraded."""
from __future__ import annotations

from dataclasses import replace

from eos_job.status import ReplayHorizon
from eos_operator.planner import plan

from .fakes import FakeProgress
from .test_planner import cond, observed, pod, reasons, running_status, spec
from .test_reconciler import make, rec, status


def horizon(state: str, batch: int = 12, **kw) -> ReplayHorizon:
    return ReplayHorizon(state=state, batch=batch, checked_at="2026-01-01T00:00:00Z",
                         message=kw.pop("message", f"horizon {state}"), **kw)


def look(*pods, h: ReplayHorizon | None, at: float = 0.0):
    return replace(observed(*pods, at=at), replay_horizon=h)


def test_a_shrinking_horizon_warns_once_and_degrades_a_running_stream():
    s = spec()
    first = plan(s, running_status(s), look(pod("colors-driver-0"), h=horizon("Shrinking", backlog_records=900)))
    assert reasons(first) == ["ReplayHorizonShrinking"] and first.events[0].type == "Warning"
    assert first.status.replay_horizon.backlog_records == 900
    assert cond(first, "Ready").status == "True"
    assert (cond(first, "Degraded").status, cond(first, "Degraded").reason) == ("True", "ReplayHorizonShrinking")
    again = plan(s, first.status, look(pod("colors-driver-0"), h=horizon("Shrinking", backlog_records=950), at=30))
    assert "ReplayHorizonShrinking" not in reasons(again)          # no event storm while it stays shrinking
    assert again.status.replay_horizon.backlog_records == 950
    lost = plan(s, again.status, look(pod("colors-driver-0"), h=horizon("Exceeded", lost_records=5), at=60))
    assert reasons(lost) == ["ReplayHorizonExceeded"]
    assert cond(lost, "Degraded").reason == "ReplayHorizonExceeded"
    safe = plan(s, lost.status, look(pod("colors-driver-0"), h=horizon("Safe"), at=90))
    assert reasons(safe) == ["ReplayHorizonSafe"] and safe.events[0].type == "Normal"
    assert (cond(safe, "Degraded").status, cond(safe, "Degraded").reason) == ("False", "AsExpected")


def test_an_unchecked_horizon_keeps_the_last_one():
    s = spec()
    first = plan(s, running_status(s), look(pod("colors-driver-0"), h=horizon("Shrinking")))
    later = plan(s, first.status, look(pod("colors-driver-0"), h=None, at=5))
    assert later.status.replay_horizon == first.status.replay_horizon and later.events == []


def test_a_suspended_stream_is_watched_and_its_last_batch_kept_current():
    s = spec(job={"module": "m", "state": "suspended"})
    st = running_status(spec(job={"module": "m"}), lifecycle_state="Suspended", driver_pod=None, last_committed_batch=10)
    p = plan(s, st, look(h=horizon("Shrinking", batch=11)))
    assert p.status.lifecycle_state == "Suspended" and p.actions == []
    assert "ReplayHorizonShrinking" in reasons(p)
    assert cond(p, "Degraded").reason == "ReplayHorizonShrinking"
    assert p.status.last_committed_batch == 11


def test_the_reconciler_checks_the_horizon_whether_the_driver_runs_or_not():
    kube, resolver, clock, deps = make()
    deps.progress = FakeProgress(batch=3, horizon=horizon("Shrinking", batch=3))
    rec(deps)
    kube.set_pod_phase("colors-driver-0", "Running")
    rec(deps)
    assert status(kube)["replayHorizon"]["state"] == "Shrinking"
    assert kube.reasons().count("ReplayHorizonShrinking") == 1
    kube.set_pod_phase("colors-driver-0", "Failed", exit_code=1, message="boom")
    deps.progress.horizon = horizon("Exceeded", batch=3, lost_records=7)
    rec(deps)
    assert status(kube)["replayHorizon"]["lostRecords"] == 7
    assert kube.reasons().count("ReplayHorizonExceeded") == 1


def test_a_growing_count_of_nondeterministic_replays_warns_with_the_difference():
    s = spec()
    first = plan(s, running_status(s), replace(observed(pod("colors-driver-0")), nondeterministic_slots=0))
    assert first.status.nondeterministic_slots == 0 and first.events == []
    seen = plan(s, first.status, replace(observed(pod("colors-driver-0"), at=10), nondeterministic_slots=2))
    assert reasons(seen) == ["NondeterministicOutput"] and seen.events[0].type == "Warning"
    assert seen.events[0].message.startswith("2 replayed output slot(s)") and seen.status.nondeterministic_slots == 2
    same = plan(s, seen.status, replace(observed(pod("colors-driver-0"), at=20), nondeterministic_slots=2))
    assert same.events == []
    unknown = plan(s, same.status, observed(pod("colors-driver-0"), at=30))
    assert unknown.status.nondeterministic_slots == 2
