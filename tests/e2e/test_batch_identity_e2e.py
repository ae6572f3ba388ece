"""A batch is its input, not its number: a restore of an older snapshot of the same stream, with nothing
telling the driver where the stream ran before (no replayOffsetsFrom), on the unique-id stream.

The first run commits small batches while events trickle in; a live snapshot is taken after a few of them;
the run goes on for several more batches and stops; more events arrive. The restored driver's checkpoint is
then behind the ledger: planned again, batch S+1 would cover everything the topic holds now, and every slot
would skip it because the ledger records later batches (the loss the lifecycle issue names first). The
driver re-runs S+1.. with the input the ledger recorded for them instead, so the output is every kept id
exactly once. The negative control switches that check off and the verifier must report lost ids."""
from __future__ import annotations

import json
import re
import threading

import pytest
import yaml

from eos_job import checkpoint
from eos_job.resolution import resolve
from eos_job.verify import audit_ids, audit_sink, read_committed
from examples.colors.generator import expected_ids, produce
from tests.e2e.job_runs import as_pvc, assert_ids_exact, run_config, run_job, wait_consumed

pytestmark = pytest.mark.stack


def _trickle(run, stop: threading.Event, sent: list[tuple[int, int, int]]) -> None:
    """Chunks of 40 events every 0.4 s: many small batches (no maxOffsetsPerTrigger)."""
    next_id, seed = 10_000, 100
    while not stop.is_set():
        seed += 1
        produce(run.bootstrap, run.events, 40, seed=seed, start_id=next_id)
        sent.append((40, seed, next_id))
        next_id += 40
        stop.wait(0.4)


def _snapshot_then_run_on(run, tmp_path) -> tuple:
    """The unique-id stream commits small batches while events trickle in; a live snapshot is taken after a
    few of them; the run goes on for four more batches and stops. Returns the run's config, the snapshot, its
    last batch, the run's last committed batch and the chunks sent."""
    produce(run.bootstrap, run.events, 200, seed=1)
    sent = [(200, 1, 0)]
    cfg = run_config(run)
    run.start()
    stop = threading.Event()
    feeder = threading.Thread(target=_trickle, args=(run, stop, sent), daemon=True)
    feeder.start()
    try:
        run.wait_for_batches(2)
        snap = tmp_path / "snapshots" / "older"
        r = run_job(["snapshot", "take", "--checkpoint", str(run.live_checkpoint), "--dest", str(snap),
                     "--stream-json", json.dumps(cfg.stream.wire()), "--spec-hash", cfg.spec.spec_hash()])
        assert r.returncode == 0, r.stderr[-3000:]
        at = json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("{")][-1])["lastBatch"]
        run.wait_for_batches(4)
    finally:
        stop.set()
        feeder.join(30)
    assert run.stop() == 0, run.log_tail()
    return cfg, snap, at, run.committed_batches(), sent


@pytest.mark.parametrize("safety", ["on", "off"], ids=["input-check", "negative-control-without-it"])
def test_restore_of_an_older_snapshot_re_runs_the_ledgers_batches_not_new_ones(colors_run, tmp_path, safety):
    run = colors_run(module="examples.colors.ids", max_offsets_per_trigger=None)
    run.setup()
    cfg, snap, at, later, sent = _snapshot_then_run_on(run, tmp_path)
    assert later >= at + 4, (at, later)
    produce(run.bootstrap, run.events, 600, seed=2, start_id=50_000)   # the topic now holds more than then
    sent.append((600, 2, 50_000))
    expected = set().union(*(expected_ids(n, seed, start) for n, seed, start in sent))

    restored = tmp_path / "restored"
    doc = cfg.model_copy(update={"checkpoint_dir": str(restored), "restore_from": str(snap),
                                 "replay_offsets_from": None})
    run.config_path.write_text(yaml.safe_dump(doc.model_dump(by_alias=True, mode="json")))
    run.extra_env = {"EOS_UNSAFE_DISABLE": "input-check"} if safety == "off" else None
    run.start()
    wait_consumed(run, restored)
    assert run.stop() == 0, run.log_tail()
    log = run.log_path.read_text()
    assert checkpoint.checkpoint_id(restored) == checkpoint.checkpoint_id(run.live_checkpoint)

    if safety == "on":
        m = re.search(r"re-ran (\d+) batches with their original input from the ledger", log)
        assert m, run.log_tail(80)
        assert int(m.group(1)) in (later - at, later - at + 1), (m.group(0), at, later)
        assert_ids_exact(run, expected)
    else:
        assert "UNSAFE: the input-check safety" in log
        audit = audit_ids(run.bootstrap, run.counts, expected)
        # The check this test relies on sees the loss the switched-off safety lets through.
        assert audit.missing, f"the negative control lost nothing: {audit}"
        assert not audit.duplicates and not audit.unexpected


