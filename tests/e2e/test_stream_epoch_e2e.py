"""A zombie driver of an older generation stops once it comes back (issue 27, hole 2); and the stream epoch's
negative control.

Driver A (generation g, 2 slots) runs the unique-id stream while ids trickle in. Once it is idle between two
batches, every process of it (the driver, its JVM, PySpark's daemon and workers) is stopped with SIGSTOP: a
driver on a node that froze, or a paused container. A live snapshot of A's checkpoint seeds driver B with
another ``job.parallelism`` (3 slots) and so the next transactional-id generation g+1, as a parallelism
upgrade launches it. B commits a few batches; then A's processes are continued, with input still arriving
(A's maxOffsetsPerTrigger gives it a backlog of several batches).

A's slots fence their own transactional ids ``<prefix>-<g>-<p>`` and read their own ledger keys
``uid/ckpt/g/p``: B's epoch stamp is on generation g+1's keys only. With the stream epoch, B's start wrote an
epoch marker into every slot partition of the ledger under every generation's transactional id, and A stops
for good (termination reason Superseded, naming B's epoch) at its first batch, before it writes anything;
every id is in the output once. Here the driver's look at partition 0 (``EpochWatch``) stops A, before it
records the batch's input; its slots never run. A was stopped between batches, so that B, with another slot
count, restores a clean cut (a batch generation g partly committed is refused by generation g+1); the slots'
own meeting with the markers is the stack test's (``tests/stack/test_stream_epoch.py``). Without the stream
epoch (``EOS_UNSAFE_DISABLE=stream-epoch`` in A's environment: the markers are still written, A ignores them
and its partition-0 watch) A goes on writing what B writes too, and the unique-id audit reports the
duplicates.

A zombie of another checkpoint identity than B's is not a variant of this test: a restore copies the
checkpoint's ``metadata`` file, and with it the identity (``snapshot.restore_snapshot``,
``checkpoint.checkpoint_id``); only a stateless start (a fresh checkpoint) takes a new one."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal

import pytest
import yaml

from eos_job import checkpoint
from eos_job.process_tree import descendants
from eos_job.spec import StreamIdentity
from eos_job.verify import audit_ids
from eos_stack.cluster import wait_until
from tests.e2e.job_runs import assert_ids_exact, run_config, run_job, wait_consumed
from tests.e2e.streams import IdFeed

pytestmark = pytest.mark.stack

SLOTS_A, SLOTS_B = 2, 3


def _committed(run) -> list[int]:
    """The batches the run's log says it committed, in order."""
    if not run.log_path.exists():
        return []
    return [int(n) for n in re.findall(r"batch (\d+) committed:", run.log_path.read_text(errors="replace"))]


def _until(check, what: str, timeout: float, *alive) -> None:
    """``wait_until(check)``, failing at once, with its log's tail, when a driver of ``alive`` exits."""
    def gone():
        return next((run for run in alive if run.proc.poll() is not None), None)

    wait_until(lambda: check() or gone() is not None, what, timeout, alive[0].log_tail if alive else lambda: "")
    run = gone()
    assert run is None or check(), (f"driver {run.workdir.name.upper()} exited {run.proc.returncode} while waiting "
                                    f"for {what}:\n{run.log_tail(30)}")


def _stop_tree(root: int) -> list[int]:
    """SIGSTOP ``root`` and every process descending from it, parents first; scanned again until no process of
    the tree is left running (a child forked meanwhile is stopped too). Returns the processes stopped."""
    stopped: list[int] = []
    while True:
        new = [pid for pid in descendants(root) if pid not in stopped]
        if not new:
            break
        for pid in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
    wait_until(lambda: all(_state(pid) in ("T", "Z", None) for pid in stopped), "the driver's processes to stop",
               30, lambda: str({pid: _state(pid) for pid in stopped}), interval=0.1)
    return stopped


def _continue_tree(stopped: list[int]) -> None:
    for pid in reversed(stopped):        # children first: the driver goes on last
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2:].split()[0].decode()


def _config_b(cfg_a, restored, snap):
    """A's config as a parallelism upgrade launches it: the next generation, SLOTS_B slots, restored from the
    snapshot into a checkpoint of its own."""
    spec = cfg_a.spec.model_copy(update={"job": cfg_a.spec.job.model_copy(update={"parallelism": SLOTS_B})})
    stream = StreamIdentity(**{**cfg_a.stream.model_dump(), "generation": cfg_a.stream.generation + 1})
    return cfg_a.model_copy(update={"spec": spec, "stream": stream, "checkpoint_dir": str(restored),
                                    "restore_from": str(snap)})


# The control in `make soak` (57 s in make test before): tests/stack/test_stream_epoch.py's control of the same
# switch runs in `make test`.
@pytest.mark.parametrize("safety", ["on", pytest.param("off", marks=pytest.mark.soak)],
                         ids=["stream-epoch", "negative-control-without-it"])
