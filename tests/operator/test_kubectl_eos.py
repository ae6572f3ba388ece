"""``kubectl eos`` against a fake API: what it prints, what it patches, its exit codes."""
from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from eos_operator import kubectl_eos
from eos_operator.kubectl_eos import EXIT_NOT_FOUND, EXIT_NOT_READY, EXIT_OK, EXIT_TIMEOUT, NotFound, main

pytestmark = pytest.mark.unit
NOW = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc)


def stream(name="colors", ready="True", **status) -> dict:
    return {"metadata": {"name": name, "namespace": "team", "creationTimestamp": "2026-11-25T11:00:00Z"},
            "spec": {"job": {"deployMode": "cluster"}, "restartNonce": 2, "snapshotNonce": 0},
            "status": {"lifecycleState": "Running", "driverPod": f"{name}-driver-3", "driverAttempt": 3,
                       "lastCommittedBatch": 41, "restartCount": 1,
                       "conditions": [{"type": "Ready", "status": ready, "reason": "Running", "message": "ok"}],
                       "resolution": {"summary": "fenced 4 ids; checkpoint committed batch 40"},
                       "replayHorizon": {"state": "Safe", "batch": 41, "checkedAt": "2026-11-25T11:59:00Z",
                                         "backlogRecords": 12, "lostRecords": 0,
                                         "lag": [{"topic": "events", "partition": 3, "records": 9},
                                                 {"topic": "events", "partition": 0, "records": 3}]}, **status}}


class FakeApi:
    default_namespace = "team"

    def __init__(self, streams=(), snapshots=(), events=(), snapshot_states=()):
        self.objs = {s["metadata"]["name"]: s for s in streams}
        self.snaps, self.evts, self.patches = list(snapshots), list(events), []
        self.states = list(snapshot_states)

    def stream(self, ns, name):
        if name not in self.objs:
            raise NotFound(f"exactlyoncestream {ns}/{name}")
        return self.objs[name]

    def streams(self, ns):
        return list(self.objs.values())

    def snapshots(self, ns, stream):
        return [s for s in self.snaps if stream is None or s["spec"]["stream"] == stream]

    def snapshot(self, ns, name):
        if self.states:
            state = self.states.pop(0)
            if state is None:
                raise NotFound(name)
            return {"metadata": {"name": name}, "spec": {"stream": "colors"}, "status": {"state": state, "batch": 41}}
        if not any(s["metadata"]["name"] == name for s in self.snaps):
            raise NotFound(f"exactlyoncesnapshot {ns}/{name}")
        return next(s for s in self.snaps if s["metadata"]["name"] == name)

    def patch_spec(self, ns, name, patch):
        self.stream(ns, name)
        self.patches.append((name, patch))
        return {}

    def events(self, ns, name):
        return self.evts


def run(api, *argv) -> int:
    return main(list(argv), api=api, now=lambda: NOW, sleep=lambda s: None)


def test_status_shows_what_an_operator_needs_and_exits_by_readiness(capsys):
    snap = {"metadata": {"name": "colors-n1", "creationTimestamp": "2026-11-25T11:30:00Z"},
            "spec": {"stream": "colors", "trigger": "nonce"}, "status": {"state": "Completed", "batch": 30}}
    api = FakeApi([stream()], [snap])
    assert run(api, "status", "colors") == EXIT_OK
    out = capsys.readouterr().out
    for text in ("team/colors", "Running", "colors-driver-3 (attempt 3, cluster mode)", "41 committed",
                 "Ready=True Running: ok", "fenced 4 ids", "Replay horizon: Safe after batch 41", "backlog 12",
                 "colors-n1", "Completed", "Lag per source partition", "events/3    9", "events/0    3"):
        assert text in out, (text, out)
    api = FakeApi([stream(ready="False")])
    assert run(api, "status", "colors") == EXIT_NOT_READY
    capsys.readouterr()
    assert run(api, "-o", "json", "status", "colors") == EXIT_NOT_READY
    assert json.loads(capsys.readouterr().out)["status"]["lastCommittedBatch"] == 41


def test_json_output_is_the_object_and_missing_streams_exit_3(capsys):
    api = FakeApi([stream()])
    assert run(api, "-o", "json", "list") == EXIT_OK
    assert json.loads(capsys.readouterr().out)["items"][0]["metadata"]["name"] == "colors"
    assert run(api, "status", "nope") == EXIT_NOT_FOUND
    assert "exactlyoncestream team/nope not found" in capsys.readouterr().err
    assert run(api, "restore", "colors", "--from", "missing-snap") == EXIT_NOT_FOUND and api.patches == []