# The JVM writer's control in `make soak`: tests/stack/test_jvm_writer.py's control of the JVM's ledger skip runs
# in `make test`.
@pytest.mark.parametrize("safety, writer", [
    pytest.param("on", "python", id="ledger-skip-python"),
    pytest.param("off", "python", id="negative-control-without-it-python"),
    pytest.param("on", "jvm", id="ledger-skip-jvm"),
    pytest.param("off", "jvm", id="negative-control-without-it-jvm", marks=pytest.mark.soak)])
def test_a_batch_replayed_after_it_reached_the_sink_is_skipped_not_written_again(colors_run, safety, writer):
    """The driver dies after every slot of batch 0 committed, before Spark's commit log: the restart replays
    batch 0. With the ledger's skip every id is written once; without it the verifier sees duplicates. With
    ``sink.writer: jvm`` the JVM slot writer wrote the ledger that resolution and the sink audit read."""
    run = colors_run(module="examples.colors.ids", max_offsets_per_trigger=None, writer=writer,
                     extra_env={"EOS_FAULT_KILL_BEFORE_COMMIT_LOG": "1"})
    run.setup()
    produce(run.bootstrap, run.events, 600, seed=5)
    expected = expected_ids(600, 5)
    run.start()
    assert run.proc.wait(240) == -9, run.log_tail()   # batch 0 is in the sink, commits/0 is not
    assert checkpoint.replay_batch(run.live_checkpoint) == 0
    in_sink = len(read_committed(run.bootstrap, run.counts))

    report = resolve(run_config(run))
    assert report.replay_batch == 0 and report.replay_slots_already_committed == [0, 1]
    assert not report.partially_committed
    assert "fully in the sink" in report.summary and report.checkpoint_readable
    # The same checkpoint as a PVC: where it is mounted (the path exists) resolution reads it as above;
    # where it is not (the operator) it fences and says it could not look, instead of "starts fresh".
    mounted, elsewhere = (as_pvc(run_config(run), run.live_checkpoint.parent),
                          as_pvc(run_config(run), run.workdir / "not-mounted"))
    on_pvc = resolve(mounted)
    assert on_pvc.checkpoint_readable and on_pvc.replay_slots_already_committed == [0, 1]
    blind = resolve(elsewhere)
    assert not blind.checkpoint_readable and blind.fenced_transactional_ids == report.fenced_transactional_ids
    assert blind.replay_batch is None and "not mounted here" in blind.summary and "fresh" not in blind.summary

    run.extra_env = {"EOS_UNSAFE_DISABLE": "ledger-skip"} if safety == "off" else {}
    run.start()
    wait_consumed(run, run.live_checkpoint)
    assert run.stop() == 0, run.log_tail()
    if safety == "on":
        assert "2/2 slots skipped as already committed" in run.log_path.read_text()
        assert len(read_committed(run.bootstrap, run.counts)) == in_sink, "the replay wrote records again"
        assert_ids_exact(run, expected)
    else:
        audit = audit_ids(run.bootstrap, run.counts, expected)
        assert audit.duplicates and not audit.missing, f"the negative control wrote nothing twice: {audit}"
        # The sink audit (kubectl eos verify), which knows no ids, names the doubled slots of batch 0.
        slots = audit_sink(run.bootstrap, [run.counts], run.ledger_topic(), dead_letter_topic=run.dlq)
        doubled = {(f.kind, f.batch, f.found == 2 * f.committed) for f in slots.findings}
        assert doubled == {("extra", 0, True)}, slots.summary() + "".join(f"\n{f.describe()}" for f in slots.findings)


