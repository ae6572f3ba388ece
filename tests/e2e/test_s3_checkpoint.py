"""The unique-id stream with its checkpoint on an S3 server (MinIO), through Hadoop's S3A connector.

One driver lifecycle on one bucket prefix, nothing on local disk: SIGKILL mid-stream, resolution reading
the checkpoint straight from S3, a live snapshot (server-side copies) while the driver runs, the S3 server
down for longer than several triggers and back, a graceful stop (its Spark event log, ``job.eventLog``, then read
by a real History Server from the bucket), a restore of the snapshot into a new S3
location (batches after it re-run with their original offsets), and the verifier: every id once. The S3
server is the test's own (``private_s3``), the one it kills; the tests running beside it keep the stack's.
"""
from __future__ import annotations

import json
import re
import time
import uuid

import pytest
import yaml

from eos_job import checkpoint, event_log, storage
from eos_job.resolution import resolve
from eos_job.snapshot import MANIFEST, verify_snapshot
from eos_job.storage import Loc
from eos_job.verify import audit_ids, read_committed
from examples.colors.generator import expected_ids, produce
from eos_stack import s3 as s3_server
from eos_stack.cluster import wait_until
from tests.e2e.job_runs import assert_ids_exact, run_config, run_job, wait_consumed
from tests.e2e.streams import IdFeed
from tests.harness.history_server import HistoryServer


OUTAGE_S = 12.0   # the trigger is 300 ms: the S3 server is away for dozens of triggers


@pytest.fixture
def s3_env(stack_env, private_s3, monkeypatch):
    """The private S3 server's keys for the driver (AWS_*), its bucket registered in this process (restored
    afterwards: the next test of this worker may use the stack's bucket of the same name)."""
    if not stack_env.get("SPARK_S3_JARS"):
        pytest.fail("the local stack has no SPARK_S3_JARS: `make stack-up` fetches the S3A jars", pytrace=False)
    s3 = private_s3.env
    env = {"AWS_ACCESS_KEY_ID": s3["S3_ACCESS_KEY"], "AWS_SECRET_ACCESS_KEY": s3["S3_SECRET_KEY"]}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    # setitem, not storage.register_s3: the registration (also the one resolution makes from the spec) is undone
    # at teardown.
    monkeypatch.setitem(storage._buckets, s3["S3_BUCKET"], storage.S3Options(endpoint=s3["S3_ENDPOINT"],
                                                                             path_style=True))
    return env


def _on_s3(run, s3: dict[str, str], prefix: str, event_log: bool = False) -> str:
    """Rewrite the run's manifest: checkpoint.store s3 on the bucket of ``s3`` (``event_log``: with
    ``job.eventLog`` on); returns the live location."""
    doc = yaml.safe_load(run.config_path.read_text())
    if event_log:
        doc["spec"]["job"]["eventLog"] = {"enabled": True}
    doc["spec"]["checkpoint"] = {"store": "s3", "path": prefix,
                                 "s3": {"bucket": s3["S3_BUCKET"], "endpoint": s3["S3_ENDPOINT"],
                                        "pathStyleAccess": True,
                                        "accessKeyId": {"name": "unused-here", "key": "id"},
                                        "secretAccessKey": {"name": "unused-here", "key": "secret"}}}
    run.config_path.write_text(yaml.safe_dump(doc))
    return f"s3a://{s3['S3_BUCKET']}{prefix}/live"


def _wait_batches(run, live: str, more: int, timeout: float = 240) -> int:
    start = checkpoint.last_committed_batch(live)
    start = -1 if start is None else start

    def progressed():
        if run.proc is not None and run.proc.poll() is not None:
            raise AssertionError(f"the job exited with {run.proc.returncode}:\n{run.log_tail()}")
        done = checkpoint.last_committed_batch(live)
        return done if done is not None and done >= start + more else None

    return wait_until(progressed, f"{more} more batches in {live}", timeout, run.log_tail, 0.5)


def _history_shows_the_stream(history: HistoryServer, cfg) -> str:
    """The History Server lists a completed application of the stream's driver, read from its event log in the
    bucket, with the streaming query's batch jobs (Spark describes each with the query name and ``batch = N``).
    Without the log no application of this test's prefix exists, and this fails."""
    query = f"eos-{cfg.stream.namespace}-{cfg.stream.name}"

    def listed():
        apps = [a for a in history.get("/applications") if a["name"] == f"eos-{cfg.stream.name}"
                and any(att.get("completed") for att in a["attempts"])]
        return apps or None

    apps = wait_until(listed, "the History Server to list the stream's completed driver", 120, history.log_tail, 1)
    jobs = history.get(f"/applications/{apps[0]['id']}/jobs")
    batches = [j for j in jobs if query in j.get("description", "") and "batch = " in j.get("description", "")
               and j["status"] == "SUCCEEDED"]   # (a stop may cancel the jobs of a batch just begun)
    assert batches, (len(jobs), jobs[:3])
    return (f"History Server: {len(apps)} completed driver(s) listed from {event_log.location(cfg.spec)}, "
            f"{len(batches)} batch jobs of {query} in {apps[0]['id']}")


