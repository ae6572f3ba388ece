"""Version-skew enforcement (issue 31, amendment A3): the planner records the runtime version the newest
batch-complete record names, reports one outside the policy as Degraded ``RuntimeVersionSkew`` with one Warning
event, never stops the stream for it, and clears it when a runtime inside the policy writes the next record."""
from __future__ import annotations

from dataclasses import replace

from eos_operator import __version__ as OPERATOR
from eos_operator.actions import CreatePod, DeletePod
from eos_operator.conditions import set_condition
from eos_operator.planner import plan
from eos_operator.version_skew import skew_message

from .fakes import T0, FakeProgress
from .test_planner import cond, observed, pod, reasons, running_status, spec
from .test_reconciler import make, rec, status

MAJOR, MINOR = (int(x) for x in OPERATOR.split(".")[:2])
NEWER = f"{MAJOR + 1}.0.0"          # outside the policy whatever the operator's version: newer than it
SAME = f"{MAJOR}.{MINOR}.7"         # inside: the operator's minor version


def look(version: str | None, *, batch: int | None = 5, at: float = 0.0):
    return replace(observed(pod("colors-driver-0"), at=at, batch=batch), runtime_version=version)


def degraded(p) -> tuple[str, str, str]:
    c = cond(p, "Degraded")
    return c.status, c.reason, c.message


def test_a_runtime_inside_the_policy_is_recorded_and_not_reported():
    s = spec()
    p = plan(s, running_status(s), look(OPERATOR))
    assert p.status.runtime_version == OPERATOR
    assert degraded(p) == ("False", "AsExpected", "") and p.events == []


def test_a_runtime_outside_the_policy_degrades_the_stream_once_and_keeps_it_running():
    s = spec()
    first = plan(s, running_status(s), look(NEWER))
    message = skew_message(OPERATOR, NEWER)
    assert message is not None
    assert first.status.runtime_version == NEWER
    assert degraded(first) == ("True", "RuntimeVersionSkew", message)
    assert reasons(first) == ["RuntimeVersionSkew"] and first.events[0].type == "Warning"
    assert first.events[0].message.startswith(message)
    # The stream runs on: Ready, Running, nothing stopped or started, not Stalled.
    assert cond(first, "Ready").status == "True" and first.status.lifecycle_state == "Running"
    assert not [a for a in first.actions if isinstance(a, (DeletePod, CreatePod))]
    assert cond(first, "Stalled").status == "False"
    again = plan(s, first.status, look(NEWER, batch=6, at=10))
    assert again.events == [] and degraded(again) == degraded(first)   # no event per pass
    assert cond(again, "Degraded").last_transition_time == cond(first, "Degraded").last_transition_time
    fixed = plan(s, again.status, look(SAME, batch=7, at=20))
    assert fixed.status.runtime_version == SAME
    assert degraded(fixed) == ("False", "AsExpected", "")
    assert reasons(fixed) == ["RuntimeVersionInPolicy"] and fixed.events[0].type == "Normal"


def test_without_a_record_read_the_last_version_stands():
    s = spec()
    first = plan(s, running_status(s), look(NEWER))
    unread = plan(s, first.status, look(None, batch=None, at=10))
    assert unread.status.runtime_version == NEWER and degraded(unread)[1] == "RuntimeVersionSkew"
    assert unread.events == []


def test_a_runtime_that_reports_nothing_is_not_judged():
    """Records of runtimes older than amendment A3 have no version: runtimeVersion unset, no judgement."""
    s = spec()
    p = plan(s, running_status(s), look(None))
    assert p.status.runtime_version is None and degraded(p) == ("False", "AsExpected", "") and p.events == []
    # A skewed runtime replaced by one that reports nothing: the newest record is what status follows.
    skewed = plan(s, running_status(s), look(NEWER))
    older = plan(s, skewed.status, look(None, batch=6, at=10))
    assert older.status.runtime_version is None and degraded(older)[0] == "False"
    assert reasons(older) == ["RuntimeVersionInPolicy"]


def test_an_upgraded_operator_that_first_finds_the_skew_says_so_once():
    """The stored runtimeVersion did not change, but the operator that wrote Degraded did not judge it (an
    operator upgrade made it outside the policy): one Warning, then none."""
    s = spec()
    st = running_status(s, runtime_version=NEWER)
    st.conditions = set_condition(st.conditions, "Degraded", "False", "AsExpected", "", generation=1, now=T0)
    first = plan(s, st, look(NEWER))
    assert reasons(first) == ["RuntimeVersionSkew"] and degraded(first)[1] == "RuntimeVersionSkew"
    assert plan(s, first.status, look(NEWER, at=10)).events == []


def test_a_higher_version_of_another_skew_warns_again():
    s = spec()
    first = plan(s, running_status(s), look(NEWER))
    other = f"{MAJOR + 2}.0.0"
    p = plan(s, first.status, look(other, batch=6, at=10))
    assert reasons(p) == ["RuntimeVersionSkew"] and degraded(p) == ("True", "RuntimeVersionSkew",
                                                                   skew_message(OPERATOR, other))


def test_the_reconciler_writes_the_version_of_the_ledger_tip_into_status():
    kube, resolver, clock, deps = make()
    deps.progress = FakeProgress(batch=3, runtime_version=NEWER)
    rec(deps)
    kube.set_pod_phase("colors-driver-0", "Running")
    rec(deps)
    rec(deps)
    st = status(kube)
    assert st["runtimeVersion"] == NEWER
    degraded_ = next(c for c in st["conditions"] if c["type"] == "Degraded")
    assert (degraded_["status"], degraded_["reason"]) == ("True", "RuntimeVersionSkew")
    assert kube.reasons().count("RuntimeVersionSkew") == 1
    assert kube.created_pods == ["colors-driver-0"] and st["driverPod"] == "colors-driver-0"
    deps.progress.runtime_version = OPERATOR
    rec(deps)
    st = status(kube)
    assert st["runtimeVersion"] == OPERATOR
    assert next(c for c in st["conditions"] if c["type"] == "Degraded")["reason"] == "AsExpected"