def test_another_spec_never_finishes_a_partially_committed_batch(colors_run, tmp_path):
    """Batch 0 is partially committed by spec A (slot 0 committed, the driver died). Spec B (other
    arguments: another output) must not skip slot 0 and write the rest with its own output: the driver
    refuses the batch (reason BatchRefused, nothing written). A drain with spec A finishes it; then B runs."""
    run = colors_run(module="examples.colors.ids", max_offsets_per_trigger=None,
                     extra_env={"EOS_FAULT_PARTIAL_BATCH": "0:0"})
    run.setup()
    produce(run.bootstrap, run.events, 800, seed=9)
    expected = expected_ids(800, 9)
    spec_a = run.config_path.read_text()
    run.start()
    assert run.proc.wait(240) == -9, run.log_tail()
    report = resolve(run_config(run))
    assert report.partially_committed and report.replay_slots_already_committed == [0], report.summary
    in_sink = len(read_committed(run.bootstrap, run.counts))

    doc = yaml.safe_load(spec_a)
    doc["spec"]["job"]["args"] = {"version": "2"}          # spec B: another output hash
    run.config_path.write_text(yaml.safe_dump(doc))
    run.extra_env = {}
    run.start()
    assert run.proc.wait(240) == 1, run.log_tail()
    summary = json.loads((run.workdir / "termination.json").read_text())
    assert summary["reason"] == "BatchRefused" and "partially committed by another spec" in summary["error"], summary
    assert len(read_committed(run.bootstrap, run.counts)) == in_sink       # nothing written

    run.config_path.write_text(spec_a)                      # finish batch 0 with the spec that started it
    r = run_job(["run", "--config", str(run.config_path), "--drain"], timeout=300)
    assert r.returncode == 0 and '"reason": "Drained"' in r.stdout, r.stderr[-3000:]
    run.config_path.write_text(yaml.safe_dump(doc))         # then spec B, on new input
    produce(run.bootstrap, run.events, 300, seed=10, start_id=5_000)
    expected |= expected_ids(300, 10, 5_000)
    run.start()
    wait_consumed(run, run.live_checkpoint)
    assert run.stop() == 0, run.log_tail()
    assert_ids_exact(run, expected)


def test_a_partial_batch_a_later_generation_refuses_is_finished_by_the_slot_layout_that_started_it(colors_run):
    """Batch 0 is partially committed under generation 0 (2 slots: slot 0 committed, the driver died). A rescale
    to 3 slots starts before anything finished it (a zombie's slot commit, a rescale that ran ahead of the drain):
    generation 1 refuses the batch, nothing written, and is recorded in the ledger's history. Before, every
    later start refused too (a spec with 2 slots again ran as generation 2): stuck for good. Now a spec with
    generation 0's slot layout finishes the batch under generation 0 (its ids and slot keys: slot 0 skipped,
    slot 1 written) and runs on; every id once."""
    run = colors_run(module="examples.colors.ids", max_offsets_per_trigger=None,
                     extra_env={"EOS_FAULT_PARTIAL_BATCH": "0:0"})
    run.setup()
    produce(run.bootstrap, run.events, 800, seed=12)
    expected = expected_ids(800, 12)
    cfg = run_config(run)
    run.start()
    assert run.proc.wait(240) == -9, run.log_tail()
    report = resolve(cfg)
    assert report.partially_committed and report.replay_slots_already_committed == [0], report.summary
    in_sink = len(read_committed(run.bootstrap, run.counts))

    rescaled = cfg.spec.model_copy(update={"job": cfg.spec.job.model_copy(update={"parallelism": 3})})
    run.config_path.write_text(yaml.safe_dump(cfg.model_copy(update={"spec": rescaled}).model_dump(
        by_alias=True, mode="json")))
    run.extra_env = {}
    run.start()
    assert run.proc.wait(240) == 1, run.log_tail()
    summary = json.loads((run.workdir / "termination.json").read_text())
    assert summary["reason"] == "BatchRefused" and "partially committed under generation 0" in summary["error"], \
        summary
    assert len(read_committed(run.bootstrap, run.counts)) == in_sink       # nothing written
    assert re.search(r"driver epoch \d+, generation 1\b", run.log_path.read_text()), run.log_tail(80)

    run.config_path.write_text(yaml.safe_dump(cfg.model_dump(by_alias=True, mode="json")))   # 2 slots again
    produce(run.bootstrap, run.events, 300, seed=13, start_id=5_000)
    expected |= expected_ids(300, 13, 5_000)
    run.start()
    wait_consumed(run, run.live_checkpoint)
    assert run.stop() == 0, run.log_tail()
    log = run.log_path.read_text()
    assert re.search(r"driver epoch \d+, generation 2\b", log), run.log_tail(80)
    assert "finishing it under that generation, not 2" in log, run.log_tail(80)
    assert "1/2 slots skipped as already committed" in log, run.log_tail(80)
    assert_ids_exact(run, expected)