def test_list_is_a_table(capsys):
    assert run(FakeApi([stream(), stream("orders", ready="False")]), "list") == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "STATE", "READY", "REASON", "LAST", "BATCH", "RESTARTS", "DRIVER", "AGE"]
    assert lines[1].split()[:3] == ["colors", "Running", "True"] and lines[1].split()[-1] == "1h"


def test_suspend_resume_restart_restore_patch_the_spec():
    api = FakeApi([stream()], [{"metadata": {"name": "colors-n1"}, "spec": {"stream": "colors"}}])
    for argv in (["suspend", "colors"], ["resume", "colors"], ["restart", "colors"],
                 ["restore", "colors", "--from", "colors-n1"], ["restore", "colors", "--from", "s3a://b/p/s1"]):
        assert run(api, *argv) == EXIT_OK
    assert [p for _, p in api.patches] == [{"job": {"state": "suspended"}}, {"job": {"state": "running"}},
                                           {"restartNonce": 3}, {"restoreFrom": "colors-n1"},
                                           {"restoreFrom": "s3a://b/p/s1"}]


def test_snapshot_sets_the_nonce_and_waits_with_progress(capsys):
    api = FakeApi([stream()], snapshot_states=[None, "Pending", "InProgress", "InProgress", "Completed"])
    assert run(api, "snapshot", "colors") == EXIT_OK
    assert api.patches == [("colors", {"snapshotNonce": 1})]
    out = capsys.readouterr().out
    assert [line.strip() for line in out.splitlines() if line.startswith("  colors-n1:")] == [
        "colors-n1: Requested", "colors-n1: Pending", "colors-n1: InProgress", "colors-n1: Completed"]
    assert run(FakeApi([stream()], snapshot_states=["Failed"]), "snapshot", "colors") == EXIT_NOT_READY
    slow = FakeApi([stream()], snapshot_states=["Pending"] * 10)
    assert run(slow, "snapshot", "colors", "--timeout", "3") == EXIT_TIMEOUT


def test_events_oldest_first(capsys):
    events = [{"metadata": {"creationTimestamp": "2026-11-25T11:02:00Z"}, "type": "Normal", "reason": "Submitted",
               "message": "b"},
              {"metadata": {"creationTimestamp": "2026-11-25T11:01:00Z"}, "type": "Normal", "reason": "Resolved",
               "message": "a", "count": 2}]
    assert run(FakeApi([stream()], events=events), "events", "colors") == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert "Resolved" in lines[1] and " 2 " in lines[1] and "Submitted" in lines[2]


def test_the_entry_point_is_installed_for_kubectl():
    import tomllib
    from pathlib import Path
    scripts = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kubectl-eos"] == "eos_operator.kubectl_eos:main" and kubectl_eos.main


def test_resolve_dry_run_shows_the_last_resolution(capsys):
    res = {"summary": "s", "generation": 1, "slots": 2, "fencedTransactionalIds": 4, "checkpointId": "q",
           "checkpointLastOffsetsBatch": 9, "checkpointLastCommittedBatch": 8, "lastCompleteBatch": 8,
           "lastCommittedBatchPerSlot": {"1": 9, "0": 8}, "replayBatch": 9, "replaySlotsAlreadyCommitted": [1],
           "partiallyCommitted": True}
    api = FakeApi([stream(resolution=res)])
    assert run(api, "resolve", "colors", "--dry-run") == EXIT_OK
    out = capsys.readouterr().out
    for text in ("generation 1, 2 slots, 4 transactional ids fenced", "offsets through batch 9, committed through 8",
                 "per slot 0=8, 1=9", "replays batch 9, skipping slots [1]", "PARTIALLY"):
        assert text in out, (text, out)
    assert run(api, "resolve", "colors") == 2 and "kubectl eos restart colors" in capsys.readouterr().err
    assert run(FakeApi([stream(resolution=None)]), "resolve", "colors", "--dry-run") == EXIT_NOT_READY


def test_verify_refuses_a_stream_that_writes_no_audit_headers(capsys):
    s = stream()
    s["spec"] = {"job": {"module": "examples.colors.job"},
                 "source": {"bootstrapServers": "k:9092", "topics": ["events"]},
                 "sink": {"bootstrapServers": "k:9092", "topic": "counts", "auditHeaders": False},
                 "checkpoint": {"store": "s3", "path": "/ckpt", "s3": {"bucket": "eos"}}}
    assert run(FakeApi([s]), "verify", "colors") == 4          # before any Kafka client is made
    err = capsys.readouterr().err
    assert "spec.sink.auditHeaders: false" in err and "set spec.sink.auditHeaders to true" in err, err
