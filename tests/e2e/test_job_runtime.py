"""The job runtime against the real broker and real Spark: replays, partial batches, graceful stop, bad input."""
from __future__ import annotations

import json
import re
import time

import pytest

from eos_job import checkpoint, slot_stats
from eos_job.resolution import resolve
from eos_job.verify import read_committed
from examples.colors.generator import produce
from tests.e2e.job_runs import assert_exact, run_config, run_job

pytestmark = pytest.mark.stack




def test_a_kill_while_spark_wrote_the_first_offsets_does_not_brick_the_stream(colors_run, stack_env, tmp_path):
    """A CI run killed a driver while Spark wrote offsets/0: it left only ``metadata`` and a torn
    ``offsets/.0.<uuid>.tmp``. Spark then took the checkpoint for a new one and refused it on every restart
    (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY). The driver clears such torn log writes before it starts."""
    run = colors_run(max_offsets_per_trigger=1000)
    run.setup()
    expected = produce(run.bootstrap, run.events, 2000)
    ckpt = run.live_checkpoint
    (ckpt / "offsets").mkdir(parents=True)
    (ckpt / "metadata").write_text('{"id":"bb35debc-8d54-4af7-981e-07a867d1c44d"}\n')
    torn = ["offsets/.0.9b808874-ca47-4dea-b092-1bd26f754379.tmp",
            "offsets/..0.9b808874-ca47-4dea-b092-1bd26f754379.tmp.crc"]
    for name in torn:
        (ckpt / name).write_bytes(b"v1\n{\"batchWatermarkMs\":0,")
    run.start()
    run.wait_caught_up(expected)
    assert run.stop() == 0, run.log_tail()
    assert_exact(run, expected)
    assert not any((ckpt / name).exists() for name in torn)
    assert "removed 2 file(s) a killed driver was writing" in run.log_path.read_text()


def test_every_slot_task_reports_its_counters_once_and_they_add_up(colors_run, stack_env, tmp_path):
    """Issue 29: each batch's log line sums its slot tasks' counters (carried back in their commit rows). On the
    real broker and Spark: every slot task counted once per batch, every producer fenced before use, one ledger
    read per producer used at most, and the run's first batch made every producer it used; the output exact."""
    run = colors_run(max_offsets_per_trigger=500, parallelism=3)
    run.setup()
    expected = produce(run.bootstrap, run.events, 3000)
    run.start()
    run.wait_caught_up(expected)
    assert run.stop() == 0, run.log_tail()
    assert_exact(run, expected)
    line = re.compile(r"batch (\d+) slot tasks (\d+): (\d+) pool hits, (\d+) new producers, (\d+) stale, "
                      r"(\d+) fences, (\d+) ledger reads; [^;]*; (\d+) trusted, (\d+) of them fell back")
    batches = {}
    for m in line.finditer(run.log_path.read_text()):
        n, tasks, hits, new, stale, fences, reads, trusted, fell_back = (int(x) for x in m.groups())
        assert n not in batches, f"batch {n} logged twice"
        batches[n] = slot_stats.SlotStats(tasks=tasks, pool_hits=hits, new_producers=new, stale_producers=stale,
                                          fences=fences, ledger_reads=reads, trusted=trusted,
                                          trusted_fallbacks=fell_back)
    assert len(batches) >= 4, run.log_tail()
    for n, stats in batches.items():
        assert slot_stats.problems(stats, 3) == [], (n, stats)
        # Each slot task read the ledger or trusted its clean held producer (amendment A2).
        assert stats.ledger_reads + stats.trusted - stats.trusted_fallbacks >= 3, (n, stats)
    first = batches[min(batches)]
    assert first.pool_hits == 0 and first.new_producers >= 3 and first.fences >= 3, first


