"""Chaos: SIGKILL the driver again and again (also inside the commit window), restart the broker,
and take the sink away for longer than the transaction timeout; the output stays exactly once."""
from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter

import pytest

from eos_job.resolution import resolve
from eos_stack import kafka
from eos_stack.common import Stack
from examples.colors.generator import produce
from examples.colors.local_run import ColorsRun
from tests.e2e.exactness import assert_exactly_once
from tests.e2e.streams import run_config

pytestmark = pytest.mark.stack
RUNS = int(os.environ.get("EOS_CHAOS_RUNS", "15"))  # make test; make soak runs 100
TX_TIMEOUT_MS = 10_000


class EventFeed(threading.Thread):
    """Produces color events in small chunks while the job is being killed; knows the expected counts."""

    def __init__(self, bootstrap: str, topic: str, chunk: int = 100, pause: float = 2.0):
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.chunk, self.pause = bootstrap, topic, chunk, pause
        self.expected: Counter = Counter()
        self.sent = 0
        self.stop_flag = threading.Event()
        self.paused = threading.Event()
        self._producing = threading.Lock()
        self.error: Exception | None = None

    def run(self):
        try:
            while not self.stop_flag.is_set():
                with self._producing:
                    if not self.paused.is_set():
                        self.expected.update(produce(self.bootstrap, self.topic, self.chunk, seed=self.sent,
                                                     start_id=self.sent))
                        self.sent += self.chunk
                time.sleep(self.pause)
        except Exception as exc:  # noqa: BLE001 - surfaced by the test
            self.error = exc

    def hold(self) -> None:
        """Stop producing and wait for a chunk in flight to be delivered, so the broker can be taken down.

        A chunk still in flight when the broker went away failed its flush and ended the feed: every later
        run then had no input, and the test failed with nothing wrong in the job (seen in a CI run)."""
        self.paused.set()
        with self._producing:
            pass
        if self.error:
            raise self.error

    def resume(self) -> None:
        self.paused.clear()

    def finish(self) -> dict[str, int]:
        self.stop_flag.set()
        self.join(120)
        if self.error:
            raise self.error
        return dict(sorted(self.expected.items()))


def _wait_exit(run: ColorsRun, timeout: float) -> int | None:
    try:
        return run.proc.wait(timeout)
    except Exception:  # noqa: BLE001 - still running
        return None


@pytest.mark.timeout(2700)
def test_chaos_exactly_once(colors_run, stack_env, tmp_path, report_result):
    st = Stack()
    rng = random.Random(int(os.environ.get("EOS_CHAOS_SEED", "20261123")))
    run = colors_run(parallelism=2, max_offsets_per_trigger=3000,
                    trigger_interval_ms=300, transaction_timeout_ms=TX_TIMEOUT_MS)
    run.setup()
    # A backlog for the first runs, then a trickle so every run has new input to write.
    backlog = produce(run.bootstrap, run.events, 20_000, seed=-1, start_id=-20_000)
    feed = EventFeed(run.bootstrap, run.events)
    feed.expected.update(backlog)
    feed.start()
    kills = {"random": 0, "after-slot-commit": 0, "before-commit-log": 0}
    broker_restart_at, outage_at = RUNS // 3, (2 * RUNS) // 3
    failures_seen, outage = 0, 0.0
    try:
        for i in range(RUNS):
            assert feed.error is None, f"the event feed failed before run {i}: {feed.error!r}"
            kind = ("random", "after-slot-commit", "before-commit-log")[i % 3]
            if i in (broker_restart_at, outage_at):
                kind = "random"  # these runs must commit a batch first: no self-inflicted kill
            run.extra_env = {"after-slot-commit": {"EOS_FAULT_KILL_AFTER_COMMIT": "0.7"},
                             "before-commit-log": {"EOS_FAULT_KILL_BEFORE_COMMIT_LOG": "1"}}.get(kind, {})
            # Like the operator: resolution before every start; afterwards nothing is left open.
            report = resolve(run_config(run), timeout_s=60)
            assert report.fenced_transactional_ids >= 2
            run.start()
            if i == broker_restart_at:
                run.wait_for_batches(1)
                kafka.restart(st)
                print(f"run {i}: broker restarted under the running job")
            if i == outage_at:
                run.wait_for_batches(1)
                feed.hold()
                kafka.down(st)
                down_at = time.monotonic()
                time.sleep(TX_TIMEOUT_MS / 1000 + 8)  # longer than the transaction timeout
                code = _wait_exit(run, 40)           # does the job give up (never with success) or retry?
                outage = time.monotonic() - down_at
                print(f"run {i}: sink outage of {outage:.0f}s; job exit code {code} (None = still retrying)")
                kafka.up(st)
                feed.resume()
                if code is not None and code != -9:
                    failures_seen += 1
                    assert code != 0, "the job must not report success while the sink is down"
                    continue
            if kind == "random":
                # Any moment: JVM start-up, recovery, inside a batch, between batches.
                code = _wait_exit(run, rng.uniform(4, 24))
                if code is not None and i == broker_restart_at and code != 0:
                    failures_seen += 1  # the broker restart failed the query: the next run restarts it
                    continue
                if code is not None:
                    raise AssertionError(f"run {i}: the job exited on its own ({run.proc.returncode}):\n"
                                         f"{run.log_tail()}")
            elif _wait_exit(run, 90) == -9:
                kills[kind] += 1
                continue
            run.kill9()
            kills["random"] += 1
        expected = feed.finish()
        report = resolve(run_config(run), timeout_s=60)
        run.extra_env = {}
        run.start()
        run.wait_caught_up(expected, timeout=600)
        assert run.stop() == 0, run.log_tail()
    finally:
        feed.stop_flag.set()
        if run.proc and run.proc.poll() is None:
            run.kill9()
        if kafka.status(st)[0] != "running":
            kafka.up(st)
    assert_exactly_once(run.bootstrap, run.counts, run.ledger_topic(), expected, (run.dlq,))
    total = sum(kills.values())
    report_result(f"chaos: survived {total} SIGKILLs of the driver ({kills}), 1 broker restart, 1 sink outage of "
                  f"{outage:.0f}s against a transaction timeout of {TX_TIMEOUT_MS / 1000:.0f}s ({failures_seen} job "
                  f"failure(s) from it); {feed.sent} events, final counts exact: {expected}")
    assert total >= RUNS - 2
