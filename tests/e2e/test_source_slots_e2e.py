"""Slots from the source's partitions (job.slotsFrom: sourcePartitions): a map-only job writes without the
repartition shuffle, and a partially committed batch is still finished exactly once.

Batch 0 of the unique-id stream (2 source partitions, 3 slots: one stays unused) is partially committed: slot 0
committed, slot 1 held, the driver SIGKILLed. (Two partitions, so both tasks run at once in the driver's two task
threads; a third could wait for the held ones.) The restart replays batch 0 from its offset log: slot 0 (the
source's partition 0) skips, slot 1 writes, and every kept id is in the output once; every record's audit header
names the slot its source partition ranks to (a repartition by key would spread each partition over every slot). The negative control
ranks the partitions the other way round on the restart (``EOS_UNSAFE_DISABLE=slot-order``), so the skipped
slot 0 is now partition 1: the verifier must report partition 1's ids missing and partition 0's written
twice."""
from __future__ import annotations

import json
from collections import Counter

import pytest
import yaml

from eos_job import audit
from eos_job.resolution import resolve
from eos_job.verify import audit_ids, read_committed
from examples.colors.generator import expected_ids, produce
from tests.e2e.job_runs import run_config, wait_consumed

pytestmark = pytest.mark.stack


@pytest.mark.parametrize("safety", ["on", "off"], ids=["stable-slot-order", "negative-control-without-it"])
def test_a_partial_batch_with_source_partition_slots_is_finished_exactly_once(colors_run, safety):
    run = colors_run(module="tests.e2e.jobs.ids_by_partition", parallelism=3, max_offsets_per_trigger=None,
                     extra_env={"EOS_FAULT_PARTIAL_BATCH": "0:0"})
    run.setup(event_partitions=2)
    doc = yaml.safe_load(run.config_path.read_text())
    doc["spec"]["job"]["slotsFrom"] = "sourcePartitions"
    run.config_path.write_text(yaml.safe_dump(doc))
    produce(run.bootstrap, run.events, 900, seed=21)
    expected = expected_ids(900, 21)
    run.start()
    assert run.proc.wait(240) == -9, run.log_tail()      # slot 0 committed, slot 1 never did
    report = resolve(run_config(run))
    assert report.partially_committed and report.replay_slots_already_committed == [0], report.summary
    first = read_committed(run.bootstrap, run.counts)
    assert first and {json.loads(m.value())["sourcePartition"] for m in first} == {0}, "slot 0 is partition 0"

    run.extra_env = {"EOS_UNSAFE_DISABLE": "slot-order"} if safety == "off" else {}
    run.start()
    wait_consumed(run, run.live_checkpoint)
    assert run.stop() == 0, run.log_tail()
    log = run.log_path.read_text()
    if safety == "on":
        assert "1/3 slots skipped as already committed" in log, run.log_tail(60)
        out = audit_ids(run.bootstrap, run.counts, expected)
        assert not out.missing and not out.duplicates and not out.unexpected, out
        # Each record was written by the slot its source partition ranks to (one topic: slot = partition); the
        # repartition by key would have spread every partition over all slots.
        slots = Counter((audit.group_of(m.headers())[1], json.loads(m.value())["sourcePartition"])
                        for m in read_committed(run.bootstrap, run.counts))
        assert {s for s, _ in slots} == {0, 1} and all(s == p for s, p in slots), slots
    else:
        assert "UNSAFE: the slot-order safety" in log
        out = audit_ids(run.bootstrap, run.counts, expected)
        assert out.missing and out.duplicates, f"the negative control lost and doubled nothing: {out}"
        by_id = {int(m.key()): json.loads(m.value())["sourcePartition"]
                 for m in read_committed(run.bootstrap, run.counts)}
        assert {by_id.get(i) for i in out.duplicates} == {0}, "partition 0 (committed, then slot 1) written twice"