@pytest.mark.timeout(1200)
def test_unique_ids_exactly_once_with_the_checkpoint_on_s3(private_s3, s3_env, colors_run, tmp_path, report_result):
    st, s3 = private_s3.stack, private_s3.env
    run = colors_run(parallelism=2, max_offsets_per_trigger=1500, module="examples.colors.ids",
                     trigger_interval_ms=300)
    run.setup()
    prefix = f"/e2e/{uuid.uuid4().hex[:8]}"
    live = _on_s3(run, s3, prefix, event_log=True)
    run.extra_env = dict(s3_env)
    cfg = run_config(run).model_copy(update={"checkpoint_dir": live})
    feed = IdFeed(run.bootstrap, run.events, chunk=200, pause=0.5)
    feed.send(6_000, -1, 1_000_000)
    feed.start()
    journal = []
    history = None
    try:
        run.start()
        _wait_batches(run, live, 3)
        assert not (tmp_path / "live").exists(), "the checkpoint must not be written to local disk"
        names = {str(p) for p in Loc.of(live).files()}
        assert {"metadata", "offsets/0", "commits/0"} <= names, sorted(names)[:20]
        assert not any(n.endswith(".tmp") for n in names if n.startswith(("offsets/", "commits/"))), names

        # 1. SIGKILL mid-stream; resolution reads the checkpoint from S3 directly.
        run.kill9()
        report = resolve(cfg, timeout_s=60)
        assert report.checkpoint_readable and report.checkpoint_id == checkpoint.checkpoint_id(live)
        assert report.checkpoint_last_committed_batch == checkpoint.last_committed_batch(live) is not None
        journal.append(f"driver SIGKILL after batch {report.checkpoint_last_committed_batch}: {report.summary}")
        run.start()
        _wait_batches(run, live, 2)

        # 2. A live snapshot while the driver runs: every file a server-side copy inside the bucket.
        snap = f"s3a://{s3['S3_BUCKET']}{prefix}/snapshots/s1"
        r = run_job(["snapshot", "take", "--checkpoint", live, "--dest", snap, "--stream-json",
                     json.dumps(cfg.stream.wire())], env_extra={**s3_env, "EOS_S3_ENDPOINT": s3["S3_ENDPOINT"],
                                                                "EOS_S3_PATH_STYLE": "true"})
        assert r.returncode == 0, r.stdout + r.stderr
        manifest = verify_snapshot(snap)
        assert (Loc.of(snap) / MANIFEST).is_file() and manifest["checkpointId"] == checkpoint.checkpoint_id(live)
        journal.append(f"live snapshot at batch {manifest['lastBatch']} ({manifest['sizeBytes']} bytes copied "
                       "server-side)")
        _wait_batches(run, live, 2)

        # 3. The S3 server away for dozens of triggers, then back on the same port with the same data.
        before = checkpoint.last_committed_batch(live)
        s3_server.stop_server(st, kill=True)
        t0 = time.monotonic()
        time.sleep(OUTAGE_S)
        s3_server.start_server(st)
        outage = time.monotonic() - t0
        if run.proc.poll() is not None:   # the query failed on S3: resolve and start again
            journal.append(f"S3 down {outage:.0f}s: the driver failed (exit {run.proc.returncode}); restarted")
            resolve(cfg, timeout_s=60)
            run.start()
        else:
            journal.append(f"S3 down {outage:.0f}s: the driver waited it out")
        _wait_batches(run, live, 2)
        assert checkpoint.last_committed_batch(live) > before
        assert run.stop() == 0, run.log_tail()
        stopped_at = checkpoint.last_committed_batch(live)
        # The stopped driver's event log is complete in the bucket: a History Server reads it (checked at the end,
        # its start overlapping the restore below).
        history = HistoryServer(event_log.location(cfg.spec), cfg.spec.checkpoint.s3, s3_env,
                                tmp_path / "history.log").start()

        # 4. Restore the older snapshot into a new S3 location; the batches after it are re-run with their
        #    original offsets from the live checkpoint, so the ledger's skips match what the sink holds.
        feed.hold()
        restored = f"s3a://{s3['S3_BUCKET']}{prefix}/ckpt-restored"
        doc = cfg.model_copy(update={"checkpoint_dir": restored, "restore_from": snap,
                                     "replay_offsets_from": live})
        restored_cfg = tmp_path / "restored.json"
        restored_cfg.write_text(doc.model_dump_json(by_alias=True))
        resolve(doc, timeout_s=60)
        feed.resume()
        run.config_path = restored_cfg
        run.start()
        wait_until(lambda: (checkpoint.last_committed_batch(restored) or -1) >= stopped_at,
                   f"the restored stream to pass batch {stopped_at}", 300, run.log_tail, 1)
        assert checkpoint.checkpoint_id(restored) == manifest["checkpointId"]
        journal.append(f"restored snapshot of batch {manifest['lastBatch']} into {restored}; re-ran through "
                       f"batch {stopped_at}")
        expected = feed.finish()
        wait_consumed(run, restored, timeout=300)
        assert run.stop() == 0, run.log_tail()
        journal.append(_history_shows_the_stream(history, cfg))
    finally:
        if history is not None:
            history.stop()
        feed.stop_flag.set()
        if run.proc and run.proc.poll() is None:
            run.kill9()
        if s3_server.status(st)[0] != "running":
            s3_server.start_server(st)
    assert_ids_exact(run, expected)
    print("\n".join(journal))
    report_result(f"S3 checkpoint: {len(expected)} unique ids exactly once through a driver SIGKILL, a live "
                  f"snapshot on S3, an S3 outage of {outage:.0f}s and a restore on S3")


