"""Cutting a checkpoint for a snapshot or a pre-flight, on fake checkpoint trees laid out as Spark 4.2 writes them.

No Spark here: the trees mimic what a colors job's checkpoint holds (see
eos_job.checkpoint), including checksum files, temporary files of a write in
progress and state snapshots written by the maintenance thread.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from eos_job import checkpoint, cli
from eos_job.checkpoint import Cut
from eos_job.preflight import SCRATCH_MARK, _prepare_scratch, run_preflight
from eos_job.snapshot import (MANIFEST, NothingToSnapshot, NotASnapshot, SnapshotError, copy_cut, dispose_snapshot,
                              restore_snapshot, take_live_snapshot, take_snapshot, verify_snapshot)
from eos_job.spec import load_run_config

STREAM = {"name": "colors", "namespace": "ns", "uid": "u-1", "generation": 0}
QUERY_ID = "0cc63f01-0f6a-4341-9c0b-df83a7492e11"


def _write(path: Path, text: str, crc: bool = True) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if crc:
        (path.parent / f".{path.name}.crc").write_text("crc")


def log_offsets(ckpt: Path, batch: int) -> None:
    _write(ckpt / "offsets" / str(batch),
           f'v1\n{{"batchWatermarkMs":0,"batchTimestampMs":{1000 + batch}}}\n{{"events":{{"0":{batch * 10 + 10}}}}}\n')


def commit(ckpt: Path, batch: int) -> None:
    _write(ckpt / "commits" / str(batch), 'v1\n{"nextBatchWatermarkMs":0}\n')


def write_state(ckpt: Path, version: int, kind: str = "delta", parts: int = 2) -> None:
    for p in range(parts):
        _write(ckpt / "state" / "0" / str(p) / f"{version}.{kind}", f"state {version}")


def fake_checkpoint(ckpt: Path, committed: int, logged: int | None = None, parts: int = 2) -> Path:
    """Batches 0..committed done; offsets logged through ``logged`` (default: committed); state as Spark writes it.

    A batch's state version (batch + 1) is written before its commit, so a batch that is logged but not
    committed may or may not have written its state: here it has (the worst case for a cut).
    """
    logged = committed if logged is None else logged
    _write(ckpt / "metadata", json.dumps({"id": QUERY_ID}) + "\n")
    _write(ckpt / "sources" / "0" / "0", 'v1\n{"events":{"0":0}}\n')
    _write(ckpt / "state" / "0" / "_metadata" / "metadata", "v1\n{}\n")
    for p in range(parts):
        _write(ckpt / "state" / "0" / str(p) / "_metadata" / "schema", "schema")
    for b in range(logged + 1):
        log_offsets(ckpt, b)
        write_state(ckpt, b + 1, parts=parts)
        if b <= committed:
            commit(ckpt, b)
    # A write in progress: Spark writes to a hidden temporary name, then renames.
    (ckpt / "offsets" / f".{logged + 1}.5d1c6b0e-aaaa.tmp").write_text("half")
    (ckpt / "offsets" / f"..{logged + 1}.5d1c6b0e-aaaa.tmp.crc").write_text("half")
    (ckpt / "state" / "0" / "0" / f".{logged + 2}.delta.6e2f-bbbb.TID17.tmp").write_text("half")
    return ckpt


def files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def log_files(folder: str, batches) -> set[str]:
    return {f"{folder}/{b}" for b in batches} | {f"{folder}/.{b}.crc" for b in batches}


def state_files(versions, parts: int = 2, kind: str = "delta") -> set[str]:
    return {f"state/0/{p}/{v}.{kind}" for p in range(parts) for v in versions} | \
           {f"state/0/{p}/.{v}.{kind}.crc" for p in range(parts) for v in versions}


FIXED = {"metadata", ".metadata.crc", "sources/0/0", "sources/0/.0.crc", "state/0/_metadata/metadata",
         "state/0/_metadata/.metadata.crc", "state/0/0/_metadata/schema", "state/0/0/_metadata/.schema.crc",
         "state/0/1/_metadata/schema", "state/0/1/_metadata/.schema.crc"}


# ------------------------------------------------------------------------------------ the cut itself
def test_live_cut_is_batch_n_plus_the_logged_next_offsets(tmp_path):
    ckpt = fake_checkpoint(tmp_path / "c", committed=5, logged=7)  # 6 and 7 logged, not committed
    (ckpt / "notes.txt").write_text("unknown files outside the logs and state are copied as is")
    copy_cut(ckpt, tmp_path / "out", Cut.after_batch(5))
    assert files(tmp_path / "out") == FIXED | {"notes.txt"} | log_files("offsets", range(7)) | \
        log_files("commits", range(6)) | state_files(range(1, 7))


def test_cut_without_a_logged_next_batch_and_with_maintenance_snapshots(tmp_path):
    ckpt = fake_checkpoint(tmp_path / "c", committed=5)
    write_state(ckpt, 4, "snapshot")  # maintenance wrote snapshot 4 ...
    write_state(ckpt, 7, "snapshot")  # ... and one too new for the cut (cannot happen, but must not leak)
    for v in (1, 2, 3):  # ... then deleted the deltas it no longer needs
        for p in range(2):
            (ckpt / "state/0" / str(p) / f"{v}.delta").unlink()
            (ckpt / "state/0" / str(p) / f".{v}.delta.crc").unlink()
    copy_cut(ckpt, tmp_path / "out", Cut.after_batch(5))
    assert files(tmp_path / "out") == FIXED | log_files("offsets", range(6)) | log_files("commits", range(6)) | \
        state_files(range(4, 7)) | state_files([4], kind="snapshot")
    assert checkpoint.state_gaps(tmp_path / "out", 6) == []


def test_preflight_cut_makes_the_last_committed_batch_the_replay_batch(tmp_path):
    ckpt = fake_checkpoint(tmp_path / "c", committed=5, logged=6)
    copy_cut(ckpt, tmp_path / "out", Cut.replaying_batch(5))
    out = tmp_path / "out"
    assert files(out) == FIXED | log_files("offsets", range(6)) | log_files("commits", range(5)) | \
        state_files(range(1, 6))
    assert checkpoint.replay_batch(out) == 5
    assert checkpoint.last_committed_batch(out) == 4


def test_preflight_cut_of_batch_0_keeps_the_schema_but_no_state(tmp_path):
    ckpt = fake_checkpoint(tmp_path / "c", committed=0)
    copy_cut(ckpt, tmp_path / "out", Cut.replaying_batch(0))
    assert files(tmp_path / "out") == FIXED | log_files("offsets", [0])
    assert checkpoint.replay_batch(tmp_path / "out") == 0


def test_file_names_spark_and_rocksdb_use():
    assert [checkpoint.state_version(n) for n in ("12.delta", ".12.delta.crc", "12.snapshot", "12.changelog",
                                                  "12.zip", "12_3f2a-77.zip", "schema", "000123-ab.sst")] == \
        [12, 12, 12, 12, 12, 12, None, None]
    assert [checkpoint.log_batch(n) for n in ("7", ".7.crc", "7.compact", "x")] == [7, 7, None, None]
    assert checkpoint.is_temporary(".8.5d1c.tmp") and checkpoint.is_temporary("..8.5d1c.tmp.crc")
    assert not checkpoint.is_temporary("8")


def test_torn_log_writes_of_a_killed_driver_are_discarded_and_nothing_else(tmp_path):
    ckpt = fake_checkpoint(tmp_path / "c", committed=2)
    planted = {"offsets/.4.9b80.tmp", "offsets/..4.9b80.tmp.crc", "commits/.2.77aa.tmp"}
    for name in planted:
        (ckpt / name).write_text("v1\n{")
    # fake_checkpoint's own torn offsets/.3 write goes too; its state temporary is not a log and stays
    torn = planted | {"offsets/.3.5d1c6b0e-aaaa.tmp", "offsets/..3.5d1c6b0e-aaaa.tmp.crc"}
    before = files(ckpt)
    assert set(checkpoint.discard_torn_log_writes(ckpt)) == torn
    assert files(ckpt) == before - torn
    assert checkpoint.discard_torn_log_writes(ckpt) == []
    assert checkpoint.discard_torn_log_writes(tmp_path / "absent") == []


def test_state_gaps_names_the_missing_delta(tmp_path):
    ckpt = fake_checkpoint(tmp_path / "c", committed=5)
    (ckpt / "state/0/1/3.delta").unlink()
    gaps = checkpoint.state_gaps(ckpt, 6)
    assert len(gaps) == 1 and "state/0/1" in gaps[0] and "missing [3]" in gaps[0]
    assert checkpoint.state_gaps(ckpt, 2) == []  # version 2 does not need delta 3


# --------------------------------------------------------------------------- races with the live query
def test_a_file_vanishing_mid_copy_makes_the_cut_be_copied_again(tmp_path):
    ckpt = fake_checkpoint(tmp_path / "c", committed=5)
    write_state(ckpt, 4, "snapshot")
    attempts = []

    def maintenance(rel):
        if rel.as_posix() == "commits/0":
            attempts.append(1)
        # During the first copy, after the listing: the maintenance thread deletes the deltas
        # that snapshot 4 made obsolete.
        if len(attempts) == 1 and rel.as_posix() == "offsets/0":
            for v in (1, 2):
                for p in range(2):
                    (ckpt / f"state/0/{p}/{v}.delta").unlink()

    manifest = take_live_snapshot(ckpt, tmp_path / "snap", stream=STREAM, on_file=maintenance)
    assert len(attempts) == 2
    copied = tmp_path / "snap" / "checkpoint"
    assert manifest["lastBatch"] == 5
    assert not (copied / "state/0/0/1.delta").exists() and (copied / "state/0/0/4.snapshot").exists()
    assert checkpoint.state_gaps(copied, 6) == []
    assert files(copied) == files(ckpt) - {f for f in files(ckpt) if ".tmp" in f}
    assert not (tmp_path / "snap.partial").exists()


def test_state_deleted_faster_than_it_can_be_copied_fails_clearly(tmp_path, monkeypatch):
    monkeypatch.setattr("eos_job.snapshot.RETRY_DELAY_S", 0.0)
    ckpt = fake_checkpoint(tmp_path / "c", committed=5)

    def delete_a_needed_delta(rel):
        if rel.as_posix() == "commits/0":
            victim = ckpt / "state/0/0/2.delta"
            if victim.exists():
                victim.unlink()

    with pytest.raises(SnapshotError,
                       match=r"could not copy a consistent cut.*in 5 attempts: state/0/0.*missing \[2\]"):
        take_live_snapshot(ckpt, tmp_path / "snap", stream=STREAM, on_file=delete_a_needed_delta)
    assert not (tmp_path / "snap").exists() and not (tmp_path / "snap.partial").exists()


def test_a_batch_committed_during_the_copy_does_not_leak_into_the_cut(tmp_path):
    ckpt = fake_checkpoint(tmp_path / "c", committed=5)
    before = files(ckpt)

    def query_runs_on(rel):
        if rel.as_posix() == ".metadata.crc" and not (ckpt / "commits" / "7").exists():
            # Batches 6 and 7 run to their commits, and 8 is logged, while the copy is under way.
            for b in (6, 7):
                log_offsets(ckpt, b)
                write_state(ckpt, b + 1)
                commit(ckpt, b)
            log_offsets(ckpt, 8)
            write_state(ckpt, 9)

    manifest = take_live_snapshot(ckpt, tmp_path / "snap", stream=STREAM, spec_hash="h", on_file=query_runs_on)
    copied = tmp_path / "snap" / "checkpoint"
    assert manifest["lastBatch"] == 5 and manifest["kind"] == "live"
    # offsets/6 appeared after the copy started: immutable once written, and kept so a restore re-runs
    # batch 6 on the range the sink may already hold. Nothing else of batches 6..8.
    assert files(copied) == {f for f in before if ".tmp" not in f} | log_files("offsets", [6])
    assert checkpoint.last_committed_batch(copied) == 5 and checkpoint.replay_batch(copied) == 6
    assert manifest["sourceOffsets"] == {"source0": {"events": {"0": 60}}}


def test_restoring_a_live_snapshot_replays_the_next_batch(tmp_path):
    ckpt = fake_checkpoint(tmp_path / "c", committed=3, logged=4)
    manifest = take_live_snapshot(ckpt, tmp_path / "snap", stream=STREAM, spec_hash="h")
    assert set(manifest) == {"kind", "stream", "lastBatch", "checkpointId", "sourceOffsets", "ledgerPositions",
                             "specHash", "sparkVersion", "projectVersion", "time", "sizeBytes"}
    assert manifest["checkpointId"] == QUERY_ID and manifest["stream"] == STREAM
    assert manifest["sizeBytes"] == sum((tmp_path / "snap/checkpoint" / f).stat().st_size
                                        for f in files(tmp_path / "snap/checkpoint"))
    restore_snapshot(tmp_path / "snap", tmp_path / "restored")
    assert checkpoint.checkpoint_id(tmp_path / "restored") == QUERY_ID
    assert checkpoint.last_committed_batch(tmp_path / "restored") == 3
    assert checkpoint.replay_batch(tmp_path / "restored") == 4


def test_snapshot_on_stop_shares_the_cut(tmp_path):
    ckpt = fake_checkpoint(tmp_path / "c", committed=2, logged=3)
    manifest = take_snapshot(ckpt, tmp_path / "snap", stream=STREAM, spec_hash="h")
    assert manifest["kind"] == "stop" and manifest["lastBatch"] == 2
    assert files(tmp_path / "snap/checkpoint") == FIXED | log_files("offsets", range(4)) | \
        log_files("commits", range(3)) | state_files(range(1, 4))
    with pytest.raises(FileExistsError, match="never overwritten"):
        take_snapshot(ckpt, tmp_path / "snap", stream=STREAM, spec_hash="h")


def test_no_committed_batch_means_nothing_to_snapshot(tmp_path):
    ckpt = tmp_path / "c"
    _write(ckpt / "metadata", json.dumps({"id": QUERY_ID}))
    log_offsets(ckpt, 0)
    with pytest.raises(NothingToSnapshot, match=f"checkpoint {ckpt} has no committed batch yet: nothing to "
                                                "snapshot; retry after the first batch"):
        take_live_snapshot(ckpt, tmp_path / "snap", stream=STREAM)
    assert not (tmp_path / "snap").exists()


# ------------------------------------------------------------------------------------ the commands
@pytest.fixture
def termination(tmp_path, monkeypatch):
    path = tmp_path / "termination-log"
    monkeypatch.setenv("EOS_TERMINATION_MESSAGE_PATH", str(path))
    return path


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_take_command_writes_the_termination_message(tmp_path, termination, capsys):
    ckpt = fake_checkpoint(tmp_path / "c", committed=4)
    dest = tmp_path / "snaps" / "s1"
    args = ["snapshot", "take", "--checkpoint", str(ckpt), "--dest", str(dest), "--stream-json", json.dumps(STREAM),
            "--spec-hash", "abc"]
    assert cli.main(args) == 0
    msg = _last_json(capsys.readouterr().out)
    assert msg == json.loads(termination.read_text())
    assert set(msg) == {"reason", "path", "lastBatch", "checkpointId", "streamUid", "time", "sizeBytes", "specHash",
                        "kind"}
    assert (msg["reason"], msg["path"], msg["lastBatch"], msg["checkpointId"], msg["streamUid"], msg["specHash"]) == \
        ("SnapshotTaken", str(dest), 4, QUERY_ID, "u-1", "abc")
    # The same command again (its Pod was re-run): the snapshot is reported, not overwritten.
    mtime = (dest / MANIFEST).stat().st_mtime_ns
    assert cli.main(args) == 0
    again = _last_json(capsys.readouterr().out)
    assert again["reason"] == "SnapshotTaken" and "exists already" in again["message"]
    assert (dest / MANIFEST).stat().st_mtime_ns == mtime
    # Another stream's destination is never overwritten.
    other = json.dumps({**STREAM, "uid": "u-2"})
    assert cli.main(args[:-3] + [other]) == 1
    assert "never overwritten" in _last_json(capsys.readouterr().out)["error"]


def test_take_command_exit_codes(tmp_path, termination, capsys):
    empty = tmp_path / "c"
    _write(empty / "metadata", json.dumps({"id": QUERY_ID}))
    args = ["snapshot", "take", "--checkpoint", str(empty), "--dest", str(tmp_path / "s"), "--stream-json"]
    assert cli.main(args + [json.dumps(STREAM)]) == 5
    msg = json.loads(termination.read_text())
    assert msg["reason"] == "NothingToSnapshot"
    assert msg["message"] == (f"checkpoint {empty} has no committed batch yet: nothing to snapshot; "
                              "retry after the first batch")
    assert cli.main(args + ['{"name": "x"}']) == 2  # no uid
    assert "--stream-json" in _last_json(capsys.readouterr().out)["error"]


def test_inspect_reads_and_checks_the_manifest(tmp_path, termination, capsys):
    ckpt = fake_checkpoint(tmp_path / "c", committed=3)
    take_live_snapshot(ckpt, tmp_path / "snap", stream=STREAM, spec_hash="h")
    assert cli.main(["snapshot", "inspect", "--path", str(tmp_path / "snap")]) == 0
    msg = json.loads(termination.read_text())
    assert (msg["reason"], msg["lastBatch"], msg["streamUid"], msg["checkpointId"]) == \
        ("SnapshotVerified", 3, "u-1", QUERY_ID)

    plain = tmp_path / "plain"
    plain.mkdir()
    assert cli.main(["snapshot", "inspect", "--path", str(plain)]) == 6
    assert json.loads(termination.read_text())["error"] == f"not a snapshot: {plain} has no eos-snapshot.json"
    (tmp_path / "snap/checkpoint/commits/3").unlink()
    (tmp_path / "snap/checkpoint/state/0/1/2.delta").unlink()
    assert cli.main(["snapshot", "inspect", "--path", str(tmp_path / "snap")]) == 6
    error = json.loads(termination.read_text())["error"]
    assert "is damaged" in error and "last commit is 2, the manifest says 3" in error and "missing [2]" in error
    with pytest.raises(NotASnapshot):
        verify_snapshot(tmp_path / "snap")


def test_dispose_deletes_only_snapshots_and_is_idempotent(tmp_path, termination, capsys):
    ckpt = fake_checkpoint(tmp_path / "c", committed=1)
    # A checkpoint, or anything without a manifest, is never deleted.
    assert cli.main(["snapshot", "dispose", "--path", str(ckpt)]) == 6
    assert json.loads(termination.read_text())["reason"] == "NotASnapshot"
    assert (ckpt / "commits" / "1").exists()

    snap = tmp_path / "snap"
    take_live_snapshot(ckpt, snap, stream=STREAM)
    assert cli.main(["snapshot", "dispose", "--path", str(snap)]) == 0
    msg = json.loads(termination.read_text())
    assert (msg["reason"], msg["lastBatch"], msg["streamUid"]) == ("SnapshotDisposed", 1, "u-1")
    assert not snap.exists()
    assert cli.main(["snapshot", "dispose", "--path", str(snap)]) == 0  # gone already: success
    assert "nothing to delete" in json.loads(termination.read_text())["message"]
    # A dispose killed mid-delete leaves the renamed remains; the next one removes them.
    take_live_snapshot(ckpt, snap, stream=STREAM)
    snap.rename(tmp_path / "snap.disposing")
    assert dispose_snapshot(snap) is None and not (tmp_path / "snap.disposing").exists()
    assert ckpt.exists()


# ---------------------------------------------------------------------------------- pre-flight edges
def _config_file(tmp_path: Path, ckpt: Path) -> Path:
    doc = {"apiVersion": "streaming.eos.dev/v1beta1", "kind": "ExactlyOnceStream",
           "metadata": {"name": "colors", "namespace": "ns"},
           "spec": {"job": {"module": "examples.colors.job"}, "source": {"bootstrapServers": "b:1", "topics": ["e"]},
                    "sink": {"bootstrapServers": "b:1", "topic": "out"},
                    "checkpoint": {"store": "local", "path": str(ckpt.parent)}}}
    path = tmp_path / "stream.json"
    path.write_text(json.dumps(doc))
    return path


def test_preflight_without_state_passes_without_starting_spark(tmp_path, termination, capsys):
    ckpt = tmp_path / "live"
    _write(ckpt / "metadata", json.dumps({"id": QUERY_ID}))   # started, no batch planned yet
    # (a batch logged but not committed is checked like a committed one: its state schema may exist)
    scratch = tmp_path / "scratch"
    cfg = _config_file(tmp_path, ckpt)
    code = cli.main(["preflight", "--config", str(cfg), "--from-checkpoint", str(ckpt), "--scratch", str(scratch)])
    assert code == 0
    msg = json.loads(termination.read_text())
    assert msg["reason"] == "PreFlightPassed" and "no state yet" in msg["message"] and "batch" not in msg
    assert not scratch.exists()
    result = run_preflight(load_run_config(json.loads(cfg.read_text())), tmp_path / "missing", scratch)
    assert result.passed and "no state yet" in result.message


def test_preflight_never_deletes_a_directory_it_did_not_make(tmp_path):
    ckpt = fake_checkpoint(tmp_path / "c", committed=1)
    with pytest.raises(ValueError, match="overlaps"):
        _prepare_scratch(ckpt / "scratch", ckpt)
    with pytest.raises(ValueError, match="overlaps"):
        _prepare_scratch(ckpt, ckpt)
    foreign = tmp_path / "data"
    (foreign / "keep").mkdir(parents=True)
    with pytest.raises(ValueError, match="not a pre-flight scratch"):
        _prepare_scratch(foreign, ckpt)
    assert (foreign / "keep").exists()
    leftover = tmp_path / "scratch"
    (leftover / "checkpoint").mkdir(parents=True)
    (leftover / SCRATCH_MARK).write_text("")
    _prepare_scratch(leftover, ckpt)  # a crashed pre-flight's scratch is reused
    assert files(leftover) == {SCRATCH_MARK}


def test_preflight_of_a_module_that_does_not_import_fails_before_spark(tmp_path, termination, capsys):
    ckpt = fake_checkpoint(tmp_path / "live", committed=2)
    cfg = _config_file(tmp_path, ckpt)
    doc = json.loads(cfg.read_text())
    doc["spec"]["job"]["module"] = "tests.e2e.jobs.no_such_module"
    cfg.write_text(json.dumps(doc))
    code = cli.main(["preflight", "--config", str(cfg), "--from-checkpoint", str(ckpt),
                     "--scratch", str(tmp_path / "scratch")])
    assert code == 4
    msg = json.loads(termination.read_text())
    assert msg["reason"] == "PreFlightFailed" and msg["batch"] == 2
    assert "job.module: cannot import 'tests.e2e.jobs.no_such_module'" in msg["error"]
    assert not (tmp_path / "scratch").exists()


def test_dispose_removes_what_an_interrupted_take_left_and_refuses_what_is_not_a_snapshot(tmp_path):
    partial = tmp_path / "s1.partial" / "checkpoint" / "offsets"
    partial.mkdir(parents=True)
    (partial / "0").write_text("v1\n")
    assert dispose_snapshot(tmp_path / "s1") is None                     # never written: only leftovers
    assert not (tmp_path / "s1.partial").exists()
    (tmp_path / "s2" / "checkpoint").mkdir(parents=True)
    (tmp_path / "s2" / MANIFEST).write_text('{"kind": "snapshot", "lastBatch": 3}')
    (tmp_path / "s2.partial").mkdir()
    assert dispose_snapshot(tmp_path / "s2")["lastBatch"] == 3
    assert not (tmp_path / "s2").exists() and not (tmp_path / "s2.partial").exists()
    (tmp_path / "data").mkdir()
    with pytest.raises(NotASnapshot):
        dispose_snapshot(tmp_path / "data")
    assert (tmp_path / "data").is_dir()


def test_a_location_still_being_seeded_is_not_snapshotted(tmp_path):
    """A restore copies the snapshot's metadata file last (restore_snapshot). A live snapshot taken of the new
    location before that (on S3 the copy takes seconds; a periodic snapshot raced it in the lifecycle chaos on
    the real nodes) would hold batches without the metadata Spark needs, and a restore of it never started:
    the location is refused until its metadata is there, and a copy without it is never a snapshot."""
    seeding = fake_checkpoint(tmp_path / "seeding", committed=3)
    (seeding / "metadata").unlink()          # the seed's logs are copied, its metadata not yet
    with pytest.raises(NothingToSnapshot, match="no metadata file yet"):
        take_live_snapshot(seeding, tmp_path / "snap", stream=STREAM)
    assert not (tmp_path / "snap").exists() and not (tmp_path / "snap.partial").exists()
    with pytest.raises(SnapshotError, match="no metadata file"):
        take_snapshot(seeding, tmp_path / "stop-snap", stream=STREAM, spec_hash="h")
    assert not (tmp_path / "stop-snap").exists() and not (tmp_path / "stop-snap.partial").exists()
    # Once the metadata is there, the same location is snapshotted as usual.
    fake_checkpoint(seeding, committed=3)
    assert take_live_snapshot(seeding, tmp_path / "snap", stream=STREAM)["checkpointId"] == QUERY_ID
