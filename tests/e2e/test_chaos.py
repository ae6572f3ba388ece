"""Chaos on the unique-id stream: SIGKILL the driver again and again at planned points of the write path
(inside an open slot transaction, while a commit is in flight, after a slot committed, after the batch
reached the sink but before Spark's commit log) and at random moments after progress; hard-kill the broker
under running commits; hold a transaction open past transaction.timeout.ms so Kafka aborts it; take the
sink away for longer than the transaction timeout. Then every id is in the output exactly once.

Honest accounting: a planned-fault run counts only if it ended by SIGKILL (a run that failed otherwise fails
the test), every run commits a batch before its kill, and the results say what each kill hit."""
from __future__ import annotations

import os
import random
import re
import time
from collections import Counter

import pytest

from eos_job import checkpoint
from eos_job.resolution import resolve
from eos_stack import kafka
from examples.colors.local_run import ColorsRun
from tests.e2e.job_runs import assert_ids_exact, run_config, wait_consumed
from tests.e2e.streams import IdFeed

pytestmark = pytest.mark.stack
RUNS = int(os.environ.get("EOS_CHAOS_RUNS", "8"))  # make test (every planned kill point once); make soak runs 100
TX_TIMEOUT_MS = 10_000
# Kafka aborts a timed-out transaction at its next check (transaction.abort.timed.out.transaction.cleanup.
# interval.ms, 10 s by default) after transaction.timeout.ms: hold longer than both.
HOLD_S = TX_TIMEOUT_MS / 1000 + 12
PLANNED = {   # kind -> the fault switches of the run (they fire from the run's second batch on)
    "in-transaction": {"EOS_FAULT_KILL_IN_TRANSACTION": "0.5"},
    "during-commit": {"EOS_FAULT_KILL_DURING_COMMIT": "0.5"},
    "after-slot-commit": {"EOS_FAULT_KILL_AFTER_COMMIT": "0.7"},
    "before-commit-log": {"EOS_FAULT_KILL_BEFORE_COMMIT_LOG": "1"},
}
CYCLE = ("random", *PLANNED)
SPECIAL = ("broker-hard-kill", "hold-open", "sink-outage")