def test_a_stopped_driver_of_an_older_generation_stops_when_it_comes_back(colors_run, tmp_path, safety,
                                                                           report_result):
    unsafe = {"EOS_UNSAFE_DISABLE": "stream-epoch"} if safety == "off" else {}
    a = colors_run(module="examples.colors.ids", parallelism=SLOTS_A, max_offsets_per_trigger=600,
                   work_dir=tmp_path / "a", extra_env=unsafe)
    a.setup()
    cfg = run_config(a)
    # 100 ids a second; A takes at most 600 a batch, so the backlog of its pause lasts it several batches.
    feed = IdFeed(a.bootstrap, a.events, chunk=30, pause=0.3)
    feed.send(300, 7, 1_000_000)
    a.start()
    stopped: list[int] = []
    try:
        feed.start()
        _until(lambda: len(_committed(a)) >= 2, "driver A to commit two batches", 240, a)
        # Between two batches: nothing arrives while A catches up, so it logs no next batch before it stops
        # (a restore with another slot count refuses a batch the older generation partly committed).
        feed.hold()
        wait_consumed(a, a.live_checkpoint)
        stopped = _stop_tree(a.proc.pid)
        feed.resume()
        at = checkpoint.last_committed_batch(a.live_checkpoint)
        assert checkpoint.last_offsets_batch(a.live_checkpoint) == at, "driver A stopped inside a batch"
        batches_before = len(_committed(a))

        snap = tmp_path / "snapshot"
        r = run_job(["snapshot", "take", "--checkpoint", str(a.live_checkpoint), "--dest", str(snap),
                     "--stream-json", json.dumps(cfg.stream.wire()), "--spec-hash", cfg.spec.spec_hash()])
        assert r.returncode == 0, r.stderr[-3000:]
        b = colors_run(module="examples.colors.ids", parallelism=SLOTS_B, max_offsets_per_trigger=600,
                       run_id=a.run_id, work_dir=tmp_path / "b")
        restored = tmp_path / "b" / "restored"
        b.config_path.write_text(yaml.safe_dump(_config_b(cfg, restored, snap).model_dump(by_alias=True,
                                                                                          mode="json")))
        b.start()
        _until(lambda: len([n for n in _committed(b) if n > at]) >= 3, "driver B to commit three batches", 300, b)

        _continue_tree(stopped)
        stopped = []
        # A stops at its first batch; or, superseded by nothing, it writes its backlog's batches beside B.
        _until(lambda: a.proc.poll() is not None or len(_committed(a)) >= batches_before + 3,
               "driver A to stop, or to commit three more batches, once it came back", 240, b)
        assert b.proc.poll() is None, b.log_tail(60)
    finally:
        _continue_tree(stopped)       # a failed wait leaves no stopped process behind (the fixture kills it)
        expected = feed.finish()
    wait_consumed(b, restored)
    assert b.stop() == 0, b.log_tail()
    exit_a = a.stop()

    log_a, log_b = a.log_path.read_text(), b.log_path.read_text()
    epoch_a = int(re.search(r"driver epoch (\d+), generation (\d+)", log_a).group(1))
    m = re.search(r"driver epoch (\d+), generation (\d+)", log_b)
    epoch_b, generation_b = int(m.group(1)), int(m.group(2))
    assert epoch_b > epoch_a and generation_b == cfg.stream.generation + 1, (epoch_a, m.group(0))
    after = len(_committed(a)) - batches_before
    audit = audit_ids(a.bootstrap, a.counts, expected)
    outcome = (f"driver A (epoch {epoch_a}, generation {cfg.stream.generation}, {SLOTS_A} slots) exited {exit_a} "
               f"after {after} more batches beside driver B (epoch {epoch_b}, generation {generation_b}, {SLOTS_B} "
               f"slots): {len(expected)} ids sent, {audit.records} records out, {len(audit.duplicates)} ids "
               f"written twice, {len(audit.missing)} missing")
    report_result(f"stream epoch {safety}: {outcome}")
    if safety == "on":
        assert audit.violations() == [], f"not exactly once: {audit.violations()}; {outcome}"
        summary = json.loads((a.workdir / "termination.json").read_text())
        assert exit_a == 1 and summary["reason"] == "Superseded", (summary, outcome)
        assert re.search(rf"\bepoch {epoch_b}\b", summary["error"]), summary
        assert after == 0, a.log_tail(80)
        assert_ids_exact(b, expected)
    else:
        assert exit_a == 0 and after >= 3, (outcome, a.log_tail(80))
        assert "UNSAFE: the stream-epoch safety" in log_a, a.log_tail(80)
        assert audit.duplicates, f"the verifier saw no violation without the stream epoch: {outcome}"
        assert not audit.missing, audit.violations()