# The control in `make soak`: the same switch (ledger-skip) is turned off in `make test` by
# test_batch_identity_e2e.py (the Python writer) and tests/stack/test_broker_kill_at_commit.py.
@pytest.mark.parametrize("safety", ["on", pytest.param("off", marks=pytest.mark.soak)],
                         ids=["ledger-skip", "negative-control-without-it"])
def test_an_s3_outage_between_the_sink_and_the_commit_log(private_s3, s3_env, colors_run, tmp_path, safety):
    """The S3 outage where it hurts: batch N is in the sink, and the checkpoint's store goes away before Spark
    writes ``commits/N``. The driver is held at that point (the fault hook ``EOS_FAULT_HOLD_IN_SINK``), the test's
    own S3 server SIGKILLed, the driver released: writing ``commits/N`` fails (S3A retries kept short), the query
    fails. With the server back, the restart re-runs batch N from its offset log and the ledger says it is in the
    sink: skipped, every id once. The negative control restarts with ``ledger-skip`` off: batch N is written
    again, and the id audit must report its ids twice."""
    st, s3 = private_s3.stack, private_s3.env
    run = colors_run(parallelism=2, max_offsets_per_trigger=500, module="examples.colors.ids",
                     trigger_interval_ms=300)
    run.setup()
    live = _on_s3(run, s3, f"/e2e-outage/{uuid.uuid4().hex[:8]}")
    doc = yaml.safe_load(run.config_path.read_text())
    doc["spec"]["job"].setdefault("sparkConf", {}).update({   # S3A gives up at once instead of after a minute
        "spark.hadoop.fs.s3a.retry.limit": "1", "spark.hadoop.fs.s3a.retry.interval": "200ms",
        "spark.hadoop.fs.s3a.attempts.maximum": "1"})
    run.config_path.write_text(yaml.safe_dump(doc))
    journal, release = tmp_path / "faults.journal", tmp_path / "release"
    run.extra_env = {**s3_env, "EOS_FAULT_HOLD_IN_SINK": "300", "EOS_FAULT_HOLD_RELEASE": str(release),
                     "EOS_FAULT_FROM_BATCH": "1", "EOS_FAULT_JOURNAL": str(journal)}
    produce(run.bootstrap, run.events, 2000, seed=23)
    expected = expected_ids(2000, 23)
    cfg = run_config(run).model_copy(update={"checkpoint_dir": live})
    try:
        run.start()
        held = wait_until(lambda: re.search(r"holding the driver after batch (\d+)",
                                            journal.read_text() if journal.exists() else ""),
                          "the driver to be held after a batch reached the sink", 240, run.log_tail, 0.5)
        batch = int(held.group(1))
        in_sink = {int(m.key()) for m in read_committed(run.bootstrap, run.counts)}
        s3_server.stop_server(st, kill=True)
        release.touch()
        assert run.proc.wait(180) not in (0, None), run.log_tail()      # commits/N could not be written
        s3_server.start_server(st)
        assert checkpoint.last_committed_batch(live) == batch - 1, "commits/N was written after all"
        resolve(cfg, timeout_s=60)
        run.extra_env = dict(s3_env, **({"EOS_UNSAFE_DISABLE": "ledger-skip"} if safety == "off" else {}))
        run.start()
        wait_consumed(run, live, timeout=300)
        assert run.stop() == 0, run.log_tail()
    finally:
        if run.proc and run.proc.poll() is None:
            run.kill9()
        if s3_server.status(st)[0] != "running":
            s3_server.start_server(st)
    if safety == "on":
        assert_ids_exact(run, expected)
        replayed = [ln for ln in run.log_path.read_text(errors="replace").splitlines() if f"batch {batch} committed:" in ln]
        assert replayed and "2/2 slots skipped" in replayed[-1], replayed   # the restart found batch N in the sink
    else:   # the control: batch N's ids, in the sink before the outage, written again by the restart
        out = audit_ids(run.bootstrap, run.counts, expected)
        assert out.duplicates and set(out.duplicates) <= in_sink and not out.missing, out.violations()