def schedule(runs: int) -> list[str]:
    """The runs' kinds: the broker kill, the held transaction and the sink outage at a third, half and two thirds
    of the way; the other runs take ``CYCLE`` in turn, so eight runs try every planned kill point once."""
    at = {runs // 3: SPECIAL[0], runs // 2: SPECIAL[1], (2 * runs) // 3: SPECIAL[2]}
    kinds, j = [], 0
    for i in range(runs):
        if i in at:
            kinds.append(at[i])
        else:
            kinds.append(CYCLE[j % len(CYCLE)])
            j += 1
    return kinds


def _wait_exit(run: ColorsRun, timeout: float) -> int | None:
    try:
        return run.proc.wait(timeout)
    except Exception:  # noqa: BLE001 - still running
        return None


def _log_since(run: ColorsRun, offset: int) -> str:
    with open(run.log_path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def _what_a_random_kill_hit(ckpt) -> str:
    replay = checkpoint.replay_batch(ckpt)
    return f"inside batch {replay}" if replay is not None else "between batches"


def _journal_since(path, offset: int) -> str:
    if not path.exists():
        return ""
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


KILLED = {   # kind -> the journal line of its kill: (slot, batch), or (batch,) for the driver's kill point
    "in-transaction": re.compile(r"inside the open transaction of slot (\d+) of batch (\d+)"),
    "during-commit": re.compile(r"into the commit of slot (\d+) of batch (\d+)"),
    "after-slot-commit": re.compile(r"after slot (\d+) of batch (\d+) committed"),
    "before-commit-log": re.compile(r"after batch (\d+) reached the sink"),
}


def _what_the_kill_left(kind: str, journal_text: str, report) -> str:
    """What a planned kill hit, from resolution's report before the next start (read after its fence): an open
    transaction aborted, a slot's commit that landed, a batch in the sink without its commit log. Fails when
    the report contradicts the kill point the journal names."""
    per_slot = {int(s): b for s, b in report.last_committed_batch_per_slot.items()}
    found = [tuple(map(int, m.groups())) for m in KILLED[kind].finditer(journal_text)]
    assert found, f"{kind}: no kill line in the journal"
    outcomes = []
    for hit in found:
        if kind == "before-commit-log":
            (batch,) = hit
            assert (report.last_complete_batch or -1) >= batch, (kind, hit, report)
            assert (report.checkpoint_last_committed_batch or -1) < batch, (kind, hit, report)
            outcomes.append(f"batch {batch}: in the sink without its commit log")
            continue
        slot, batch = hit
        landed = per_slot.get(slot, -1) >= batch
        if kind == "in-transaction":
            assert not landed and report.open_transactions_aborted >= 1, (kind, hit, report)
            outcomes.append(f"slot {slot} batch {batch}: open transaction aborted")
        elif kind == "during-commit":
            assert landed or report.open_transactions_aborted >= 1, (kind, hit, report)
            outcomes.append(f"slot {slot} batch {batch}: commit " + ("landed" if landed else "aborted"))
        else:
            assert landed and (report.last_complete_batch or -1) < batch, (kind, hit, report)
            outcomes.append(f"slot {slot} batch {batch}: committed, batch not complete")
    return "; ".join(outcomes)


def _fault_line(text: str) -> str:
    lines = [ln.split("fault injection: ", 1)[1] for ln in text.splitlines() if "fault injection: killing" in ln]
    return lines[-1] if lines else ""


@pytest.mark.timeout(max(2700, RUNS * 60))   # make soak runs longer
def test_chaos_exactly_once(private_kafka, colors_run, tmp_path, report_result):
    # The broker this test SIGKILLs and takes down is its own (source, sink, ledger, transactions): the stack's
    # broker, which the tests running beside this one use, is never touched. (private_kafka is named before
    # colors_run: the broker goes after the drivers.)
    st = private_kafka.stack
    rng = random.Random(int(os.environ.get("EOS_CHAOS_SEED", "20261124")))
    run = colors_run(bootstrap=private_kafka.bootstrap, parallelism=2, max_offsets_per_trigger=3000,
                     module="examples.colors.ids", trigger_interval_ms=300, transaction_timeout_ms=TX_TIMEOUT_MS)
    run.setup()
    feed = IdFeed(run.bootstrap, run.events)
    feed.send(20_000, -1, 1_000_000)   # a backlog for the first runs, then a trickle: every run has new input
    feed.start()
    hit: Counter = Counter()
    journal: list[str] = []
    kinds = schedule(RUNS)
    assert set(kinds) >= {*PLANNED, *SPECIAL}, f"EOS_CHAOS_RUNS={RUNS} cannot try every kill point: {kinds}"
    failures_seen, outage, held = 0, 0.0, 0
    pending = None                       # (run, kind, journal) of a planned kill, checked by the next resolution
    outcomes: dict[str, list[str]] = {k: [] for k in PLANNED}
    try:
        for i in range(RUNS):
            assert feed.error is None, f"the event feed failed before run {i}: {feed.error!r}"
            kind = kinds[i]
            done = checkpoint.last_committed_batch(run.live_checkpoint)
            first = 0 if done is None else done + 1
            env = dict(PLANNED.get(kind, {}))
            if env:
                env["EOS_FAULT_FROM_BATCH"] = str(first + 1)   # the run commits `first` before its kill
            if kind == "hold-open":
                env = {"EOS_FAULT_HOLD_OPEN": str(HOLD_S), "EOS_FAULT_FROM_BATCH": str(first + 1)}
            journal_file = tmp_path / "faults.journal"
            env["EOS_FAULT_JOURNAL"] = str(journal_file)      # what a fault did, written before its kill
            run.extra_env = env
            jstart = journal_file.stat().st_size if journal_file.exists() else 0
            # Like the operator: resolution before every start; afterwards nothing is left open.
            report = resolve(run_config(run), timeout_s=60)
            assert report.fenced_transactional_ids >= 2
            if pending:
                left = _what_the_kill_left(pending[1], pending[2], report)
                outcomes[pending[1]].append(left)
                journal.append(f"  run {pending[0]} {pending[1]} left: {left}")
                pending = None
            offset = run.log_path.stat().st_size if run.log_path.exists() else 0
            run.start()
            run.wait_for_batches(1, timeout=240)               # progress before any kill
            if kind in PLANNED:
                code = _wait_exit(run, 90)
                text = _log_since(run, offset)
                if code == -9:
                    where = _fault_line(_journal_since(journal_file, jstart))
                    assert where, f"run {i}: killed, but no planned fault said where:\n{text[-3000:]}"
                    hit[kind] += 1
                    journal.append(f"run {i} {kind}: {where}")
                    pending = (i, kind, _journal_since(journal_file, jstart))
                    continue
                assert code is None, f"run {i} ({kind}) ended by exit {code}, not by its planned kill:\n{text[-3000:]}"
                run.kill9()   # the fault's draw never came up within 90 s: say so, do not count it as planned
                hit["random (planned fault did not fire)"] += 1
                journal.append(f"run {i} {kind}: did not fire; killed {_what_a_random_kill_hit(run.live_checkpoint)}")
                continue
            if kind == "broker-hard-kill":
                time.sleep(rng.uniform(0, 1.5))                 # batches (and their commits) are running
                kafka.hard_kill(st)
                journal.append(f"run {i}: broker SIGKILLed under running commits, restarted")
                if _wait_exit(run, 20) not in (None, -9):
                    failures_seen += 1                          # the query failed with the broker: restart it
                    continue
            elif kind == "hold-open":
                deadline = time.monotonic() + 120
                while "holding the transaction" not in _journal_since(journal_file, jstart) and \
                        time.monotonic() < deadline:
                    time.sleep(0.5)
                run.wait_for_batches(1, timeout=HOLD_S + 90)   # the aborted slot was written again
                text = _log_since(run, offset)
                assert "holding the transaction" in _journal_since(journal_file, jstart), text[-3000:]
                assert run.proc.poll() is None, text[-3000:]
                # The timeout-abort path really happened: the commit after the hold failed and the slot fenced
                # again (the batch then committed, as waited for above).
                assert "fencing again" in text, f"run {i}: the held transaction's commit did not fail:\n{text[-3000:]}"
                held += _journal_since(journal_file, jstart).count("holding the transaction")
                journal.append(f"run {i}: a transaction held {HOLD_S:.0f}s, past its {TX_TIMEOUT_MS / 1000:.0f}s "
                               "timeout; Kafka aborted it, the slot fenced again and wrote it once")
            elif kind == "sink-outage":
                feed.hold()
                kafka.down(st)
                down_at = time.monotonic()
                time.sleep(TX_TIMEOUT_MS / 1000 + 8)            # longer than the transaction timeout
                code = _wait_exit(run, 12)                      # does the job give up (never with success)?
                outage = time.monotonic() - down_at
                journal.append(f"run {i}: sink down {outage:.0f}s; job exit {code} (None = still retrying)")
                kafka.up(st)
                feed.resume()
                if code is not None and code != -9:
                    failures_seen += 1
                    assert code != 0, "the job must not report success while the sink is down"
                    continue
            else:
                code = _wait_exit(run, rng.uniform(0, 8))      # any moment after progress
                assert code is None, f"run {i}: the job exited on its own ({code}):\n{run.log_tail()}"
            where = _what_a_random_kill_hit(run.live_checkpoint)
            run.kill9()
            hit["random"] += 1
            journal.append(f"run {i} random kill: {where}")
        expected = feed.finish()
        report = resolve(run_config(run), timeout_s=60)
        if pending:
            outcomes[pending[1]].append(_what_the_kill_left(pending[1], pending[2], report))
        run.extra_env = {}
        run.start()
        wait_consumed(run, run.live_checkpoint, timeout=600)
        assert run.stop() == 0, run.log_tail()
    finally:
        feed.stop_flag.set()
        if run.proc and run.proc.poll() is None:
            run.kill9()
        if kafka.status(st)[0] != "running":
            kafka.up(st)
    assert_ids_exact(run, expected)
    print("\n".join(journal))
    left = {k: Counter(o.split(": ", 1)[-1] for line in v for o in line.split("; ")) for k, v in outcomes.items()}
    report_result(f"chaos: {sum(hit.values())} driver SIGKILLs ({dict(hit)}), 1 broker SIGKILL under commits, "
                  f"{held} transaction(s) held past the {TX_TIMEOUT_MS / 1000:.0f}s timeout, 1 sink outage of "
                  f"{outage:.0f}s ({failures_seen} job failure(s) from broker and sink, restarted); "
                  f"{len(expected)} unique ids out of {feed.sent + 20_000} events, every one exactly once; "
                  f"what the planned kills left, per resolution: {({k: dict(c) for k, c in left.items()})}")
    assert all(outcomes[k] for k in PLANNED), f"every planned kill point must have been hit at least once: {outcomes}"
