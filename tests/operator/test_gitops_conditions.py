"""Reconciling and Stalled, the kstatus conditions Flux reads, beside Ready/Progressing/Degraded: the rule
(conditions.kstatus_conditions), what the operator writes in every state (gitops_states.py), and the
argocd-cm snippet in the chart README being the shipped Lua health checks. What kstatus itself and Argo CD's
Lua make of the same documents: test_gitops_health.py."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from eos_operator.conditions import kstatus_conditions, snapshot_kstatus_conditions

from .gitops_states import gitops_states

CHART = Path(__file__).resolve().parents[2] / "charts" / "spark-eos-operator"
STATES = gitops_states()

RUNNING = ("True", "Running", "driver Pod colors-driver-0 is running")
STEADY = ("False", "Running", "the driver runs the current spec")
FINE = ("False", "AsExpected", "")


# ----------------------------------------------------------------------------------------- the rule
def test_reconciling_is_progressing_under_the_kstatus_name():
    working = ("True", "Restarting", "restart 1 of 2 in 10s")
    assert kstatus_conditions(("False", "Restarting", "exit 137"), working, ("True", "DriverFailed", "exit 137"),
                              spec_rejected=False) == (working, FINE)
    assert kstatus_conditions(RUNNING, STEADY, FINE, spec_rejected=False) == (STEADY, FINE)


def test_stalled_when_nothing_runs_and_nothing_is_tried_with_what_went_wrong_and_what_to_do():
    reconciling, stalled = kstatus_conditions(
        ("False", "RestartsExhausted", "fixed-delay: 2 restarts used; last error: exit 3"),
        ("False", "RestartsExhausted", "change spec.restartNonce to resume"),
        ("True", "RestartsExhausted", "exit 3"), spec_rejected=False)
    assert reconciling[0] == "False"
    assert stalled == ("True", "RestartsExhausted", "exit 3; change spec.restartNonce to resume")


def test_a_rejected_spec_is_stalled_though_the_last_stable_spec_runs():
    rolled_back = ("True", "UpgradeRolledBack", "no batch committed within 60s: rolled back")
    assert kstatus_conditions(RUNNING, STEADY, rolled_back, spec_rejected=True)[1] == ("True", *rolled_back[1:])
    # Ready with a warning only (a replay horizon shrinking) is not stalled: nothing waits for a person.
    shrinking = ("True", "ReplayHorizonShrinking", "retention deletes unread records in 120 s")
    assert kstatus_conditions(RUNNING, STEADY, shrinking, spec_rejected=False)[1] == FINE


def test_a_suspended_stream_is_neither_reconciling_nor_stalled():
    suspended = ("False", "Suspended", "job.state is suspended")
    assert kstatus_conditions(suspended, suspended, FINE, spec_rejected=False) == (suspended, FINE)


def test_a_snapshot_reconciles_until_completed_or_failed_and_failed_is_stalled():
    assert snapshot_kstatus_conditions("InProgress", ("False", "InProgress", "attempt 1"), deleting=False) == (
        ("True", "InProgress", "attempt 1"), FINE)
    assert snapshot_kstatus_conditions("Completed", ("True", "Completed", "batch 7"), deleting=False) == (
        ("False", "Completed", ""), FINE)
    assert snapshot_kstatus_conditions("Failed", ("False", "Failed", "2 attempts failed"), deleting=False) == (
        ("False", "Failed", ""), ("True", "Failed", "2 attempts failed"))
    assert snapshot_kstatus_conditions("Failed", ("False", "Deleting", ""), deleting=True)[0][0] == "True"


# ---------------------------------------------------------------- what the operator writes, state by state
# (Reconciling, Stalled) per state, by hand; a state without a status has neither.
EXPECTED = {
    "stream-created": None,
    "stream-deploying": ("True", "False"),
    "stream-driver-start-blocked": ("True", "False"),
    "stream-running": ("False", "False"),
    "stream-spec-not-yet-observed": ("False", "False"),   # the operator has not looked yet: generation says it
    "stream-restarting-after-failure": ("True", "False"),
    "stream-restarts-exhausted": ("False", "True"),
    "stream-batch-refused": ("False", "True"),
    "stream-invalid-spec": ("False", "True"),
    "stream-driver-pod-refused": ("True", "False"),
    "stream-suspending": ("True", "False"),
    "stream-suspended": ("False", "False"),
    "stream-upgrade-pre-flight": ("True", "False"),
    "stream-upgrade-refused-by-pre-flight": ("False", "True"),
    "stream-upgrading": ("True", "False"),
    "stream-replay-horizon-shrinking": ("False", "False"),
    "stream-replay-horizon-exceeded": ("False", "False"),
    "stream-deleting": ("False", "False"),
    "stream-upgrade-blocked": ("False", "True"),
    "stream-verifying-upgrade": ("True", "False"),
    "stream-rolling-back": ("True", "False"),
    "stream-rolled-back": ("False", "True"),
    "snapshot-created": None,
    "snapshot-in-progress": ("True", "False"),
    "snapshot-start-blocked": ("True", "False"),
    "snapshot-waiting-to-retry": ("True", "False"),
    "snapshot-completed": ("False", "False"),
    "snapshot-deleting": ("True", "False"),
    "snapshot-failed": ("False", "True"),
    "snapshot-of-a-missing-stream": ("False", "True"),
}


def test_every_state_has_an_expectation():
    assert sorted(EXPECTED) == sorted(s.name for s in STATES)


@pytest.mark.parametrize("state", STATES, ids=lambda s: s.name)
def test_the_operator_writes_reconciling_and_stalled(state):
    conditions = {c["type"]: c for c in (state.doc.get("status") or {}).get("conditions") or []}
    expected = EXPECTED[state.name]
    if expected is None:
        assert not conditions
        return
    reconciling, stalled = conditions["Reconciling"], conditions["Stalled"]
    assert (reconciling["status"], stalled["status"]) == expected, conditions
    generation = state.doc["status"]["observedGeneration"]
    for c in (reconciling, stalled):
        assert c["reason"] and c["observedGeneration"] == generation and c["lastTransitionTime"], c
    if stalled["status"] == "True":   # kstatus's Failed message is Stalled's: it says what went wrong
        assert stalled["message"] and stalled["reason"] != "AsExpected", stalled
    if state.kind == "ExactlyOnceStream":
        progressing = conditions["Progressing"]
        assert (reconciling["status"], reconciling["reason"]) == (progressing["status"], progressing["reason"])


def test_stalled_keeps_its_transition_time_while_it_stays_stalled():
    """The rule of every condition: lastTransitionTime moves only when status flips."""
    from .gitops_states import StreamRig
    rig = StreamRig()
    rig.rec()
    for attempt in range(3):
        rig.kube.set_pod_phase(f"colors-driver-{attempt}", "Failed", exit_code=3, message="SinkUnavailable")
        rig.rec()
        rig.clock.advance(11)
        rig.rec()
    stalled = next(c for c in rig.doc()["status"]["conditions"] if c["type"] == "Stalled")
    assert stalled["status"] == "True"
    rig.clock.advance(600)
    rig.rec()
    again = next(c for c in rig.doc()["status"]["conditions"] if c["type"] == "Stalled")
    assert again == stalled


# ---------------------------------------------------------------- the argocd-cm snippet in the chart README
def argocd_cm_snippet() -> dict[str, str]:
    text = (CHART / "README.md").read_text()
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "resource.customizations.health" in b]
    assert len(blocks) == 1, "the chart README has one argocd-cm snippet with the health checks"
    doc = yaml.safe_load(blocks[0])
    assert (doc["kind"], doc["metadata"]["name"]) == ("ConfigMap", "argocd-cm")
    return doc["data"]


def test_the_readme_snippet_is_the_shipped_health_checks():
    data = argocd_cm_snippet()
    assert data == {
        "resource.customizations.health.streaming.eos.dev_ExactlyOnceStream":
            (CHART / "health" / "exactlyoncestream.lua").read_text(),
        "resource.customizations.health.streaming.eos.dev_ExactlyOnceSnapshot":
            (CHART / "health" / "exactlyoncesnapshot.lua").read_text(),
    }