def test_a_stateful_job_with_source_partition_slots_is_refused_before_anything_is_recorded(colors_run):
    """The colors count shuffles (an aggregation): its batch's lineage has a shuffle, so source-partition slots
    would not be deterministic. The driver refuses the batch before it records or writes anything, naming the
    field and the fix."""
    run = colors_run(max_offsets_per_trigger=None)
    run.setup(event_partitions=3)
    doc = yaml.safe_load(run.config_path.read_text())
    doc["spec"]["job"]["slotsFrom"] = "sourcePartitions"
    run.config_path.write_text(yaml.safe_dump(doc))
    produce(run.bootstrap, run.events, 300, seed=22)
    run.start()
    assert run.proc.wait(240) == 1, run.log_tail()
    summary = json.loads((run.workdir / "termination.json").read_text())
    assert summary["reason"] == "InvalidSpec", summary       # the operator fails it at once: no restart helps
    assert "job.slotsFrom sourcePartitions needs a map-only job" in summary["error"], summary
    assert "ShuffleDependency" in summary["error"] and "set job.slotsFrom key" in summary["error"], summary
    assert read_committed(run.bootstrap, run.counts) == []
    ledger = read_committed(run.bootstrap, run.ledger_topic())
    recorded = [m.key() for m in ledger if (m.key() or b"").endswith(b"/batch") or b"/input/" in (m.key() or b"")]
    assert not recorded, f"the refused batch left ledger records: {recorded}"


def test_a_source_grown_past_the_parallelism_is_refused_then_the_advised_rescale_runs_it_exactly_once(colors_run):
    """The source gains a third partition under 2 source-partition slots: the driver refuses the batch that
    covers it (InvalidSpec, job.parallelism named) before anything of it is recorded. The advised fix is a
    job.parallelism upgrade, which first drains the uncommitted batch with the old spec: that drain must see
    that nothing of the batch reached the sink (the ledger holds no record of it) and leave it to the new spec,
    not re-run it with 2 slots and be refused again (DrainFailed, then Failed, before this fix). Then the new
    spec (3 slots, a new generation) runs it: every id exactly once."""
    from confluent_kafka.admin import AdminClient, NewPartitions

    from eos_job import checkpoint
    from tests.e2e.job_runs import assert_ids_exact

    run = colors_run(module="tests.e2e.jobs.ids_by_partition", parallelism=2, max_offsets_per_trigger=None)
    run.setup(event_partitions=2)
    doc = yaml.safe_load(run.config_path.read_text())
    doc["spec"]["job"]["slotsFrom"] = "sourcePartitions"
    run.config_path.write_text(yaml.safe_dump(doc))
    produce(run.bootstrap, run.events, 300, seed=31)
    run.start()
    run.wait_for_batches(1)
    with AdminClient({"bootstrap.servers": run.bootstrap}) as admin:
        admin.create_partitions([NewPartitions(run.events, 3)])[run.events].result(30)
    produce(run.bootstrap, run.events, 600, seed=32, start_id=10_000)
    expected = expected_ids(300, 31) | expected_ids(600, 32, 10_000)
    assert run.proc.wait(240) == 1, run.log_tail()
    summary = json.loads((run.workdir / "termination.json").read_text())
    assert summary["reason"] == "InvalidSpec" and "job.parallelism" in summary["error"], summary
    refused = checkpoint.replay_batch(run.live_checkpoint)
    assert refused is not None, "the refused batch's offsets are logged, its commit is not"

    run.start(["--drain"])                       # what the operator's drain Pod runs, with the old spec
    assert run.proc.wait(240) == 0, run.log_tail(60)
    assert f"drain: batch {refused} has no record in the ledger" in run.log_path.read_text(), run.log_tail(60)
    assert checkpoint.replay_batch(run.live_checkpoint) == refused    # left to the new spec

    doc["spec"]["job"]["parallelism"] = 3
    run.config_path.write_text(yaml.safe_dump(doc))
    run.start()
    wait_consumed(run, run.live_checkpoint)
    assert run.stop() == 0, run.log_tail()
    assert_ids_exact(run, expected)