def test_graceful_stop_takes_a_snapshot_at_a_clean_boundary(colors_run, stack_env, tmp_path):
    run = colors_run(max_offsets_per_trigger=500)
    run.setup()
    expected = produce(run.bootstrap, run.events, 3000)
    snap = tmp_path / "snapshots" / "s1"
    run.start(["--snapshot-on-stop", str(snap)])
    run.wait_for_batches(2)
    assert run.stop() == 0, run.log_tail()
    summary = json.loads((tmp_path / "termination.json").read_text())
    assert summary["reason"] == "Stopped"
    manifest = json.loads((snap / "eos-snapshot.json").read_text())
    assert manifest["lastBatch"] == summary["last_committed_batch"]
    assert manifest["checkpointId"] == checkpoint.checkpoint_id(run.live_checkpoint)
    assert (snap / "checkpoint" / "commits" / str(manifest["lastBatch"])).exists()
    # Clean boundary: nothing of a later batch reached the sink.
    report = resolve(run_config(run))
    assert report.replay_slots_already_committed == []
    assert max(int(b) for b in report.last_committed_batch_per_slot.values()) <= manifest["lastBatch"]
    # Resume and finish exactly once.
    run.start()
    run.wait_caught_up(expected)
    assert run.stop() == 0
    assert_exact(run, expected)




def test_bad_config_names_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: ExactlyOnceStream\nmetadata: {name: x}\nspec:\n  job: {module: m, paralelism: 2}\n"
                   "  source: {bootstrapServers: a:9092, topics: [t]}\n  sink: {bootstrapServers: a:9092, topic: t}\n"
                   "  checkpoint: {store: local, path: /tmp/x}\n")
    r = run_job(["validate", "--config", str(bad)])
    assert r.returncode == 2
    assert "job.paralelism" in r.stderr
    assert "Traceback" not in r.stderr
    same = bad.read_text().replace("paralelism: 2", "parallelism: 2")
    bad.write_text(same)
    r = run_job(["validate", "--config", str(bad)])
    assert r.returncode == 2 and "sink.topic" in r.stderr and "source topic" in r.stderr


def test_missing_topic_and_unreachable_broker_give_clear_errors(colors_run, stack_env, tmp_path):
    run = colors_run()
    run.config_path.write_text(__import__("yaml").safe_dump(run.manifest()))  # topics never created
    r = run_job(["run", "--config", str(run.config_path)])
    assert r.returncode == 3, r.stderr[-2000:]
    assert f"sink.topic: topic '{run.counts}' does not exist" in r.stderr
    assert "Traceback" not in r.stderr

    m = run.manifest()
    m["spec"]["sink"]["bootstrapServers"] = "127.0.0.1:1"
    run.config_path.write_text(__import__("yaml").safe_dump(m))
    t0 = time.monotonic()
    r = run_job(["run", "--config", str(run.config_path)])
    assert r.returncode == 3
    assert "cannot reach Kafka at 127.0.0.1:1" in r.stderr
    assert "Traceback" not in r.stderr
    assert time.monotonic() - t0 < 100


def test_poison_records_go_to_the_dead_letter_topic_in_the_same_transaction(colors_run, stack_env, tmp_path):
    from confluent_kafka import Producer
    run = colors_run(max_offsets_per_trigger=None)
    run.setup()
    m = run.manifest()
    m["spec"]["job"]["module"] = "tests.e2e.jobs.poison"
    run.config_path.write_text(__import__("yaml").safe_dump(m))
    p = Producer({"bootstrap.servers": run.bootstrap})
    good, bad, big = 50, 5, 2
    for i in range(good):
        p.produce(run.events, key=f"g{i}".encode(), value=json.dumps({"id": i}).encode())
    for i in range(bad):
        p.produce(run.events, key=f"b{i}".encode(), value=b"not json {")
    for i in range(big):
        p.produce(run.events, key=f"x{i}".encode(), value=json.dumps({"id": 1000 + i, "big": True}).encode())
    assert p.flush(30) == 0
    run.start()
    run.wait_for_batches(1)
    assert run.stop() == 0, run.log_tail()
    out = read_committed(run.bootstrap, run.counts)
    dead = read_committed(run.bootstrap, run.dlq)
    assert sorted(m.key().decode() for m in out) == sorted(f"g{i}" for i in range(good))
    assert sorted(m.key().decode() for m in dead) == sorted([f"b{i}" for i in range(bad)] +
                                                            [f"x{i}" for i in range(big)])
    errors = {m.key().decode(): dict(m.headers())["eos.error"].decode() for m in dead}
    assert all("JSONDecodeError" in errors[f"b{i}"] for i in range(bad))
    assert all("MSG_SIZE_TOO_LARGE" in errors[f"x{i}"] for i in range(big))
    assert f"{bad + big} dead letters" in run.log_path.read_text()
