"""A snapshot's Pods (take, inspect, dispose) that do not start follow the rule of every Pod of the operator
(start_failures.py): the cause in status and one event, a failed attempt at the stream's start deadline, and
a create the API server refuses written to status and an event, then retried. Over the fake API server."""
from __future__ import annotations

import asyncio
import json

import pytest

from eos_job.spec import ExactlyOnceStreamSpec
from eos_operator.reconciler import Deps
from eos_operator.snapshot_reconciler import reconcile_snapshot
from eos_operator.upgrades import spec_json

from .fakes import FakeClock, FakeKube, FakeResolver, base_spec

NS = "default"
TIMEOUT = 60     # the stream's job.driver.startTimeoutSeconds
GOOD = json.dumps({"reason": "SnapshotTaken", "path": "/tmp/eos-test/snapshots/s1", "lastBatch": 7})
CAUSES = [
    ("ErrImagePull", 'failed to pull and unpack image "registry.example/eos:missing": not found'),
    ("ImagePullBackOff", 'Back-off pulling image "registry.example/eos:missing"'),
    ("CreateContainerConfigError", 'secret "s3-keys" not found'),
    ("Unschedulable", '0/1 nodes are available: persistentvolumeclaim "missing-claim" not found'),
]


def make(*, max_retries: int = 1):
    kube, clock = FakeKube(), FakeClock()
    stream_spec = base_spec(job={"module": "m", "driver": {"startTimeoutSeconds": TIMEOUT}})
    kube.add_stream("colors", stream_spec)["status"] = {
        "checkpointDir": "/tmp/eos-test/live", "txGeneration": 0,
        "lastReconciledSpec": spec_json(ExactlyOnceStreamSpec.model_validate(stream_spec))}
    kube.add_snapshot({"apiVersion": "streaming.eos.dev/v1beta1", "kind": "ExactlyOnceSnapshot",
                       "metadata": {"name": "s1"}, "spec": {"stream": "colors", "maxRetries": max_retries}})
    return kube, clock, Deps(kube=kube, resolver=FakeResolver(), clock=clock)


def rec(deps):
    return asyncio.run(reconcile_snapshot(NS, "s1", deps))


def ready(kube) -> dict:
    return next(c for c in kube.snapshot_status("s1").get("conditions") or [] if c["type"] == "Ready")


def events(kube, reason: str) -> list[str]:
    return kube.messages_for("ExactlyOnceSnapshot", reason)


@pytest.mark.parametrize("reason,cause", CAUSES, ids=[r for r, _ in CAUSES])
def test_a_blocked_snapshot_pod_says_why_in_status_and_one_event(reason, cause):
    kube, clock, deps = make()
    rec(deps)
    assert ready(kube)["reason"] == "InProgress"
    kube.block_pod("s1-snap-1", reason, cause, created_at=clock.now())
    clock.advance(5)
    rec(deps)
    cond, st = ready(kube), kube.snapshot_status("s1")
    assert (cond["status"], cond["reason"]) == ("False", "SnapshotStartBlocked")
    assert cond["message"] == f"snapshot Pod s1-snap-1 cannot start: {reason}: {cause}"
    assert st["state"] == "InProgress" and st["message"] == cond["message"]
    [event] = events(kube, "SnapshotStartBlocked")
    assert cause in event and f"it fails after {TIMEOUT}s" in event
    clock.advance(5)
    rec(deps)
    assert len(events(kube, "SnapshotStartBlocked")) == 1          # one event per distinct cause
    kube.set_snapshot_pod("s1-snap-1", "Running")                   # fixed: it starts
    rec(deps)
    assert ready(kube)["reason"] == "InProgress"
    assert kube.snapshot_status("s1")["message"].startswith("attempt 1: copying the checkpoint of stream colors")


def test_a_snapshot_pod_not_running_by_the_deadline_is_a_failed_attempt():
    kube, clock, deps = make(max_retries=1)
    rec(deps)
    kube.block_pod("s1-snap-1", "ImagePullBackOff", 'Back-off pulling image "x"', created_at=clock.now())
    clock.advance(TIMEOUT - 1)
    rec(deps)
    assert kube.snapshot_status("s1")["state"] == "InProgress" and (NS, "s1-snap-1") in kube.pods
    clock.advance(1)
    out = rec(deps)
    st = kube.snapshot_status("s1")
    assert (st["state"], st["attempts"], "pod" in st) == ("Pending", 1, False) and out.requeue_after == 10
    assert f"Pod s1-snap-1 did not start within {TIMEOUT}s" in st["lastError"] and "ImagePullBackOff" in st["lastError"]
    assert (NS, "s1-snap-1") not in kube.pods                       # deleted, as a failed Pod is
    [failed] = events(kube, "SnapshotAttemptFailed")
    assert failed.startswith("attempt 1: Pod s1-snap-1 did not start")
    # The retry comes after the backoff; stuck as well, the retries are spent: Failed, saying why.
    clock.advance(10)
    rec(deps)
    assert kube.created_pods == ["s1-snap-1", "s1-snap-2"]
    kube.block_pod("s1-snap-2", "Unschedulable", "0/1 nodes are available", created_at=clock.now())
    clock.advance(TIMEOUT)
    rec(deps)
    st = kube.snapshot_status("s1")
    assert st["state"] == "Failed" and "Unschedulable" in st["message"]
    assert (ready(kube)["status"], ready(kube)["reason"]) == ("False", "Failed")
    assert events(kube, "SnapshotFailed") and (NS, "s1-snap-2") not in kube.pods


