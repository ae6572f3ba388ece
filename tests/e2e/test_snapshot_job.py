"""Live snapshots, pre-flight and drain against the real broker and real Spark, through the real commands."""
from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import Counter
from pathlib import Path

import pytest
import yaml

from eos_job import checkpoint
from eos_job.resolution import resolve
from eos_job.verify import audit_ids, read_committed
from examples.colors.generator import expected_ids, produce
from tests.e2e.job_runs import assert_exact, assert_ids_exact, run_config, run_job, wait_consumed

pytestmark = pytest.mark.stack


def _result(proc) -> dict:
    """The JSON result a command prints as its last stdout line."""
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"exit {proc.returncode}, no JSON on stdout:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1])


def _listing(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _state_versions(ckpt: Path) -> set[int]:
    return {v for p in (ckpt / "state").rglob("*") if (v := checkpoint.state_version(p.name)) is not None}


def _trickle(run, stop, counts: Counter, chunk: int = 40, period: float = 0.4, start_id: int = 100_000):
    """Events keep arriving in small chunks while the query runs: its batches are NOT capped by
    maxOffsetsPerTrigger, so a replay planned from what the topic holds later would cut other ranges."""
    next_id, seed = start_id, 500
    while not stop.is_set():
        seed += 1
        for color, n in produce(run.bootstrap, run.events, chunk, seed=seed, start_id=next_id).items():
            counts[color] += n
        next_id += chunk
        stop.wait(period)


@pytest.mark.soak   # make soak (overlaps the S3 test and the batch-identity restore controls); make test deselects it
def test_live_snapshots_while_running_then_restore_the_older_one(colors_run, stack_env, tmp_path):
    run = colors_run(max_offsets_per_trigger=250)
    run.setup()
    expected = Counter(produce(run.bootstrap, run.events, 1000))
    cfg = run_config(run)
    stream = json.dumps(cfg.stream.wire())
    run.start()
    stop = threading.Event()
    feeder = threading.Thread(target=_trickle, args=(run, stop, expected), daemon=True)
    feeder.start()
    taken = []
    try:
        for i in range(3):
            run.wait_for_batches(2)
            dest = tmp_path / "snapshots" / f"live-{i}"
            r = run_job(["snapshot", "take", "--checkpoint", str(run.live_checkpoint), "--dest", str(dest),
                      "--stream-json", stream, "--spec-hash", cfg.spec.spec_hash()])
            assert r.returncode == 0, r.stderr[-3000:]
            taken.append(_result(r))
        assert run.proc.poll() is None, "the query must keep running while live snapshots are taken"
        run.wait_for_batches(4)
    finally:
        stop.set()
        feeder.join(30)
    expected = dict(sorted(expected.items()))
    assert run.stop() == 0, run.log_tail()
    stopped_at = run.committed_batches()

    batches = [t["lastBatch"] for t in taken]
    assert batches == sorted(set(batches)) and batches[-1] < stopped_at, (batches, stopped_at)
    for t in taken:
        assert t["reason"] == "SnapshotTaken" and t["streamUid"] == cfg.stream.uid
        assert t["checkpointId"] == checkpoint.checkpoint_id(run.live_checkpoint)
        copied = Path(t["path"]) / "checkpoint"
        n = t["lastBatch"]
        assert checkpoint.last_committed_batch(copied) == n
        assert checkpoint.last_offsets_batch(copied) in (n, n + 1)
        assert max(_state_versions(copied)) == n + 1  # the state batch n wrote, nothing newer
        assert checkpoint.state_gaps(copied, n + 1) == []
        r = run_job(["snapshot", "inspect", "--path", t["path"]])
        assert r.returncode == 0 and _result(r)["reason"] == "SnapshotVerified" and _result(r)["lastBatch"] == n

    # Restore the OLDER live snapshot into a new checkpoint location of the same stream. The batches the
    # first run committed after it are re-run with their original offsets (from the previous checkpoint)
    # and skipped by the ledger; everything after is written on top of the restored state.
    older = taken[0]
    restored = tmp_path / "restored"
    doc = cfg.model_copy(update={"checkpoint_dir": str(restored), "restore_from": older["path"],
                                 "replay_offsets_from": str(run.live_checkpoint)})
    run.config_path.write_text(yaml.safe_dump(doc.model_dump(by_alias=True, mode="json")))
    before = len(read_committed(run.bootstrap, run.counts))
    run.start()
    run.wait_caught_up(expected)
    assert run.stop() == 0, run.log_tail()
    log = run.log_path.read_text()
    assert "seeded from snapshot" in log
    assert "2/2 slots skipped as already committed" in log  # the replays after the snapshot
    rerun = re.search(r"re-ran (\d+) batches with their original input from the ledger", log)
    assert rerun, log[-3000:]
    # Every batch the first run logged after the snapshot (the last may have been logged, not committed).
    assert int(rerun.group(1)) in (stopped_at - older["lastBatch"], stopped_at - older["lastBatch"] + 1), \
        (rerun.group(0), stopped_at, older["lastBatch"])
    assert checkpoint.checkpoint_id(restored) == older["checkpointId"]
    assert_exact(run, expected)
    assert len(read_committed(run.bootstrap, run.counts)) >= before


def test_preflight_accepts_a_compatible_spec_and_refuses_incompatible_state(colors_run, stack_env, tmp_path):
    run = colors_run(max_offsets_per_trigger=600)
    run.setup()
    produce(run.bootstrap, run.events, 2000)
    run.start()
    run.wait_for_batches(2)
    assert run.stop() == 0, run.log_tail()
    ckpt = run.live_checkpoint
    last = checkpoint.last_committed_batch(ckpt)
    files_before = _listing(ckpt)
    sink_before = len(read_committed(run.bootstrap, run.counts))
    scratch = tmp_path / "preflight-scratch"

    def preflight(change: dict) -> tuple[int, dict]:
        m = run.manifest()
        m["spec"]["job"].update(change)
        path = tmp_path / "next.yaml"
        path.write_text(yaml.safe_dump(m))
        r = run_job(["preflight", "--config", str(path), "--from-checkpoint", str(ckpt), "--scratch", str(scratch)],
                 env_extra={"EOS_TERMINATION_MESSAGE_PATH": str(tmp_path / "preflight.json")}, timeout=300)
        assert not scratch.exists(), "the scratch copy must be deleted"
        assert json.loads((tmp_path / "preflight.json").read_text()) == _result(r)
        return r.returncode, _result(r)

    code, msg = preflight({"args": {"version": "2"}})  # an output-only change: same state
    assert (code, msg["reason"], msg["batch"]) == (0, "PreFlightPassed", last), msg
    code, msg = preflight({"module": "tests.e2e.jobs.colors_incompatible"})  # an extra grouping key
    assert (code, msg["reason"], msg["batch"]) == (4, "PreFlightFailed", last), msg
    assert "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE" in msg["error"] and "key_schema" in msg["error"], msg

    assert _listing(ckpt) == files_before, "pre-flight changed the checkpoint"
    assert len(read_committed(run.bootstrap, run.counts)) == sink_before, "pre-flight wrote to the sink"


# The control in `make soak`: the same switch (ledger-skip) is turned off in `make test` by
# test_batch_identity_e2e.py (the Python writer) and tests/stack/test_broker_kill_at_commit.py.
@pytest.mark.parametrize("safety", ["on", pytest.param("off", marks=pytest.mark.soak)],
                         ids=["ledger-skip", "negative-control-without-it"])
def test_drain_finishes_exactly_the_partially_committed_batch(colors_run, stack_env, tmp_path, safety):
    """The drain of an upgrade (the old spec finishing a partial batch) on the unique-id stream. Its negative
    control drains with ``ledger-skip`` off: the slot that committed before the kill is written again, and the
    id audit must report its ids twice."""
    run = colors_run(module="examples.colors.ids", max_offsets_per_trigger=1000,
                     extra_env={"EOS_FAULT_KILL_AFTER_COMMIT": "1"})
    run.setup()
    produce(run.bootstrap, run.events, 4000, seed=17)
    expected = expected_ids(4000, 17)
    run.start()
    assert run.proc.wait(240) == -9, run.log_tail()  # killed right after the first slot of batch 0 committed
    report = resolve(run_config(run))
    assert report.replay_batch == 0 and report.replay_slots_already_committed, report.summary
    assert report.partially_committed == (len(report.replay_slots_already_committed) == 1)
    # Idempotent: a second resolution reports the same.
    assert resolve(run_config(run)).replay_slots_already_committed == report.replay_slots_already_committed
    committed = [int(m.key()) for m in read_committed(run.bootstrap, run.counts)]   # the committed slot's ids
    assert committed and len(set(committed)) == len(committed) and set(committed) <= expected

    run.extra_env = {}
    drain_env = {"EOS_TERMINATION_MESSAGE_PATH": str(tmp_path / "drain.json")}
    if safety == "off":
        drain_env["EOS_UNSAFE_DISABLE"] = "ledger-skip"
    r = run_job(["run", "--config", str(run.config_path), "--drain"], env_extra=drain_env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = _result(r)
    assert summary["reason"] == "Drained" and summary["last_committed_batch"] == 0, summary
    batch0 = audit_ids(run.bootstrap, run.counts, expected)
    if safety == "off":   # the control: the committed slot's ids written again by the drain
        assert sorted(batch0.duplicates) == sorted(committed), batch0.violations()
        return
    assert not batch0.duplicates and not batch0.unexpected, batch0.violations()
    assert json.loads((tmp_path / "drain.json").read_text()) == summary
    # Exactly the replay batch ran: committed, and no later batch even planned.
    assert checkpoint.last_committed_batch(run.live_checkpoint) == 0
    assert checkpoint.last_offsets_batch(run.live_checkpoint) == 0
    after = resolve(run_config(run))
    assert after.replay_batch is None and not after.partially_committed, after.summary
    assert after.last_complete_batch == 0
    assert after.last_committed_batch_per_slot == {"0": 0, "1": 0}

    # Nothing left to drain (EOS_DRAIN=1 this time): exits at once, without starting Spark.
    r = run_job(["run", "--config", str(run.config_path)], env_extra={**drain_env, "EOS_DRAIN": "1"})
    assert r.returncode == 0 and _result(r) == {"reason": "Drained", "last_committed_batch": 0, "batches": 0,
                                                "records": 0, "skipped_slots": 0, "dead_letters": 0,
                                                "nondeterministic_slots": 0}, r.stderr[-2000:]
    # "At once, without Spark" as behaviour, not wall time (a busy machine is slow either way): the drain found
    # nothing before the pre-flight and the session, the only place a SparkSession is built.
    assert "has no uncommitted batch; nothing to finish" in r.stderr, r.stderr[-2000:]
    assert "SparkContext" not in r.stderr and "driver epoch" not in r.stderr, r.stderr[-2000:]

    run.start()
    wait_consumed(run, run.live_checkpoint)
    assert run.stop() == 0, run.log_tail()
    assert_ids_exact(run, expected)