# The control in `make soak` (67 s): the same switch (input-check) is turned off in `make test` by the control of
# test_restore_of_an_older_snapshot_re_runs_the_ledgers_batches_not_new_ones above.
@pytest.mark.parametrize("safety", ["on", pytest.param("off", marks=pytest.mark.soak)],
                         ids=["history-first", "negative-control-without-it"])
def test_a_restore_with_a_rescale_skips_what_the_older_generation_committed(colors_run, tmp_path, safety):
    """``restoreFrom`` of an older snapshot together with a ``job.parallelism`` change, launched as the operator
    launches it: the restored checkpoint, ``replayOffsetsFrom`` naming the live one, a new generation (3 slots,
    was 2) whose slot keys hold nothing. The batches after the snapshot are re-run with their original input and
    judged against the ledger's history before any slot runs: complete under generation 0, they are skipped
    whole, and the output is every id once. The negative control (``input-check`` off: no history judged, the
    old order of things) writes those batches again under the new generation: the audit reports duplicates."""
    run = colors_run(module="examples.colors.ids", max_offsets_per_trigger=None)
    run.setup()
    cfg, snap, at, later, sent = _snapshot_then_run_on(run, tmp_path)
    produce(run.bootstrap, run.events, 600, seed=2, start_id=50_000)
    sent.append((600, 2, 50_000))
    expected = set().union(*(expected_ids(n, seed, start) for n, seed, start in sent))

    restored = tmp_path / "restored"
    rescaled = cfg.spec.model_copy(update={"job": cfg.spec.job.model_copy(update={"parallelism": 3})})
    doc = cfg.model_copy(update={"spec": rescaled, "checkpoint_dir": str(restored), "restore_from": str(snap),
                                 "replay_offsets_from": str(run.live_checkpoint)})
    run.config_path.write_text(yaml.safe_dump(doc.model_dump(by_alias=True, mode="json")))
    run.extra_env = {"EOS_UNSAFE_DISABLE": "input-check"} if safety == "off" else None
    run.start()
    wait_consumed(run, restored)
    assert run.stop() == 0, run.log_tail()
    log = run.log_path.read_text()
    assert re.search(r"driver epoch \d+, generation 1\b", log), run.log_tail(80)   # the rescale: a new generation

    if safety == "on":
        m = re.search(r"re-ran (\d+) batches with their original input from the ledger", log)
        assert m, run.log_tail(80)
        assert int(m.group(1)) in (later - at, later - at + 1), (m.group(0), at, later)
        assert len(re.findall(r"batch \d+ skipped as a whole: batch \d+ is complete in the sink \(generation 0",
                              log)) >= later - at, run.log_tail(80)
        assert_ids_exact(run, expected)
    else:
        assert "UNSAFE: the input-check safety" in log
        audit = audit_ids(run.bootstrap, run.counts, expected)
        assert audit.duplicates, f"the negative control wrote nothing twice: {audit}"


def test_a_committed_batch_the_ledger_records_otherwise_stops_the_start_with_both_ranges(colors_run):
    """The checkpoint's committed ``offsets/N`` is rewritten (what a second driver on the same checkpoint could do
    on an object store) to end one record earlier than the batch the sink holds. Going on from there would write
    that record again; the driver compares the checkpoint's last commit with the ledger's record of it at start
    and stops (BatchRefused) naming both ranges, writing nothing."""
    run = colors_run(module="examples.colors.ids", max_offsets_per_trigger=None)
    run.setup()
    produce(run.bootstrap, run.events, 300, seed=41)
    run.start()
    wait_consumed(run, run.live_checkpoint)
    assert run.stop() == 0, run.log_tail()
    last = checkpoint.last_committed_batch(run.live_checkpoint)
    path = run.live_checkpoint / "offsets" / str(last)
    lines = path.read_text().splitlines()
    ends = json.loads(lines[2])
    topic = next(iter(ends))
    part = next(p for p, o in ends[topic].items() if o > 0)
    ends[topic][part] -= 1
    checkpoint.write_offset_log(run.live_checkpoint, last, "\n".join([*lines[:2], json.dumps(ends), *lines[3:]]))
    before = len(read_committed(run.bootstrap, run.counts))

    run.start()
    assert run.proc.wait(240) == 1, run.log_tail()
    summary = json.loads((run.workdir / "termination.json").read_text())
    assert summary["reason"] == "BatchRefused", summary
    assert f"committed batch {last} covers" in summary["error"], summary
    assert f"{topic}[{part}]" in summary["error"] and "Restore a snapshot" in summary["error"], summary
    assert len(read_committed(run.bootstrap, run.counts)) == before, "the refused start wrote records"