@pytest.mark.parametrize("code,words", [
    (403, 'pods "s1-snap-1" is forbidden: violates PodSecurity "restricted:latest": runAsNonRoot != true'),
    (422, 'Pod "s1-snap-1" is invalid: spec.containers[0].image: Required value'),
], ids=["403", "422"])
def test_a_refused_snapshot_pod_is_written_to_status_and_retried(code, words):
    kube, clock, deps = make()
    kube.fail_create_pod, kube.fail_create_status, kube.fail_create_message = 2, code, words
    out = rec(deps)                                                 # not raised (and only logged)
    cond, st = ready(kube), kube.snapshot_status("s1")
    assert (cond["status"], cond["reason"]) == ("False", "Refused")
    assert "Pod s1-snap-1 was refused" in cond["message"] and words in cond["message"]
    assert words in st["lastError"] and (st["state"], st["attempts"]) == ("InProgress", 1)
    assert events(kube, "Refused") == [cond["message"]]
    assert out.requeue_after == 30 and kube.created_pods == []
    clock.advance(10)
    rec(deps)                                                       # within the pause: no create
    assert kube.fail_create_pod == 1
    clock.advance(21)
    rec(deps)                                                       # refused again, alike: no second event
    assert kube.fail_create_pod == 0 and len(events(kube, "Refused")) == 1
    clock.advance(31)
    rec(deps)
    assert kube.created_pods == ["s1-snap-1"] and kube.snapshot_status("s1")["attempts"] == 1   # the same attempt
    rec(deps)
    assert ready(kube)["reason"] == "InProgress"


def test_a_dispose_pod_that_does_not_start_says_why_and_fails_at_the_deadline():
    kube, clock, deps = make()
    rec(deps)
    kube.set_snapshot_pod("s1-snap-1", "Succeeded", message=GOOD)
    rec(deps)
    asyncio.run(kube.delete_snapshot(NS, "s1"))
    rec(deps)
    assert kube.created_pods[-1] == "s1-dispose-0"
    kube.block_pod("s1-dispose-0", "ErrImagePull", "manifest unknown", created_at=clock.now())
    clock.advance(5)
    assert not rec(deps).finished
    assert ready(kube)["reason"] == "SnapshotStartBlocked"
    assert ready(kube)["message"] == "dispose Pod s1-dispose-0 cannot start: ErrImagePull: manifest unknown"
    assert len(events(kube, "SnapshotStartBlocked")) == 1
    clock.advance(TIMEOUT)
    assert not rec(deps).finished
    assert kube.created_pods[-1] == "s1-dispose-1" and (NS, "s1-dispose-0") in kube.pods   # kept as the record
    [retry] = events(kube, "SnapshotDisposeRetry")
    assert "Pod s1-dispose-0 did not start within" in retry and "1 of 5 failed" in retry


def test_a_refused_dispose_pod_is_written_to_status_and_retried():
    kube, clock, deps = make()
    rec(deps)
    kube.set_snapshot_pod("s1-snap-1", "Succeeded", message=GOOD)
    rec(deps)
    asyncio.run(kube.delete_snapshot(NS, "s1"))
    kube.fail_create_pod, kube.fail_create_status = 1, 403
    kube.fail_create_message = 'pods "s1-dispose-0" is forbidden: exceeded quota: pods'
    out = rec(deps)
    assert not out.finished and out.requeue_after == 30
    assert ready(kube)["reason"] == "Refused" and "exceeded quota" in ready(kube)["message"]
    assert len(events(kube, "Refused")) == 1 and kube.created_pods == ["s1-snap-1"]
    clock.advance(10)
    rec(deps)
    assert kube.created_pods == ["s1-snap-1"]                       # waits out the pause
    clock.advance(21)
    assert not rec(deps).finished and kube.created_pods[-1] == "s1-dispose-0"
