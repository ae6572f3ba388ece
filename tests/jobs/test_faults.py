"""The test-only fault hooks: off by default, enabled by the environment, and called by the sink and the
driver at their named points (the real kills are exercised by tests/e2e/test_job_runtime.py)."""
from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
from types import SimpleNamespace

import pytest

from eos_job import epoch, faults, process_tree, protocol, runtime, sink, slot_stats
from eos_job import writer as writer_module
from eos_job.contract import DriverSuperseded
from eos_job.faults import Faults
from eos_job.protocol import SlotLedgerRecord
from tests.jobs.sink_fakes import BASE, FakeSlotClients, slot_config, slot_rows

FAULT_ENV = (faults.KILL_AFTER_COMMIT_ENV, faults.KILL_BEFORE_COMMIT_LOG_ENV, faults.PARTIAL_BATCH_ENV,
             faults.DRIVER_PGID_ENV, faults.KILL_IN_TRANSACTION_ENV, faults.KILL_DURING_COMMIT_ENV,
             faults.HOLD_OPEN_ENV, faults.FROM_BATCH_ENV, faults.UNSAFE_ENV, faults.HOLD_RELEASE_ENV,
             faults.DRIVER_PID_ENV, faults.HOLD_IN_SINK_ENV)


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    saved = {name: os.environ.pop(name) for name in FAULT_ENV if name in os.environ}
    faults.reset()
    yield
    for name in FAULT_ENV:   # driver_starting() sets one itself
        os.environ.pop(name, None)
    os.environ.update(saved)
    faults.reset()


@pytest.fixture
def kills(monkeypatch):
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(process_tree, "_killpg", lambda pgid, sig: calls.append((pgid, sig)))
    monkeypatch.setattr(process_tree, "_kill", lambda pid, sig: calls.append((f"pid {pid}", sig)))
    return calls


@pytest.fixture
def sleeps(monkeypatch):
    calls: list[float] = []
    monkeypatch.setattr(faults, "_sleep", calls.append)
    return calls


def enable(monkeypatch, **env: str) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    faults.reset()


# ------------------------------------------------------------------ settings
def test_nothing_is_enabled_without_the_variables():
    assert Faults.from_env({}) == Faults()
    assert not faults.current().enabled
    assert not Faults.from_env({faults.KILL_AFTER_COMMIT_ENV: "", faults.KILL_BEFORE_COMMIT_LOG_ENV: "0",
                                faults.PARTIAL_BATCH_ENV: ""}).enabled


def test_the_variables_are_parsed():
    f = Faults.from_env({faults.KILL_AFTER_COMMIT_ENV: "0.7", faults.KILL_BEFORE_COMMIT_LOG_ENV: "1",
                         faults.PARTIAL_BATCH_ENV: "1:0"})
    assert (f.kill_after_commit, f.kill_before_commit_log, f.partial_batch) == (0.7, 1.0, (1, 0))
    assert f.enabled
    assert Faults.from_env({faults.PARTIAL_BATCH_ENV: "12:3"}).enabled


@pytest.mark.parametrize("env", [{faults.KILL_AFTER_COMMIT_ENV: "often"}, {faults.PARTIAL_BATCH_ENV: "3"},
                                 {faults.PARTIAL_BATCH_ENV: "a:b"}])
def test_a_malformed_setting_is_an_error_not_silently_off(env):
    with pytest.raises(ValueError):
        Faults.from_env(env)


def test_the_environment_is_read_once_per_process(monkeypatch):
    assert not faults.current().enabled
    monkeypatch.setenv(faults.KILL_AFTER_COMMIT_ENV, "1")
    assert not faults.current().enabled   # cached: the hot path never reads the environment again
    faults.reset()
    assert faults.current().kill_after_commit == 1.0


# ------------------------------------------------------------------ hooks
def test_disabled_hooks_do_nothing(kills, sleeps):
    faults.driver_starting()
    for batch in range(3):
        for slot in range(2):
            faults.before_slot_commit(batch, slot)
            faults.slot_committed(batch, slot)
        faults.batch_in_sink(batch)
    assert kills == [] and sleeps == []
    assert faults.DRIVER_PGID_ENV not in os.environ


def test_kill_after_commit_kills_the_drivers_process_group(monkeypatch, kills):
    enable(monkeypatch, **{faults.KILL_AFTER_COMMIT_ENV: "1"})
    faults.driver_starting()
    assert os.environ[faults.DRIVER_PGID_ENV] == str(os.getpgrp())
    assert os.environ[faults.DRIVER_PID_ENV] == str(os.getpid())
    monkeypatch.setenv(faults.DRIVER_PGID_ENV, "4242")   # a Python worker: the driver's group, not its own
    monkeypatch.delenv(faults.DRIVER_PID_ENV)            # (its process tree: test_a_kill_takes_every_process...)
    faults.slot_committed(5, 1)
    assert kills == [(4242, signal.SIGKILL)]


def test_kill_after_commit_without_a_recorded_group_kills_its_own(monkeypatch, kills):
    enable(monkeypatch, **{faults.KILL_AFTER_COMMIT_ENV: "1"})
    faults.slot_committed(0, 0)
    assert kills == [(os.getpgrp(), signal.SIGKILL)]


def test_kill_after_commit_is_drawn_per_slot(monkeypatch, kills):
    enable(monkeypatch, **{faults.KILL_AFTER_COMMIT_ENV: "0.5"})
    for batch in range(200):
        faults.slot_committed(batch, batch % 2)
    assert 40 < len(kills) < 160


def test_kill_before_commit_log_kills_the_driver_itself(monkeypatch, kills):
    enable(monkeypatch, **{faults.KILL_BEFORE_COMMIT_LOG_ENV: "1"})
    faults.slot_committed(0, 0)          # not this fault's point
    faults.before_slot_commit(0, 1)
    assert kills == []
    faults.batch_in_sink(0)
    assert kills == [(os.getpgrp(), signal.SIGKILL)]


def test_partial_batch_holds_the_other_slots_and_kills_after_the_chosen_one(monkeypatch, kills, sleeps):
    enable(monkeypatch, **{faults.PARTIAL_BATCH_ENV: "1:0", faults.DRIVER_PGID_ENV: "77"})
    faults.before_slot_commit(0, 1)      # before the faulted batch: nothing
    faults.slot_committed(0, 0)
    assert sleeps == [] and kills == []
    faults.before_slot_commit(1, 0)      # the chosen slot goes on
    assert sleeps == []
    faults.before_slot_commit(1, 1)
    assert sleeps == [faults.PARTIAL_HOLD_S] == [120]
    faults.slot_committed(1, 1)          # another slot (it would have been held): no kill
    assert kills == []
    faults.slot_committed(1, 0)
    assert kills == [(77, signal.SIGKILL)]
    faults.slot_committed(2, 0)          # "from that batch on"
    assert len(kills) == 2


# ------------------------------------------------------------------ where the sink and the driver call them
@pytest.fixture
def fake_sink(monkeypatch):
    """write_slot with its Kafka clients faked; returns the ordered calls and the fake ledger."""
    calls: list[str] = []
    ledger: dict[str, bytes] = {}
    clients = FakeSlotClients()
    monkeypatch.setattr(sink, "_slot_clients", lambda cfg, slot, fresh: clients)
    monkeypatch.setattr(sink, "read_latest", lambda consumer, topic, partition, key, **_: ledger.get(key))

    def transaction(cfg, clients, slot, key, rows, round_no, verdicts):
        calls.append("commit")
        count, digest = rows.drain()
        ledger[key] = SlotLedgerRecord(cfg.batch, count, digest).encode()
        return 0

    monkeypatch.setattr(sink, "_transaction", transaction)
    monkeypatch.setattr(faults, "before_slot_commit", lambda batch, slot: calls.append(f"before {batch}/{slot}"))
    monkeypatch.setattr(faults, "slot_committed", lambda batch, slot: calls.append(f"committed {batch}/{slot}"))
    return calls, ledger


def test_the_sink_calls_the_hooks_around_the_slot_transaction(fake_sink):
    calls, _ = fake_sink
    commit = sink.write_slot(slot_config(3), 1, 0, slot_rows(4))
    assert not commit.skipped and commit.count == 4
    assert calls == ["before 3/1", "commit", "committed 3/1"]


def test_a_slot_stops_on_a_newer_marker_its_read_met_unless_stream_epoch_is_switched_off(monkeypatch, fake_sink):
    calls, _ = fake_sink
    marker = protocol.epoch_key("u").encode()

    def read_latest(consumer, topic, partition, key, met=None, **_):
        met[marker] += [protocol.EpochRecord(9).encode(), protocol.EpochRecord(4).encode()]
        return None

    monkeypatch.setattr(sink, "read_latest", read_latest)
    cfg = dataclasses.replace(slot_config(3), stream_uid="u", epoch=8)
    with pytest.raises(DriverSuperseded, match="epoch 9"):
        sink.write_slot(cfg, 1, 0, slot_rows(4))
    assert calls == []
    unsafe = dataclasses.replace(cfg, unsafe=frozenset({"stream-epoch"}))
    assert not sink.write_slot(unsafe, 1, 0, slot_rows(4)).skipped        # the control writes
    assert calls == ["before 3/1", "commit", "committed 3/1"]


def test_no_hook_runs_for_a_skipped_or_empty_slot(fake_sink):
    calls, _ = fake_sink
    sink.write_slot(slot_config(3), 1, 0, slot_rows(4))
    calls.clear()
    assert sink.write_slot(slot_config(3), 1, 1, slot_rows(4)).skipped   # the replay finds the ledger record
    assert sink.write_slot(slot_config(4), 0, 0, slot_rows(0)).count == 0
    assert calls == []


class _Df:
    def __init__(self, rows):
        self.rows = rows

    def repartition(self, *_):
        return self

    def mapInArrow(self, *_):
        return self

    def collect(self):
        return self.rows


class _Row(dict):
    def asDict(self):
        return dict(self)


def test_the_driver_calls_batch_in_sink_after_the_batch_complete_record(monkeypatch, tmp_path, caplog):
    calls: list[str] = []
    for n in (6, 7):
        (tmp_path / "offsets").mkdir(exist_ok=True)
        (tmp_path / "offsets" / str(n)).write_text(f'v1\n{{"batchTimestampMs":1}}\n{{"t":{{"0":{n * 10}}}}}\n')
    writer = runtime.BatchWriter.__new__(runtime.BatchWriter)
    writer.__dict__.update(slots=2, slots_from="key", sink_writer="python", lock=threading.Lock(), stopping=False, summary=runtime.RunSummary("Running"),
                           last_done=None, _ckpt_id="c", _producer=object(), _nondet_total=0, _watch=None,
                           config=SimpleNamespace(checkpoint_dir=str(tmp_path)), base=dict(BASE, epoch=3), history={},
                           output_hash="h", checked=True, input_slots=False, slot_stats=slot_stats.SlotStats())
    monkeypatch.setattr(writer, "_source_positions", lambda batch: {}, raising=False)
    monkeypatch.setattr(writer_module.BatchWriter, "checkpoint_identity", lambda self: "c")
    monkeypatch.setattr(epoch, "write_driver_record", lambda _p, _t, key, value, **kw: calls.append(
        ("complete " if b'"complete": true' in value else "intent ") + key.rsplit("/", 1)[-1]))
    monkeypatch.setattr(faults, "batch_in_sink",
                        lambda batch: calls.append(f"in sink {batch} (last done {writer.last_done})"))
    rows = [_Row({**protocol.SlotCommit(s, 7, 2, 5, skipped=False).to_row(),
                  **slot_stats.SlotStats(tasks=1, new_producers=1, fences=1, ledger_reads=1).to_row()})
            for s in range(2)]
    with caplog.at_level(logging.INFO, logger="eos_job"):
        writer(_Df(rows), 7)
    assert "batch 7 slot tasks 2: 0 pool hits, 2 new producers, 0 stale, 2 fences, 2 ledger reads" in caplog.text
    assert writer.slot_stats.fences == 2
    # The input record before any slot runs; the completion (with the batch-complete record) after all did,
    # and the fault point after that, before the batch counts as done.
    assert calls == ["intent 7", "complete 7", "in sink 7 (last done None)"]
    assert writer.history[7].input == {"t": {"0": [60, 70]}} and writer.history[7].complete
    assert writer.last_done == 7 and writer.summary.records == 4


def test_kills_inside_the_transaction_and_during_the_commit_fire_from_their_batch_on(monkeypatch, kills):
    enable(monkeypatch, **{faults.KILL_IN_TRANSACTION_ENV: "1", faults.FROM_BATCH_ENV: "5",
                           faults.DRIVER_PGID_ENV: "4242"})
    faults.in_transaction(4, 0, 0)
    assert kills == []                               # the run must commit something first
    faults.in_transaction(5, 1, 0)
    assert kills == [(4242, signal.SIGKILL)]
    kills.clear()
    enable(monkeypatch, **{faults.KILL_DURING_COMMIT_ENV: "1", faults.FROM_BATCH_ENV: "0"})
    done = threading.Event()
    monkeypatch.setattr(process_tree, "_killpg", lambda pgid, sig: (kills.append((pgid, sig)), done.set()))
    faults.committing(0, 0)                          # returns at once: the commit goes on while the timer runs
    assert done.wait(5) and kills == [(4242, signal.SIGKILL)]


def test_a_held_transaction_is_held_once_per_slot_task(monkeypatch, sleeps, kills):
    enable(monkeypatch, **{faults.HOLD_OPEN_ENV: "12"})
    faults.in_transaction(3, 0, 0)
    faults.in_transaction(3, 0, 1)                   # the retry after Kafka aborted it on the timeout
    assert sleeps == [12.0] and kills == []


def test_unsafe_switches_are_named_and_unknown_ones_refused(monkeypatch):
    enable(monkeypatch, **{faults.UNSAFE_ENV: "input-check"})
    assert faults.unsafe("input-check") and not faults.unsafe("ledger-skip")
    with pytest.raises(ValueError, match="unknown safety"):
        faults.parse_unsafe({faults.UNSAFE_ENV: "fence,typo"})


# ------------------------------------------------------------------ the second guard (issue 27)
def test_the_driver_reads_the_switches_once_and_carries_them_into_the_slot_config(monkeypatch):
    from eos_job.spec import ExactlyOnceStreamSpec, RunConfig, StreamIdentity
    config = RunConfig(stream=StreamIdentity(name="s", uid="u"), checkpoint_dir="/c", spec=ExactlyOnceStreamSpec(
        job={"module": "m"}, source={"bootstrapServers": "k:9092", "topics": ["in"]},
        sink={"bootstrapServers": "k:9092", "topic": "out"}, checkpoint={"store": "local", "path": "/c"}))
    assert writer_module.BatchWriter(config).base["unsafe"] == frozenset()
    enable(monkeypatch, **{faults.UNSAFE_ENV: "ledger-skip,fence"})
    assert writer_module.BatchWriter(config).base["unsafe"] == {"ledger-skip", "fence"}
    monkeypatch.setenv(faults.UNSAFE_ENV, "input-check")
    assert faults.unsafe_switches() == {"ledger-skip", "fence"}     # read once, at the driver's start


def test_a_spark_task_never_takes_the_switches_from_its_environment(monkeypatch):
    enable(monkeypatch, **{faults.UNSAFE_ENV: "ledger-skip,fence"})
    assert not faults._in_spark_task()                               # this test process is no Spark task
    monkeypatch.setattr(faults, "_in_spark_task", lambda: True)
    assert faults.unsafe_switches() == frozenset()
    assert not faults.unsafe("ledger-skip") and faults.transactional_id("eos-s-0-1") == "eos-s-0-1"


def test_a_worker_with_the_switch_in_its_environment_but_not_in_its_config_stays_safe(monkeypatch, fake_sink):
    """spark.executorEnv.EOS_UNSAFE_DISABLE reached a worker's environment: it changes nothing; only the set the
    driver put into the slot's config switches a safety off."""
    calls, _ = fake_sink
    enable(monkeypatch, **{faults.UNSAFE_ENV: "ledger-skip,fence"})
    clients = sink._SlotClients.__new__(sink._SlotClients)
    made: list[dict] = []
    import confluent_kafka
    monkeypatch.setattr(confluent_kafka, "Producer", lambda conf: made.append(conf) or SimpleNamespace(
        init_transactions=lambda timeout: None))
    monkeypatch.setattr(sink, "ledger_consumer", lambda *a: SimpleNamespace(unassign=lambda: None))
    clients.__init__(slot_config(3), 1)
    assert made[0]["transactional.id"] == protocol.transactional_id("p", 0, 1)   # its own id: the fence holds
    assert made[0]["enable.sparse.connections"] is False   # dense: the fence finds its broker connected
    sink.write_slot(slot_config(3), 1, 0, slot_rows(4))
    calls.clear()
    assert sink.write_slot(slot_config(3), 1, 1, slot_rows(4)).skipped and calls == []   # the ledger skip holds
    unsafe = sink.SlotWriterConfig(**BASE, checkpoint_id="c", batch=3, unsafe=frozenset({"ledger-skip"}))
    assert not sink.write_slot(unsafe, 1, 2, slot_rows(4)).skipped             # the driver's set does switch it
    assert calls == ["before 3/1", "commit", "committed 3/1"]


def test_a_held_transaction_ends_early_once_its_release_file_exists(monkeypatch, tmp_path):
    release = tmp_path / "release"
    enable(monkeypatch, **{faults.HOLD_OPEN_ENV: "60", faults.HOLD_RELEASE_ENV: str(release)})
    threading.Timer(0.3, release.touch).start()
    started = time.monotonic()
    faults.in_transaction(0, 0, 0)
    assert 0.2 < time.monotonic() - started < 10


def test_transactional_ids_are_the_slots_own_unless_the_fence_is_switched_off(monkeypatch):
    assert faults.transactional_id("eos-s-0-1") == "eos-s-0-1"
    enable(monkeypatch, **{faults.UNSAFE_ENV: "fence"})
    a, b = faults.transactional_id("eos-s-0-1"), faults.transactional_id("eos-s-0-1")
    assert a != b and a.startswith("eos-s-0-1-unfenced-")     # each producer its own id: it fences nothing


def test_a_stop_signal_while_the_main_thread_holds_the_stop_events_lock_still_stops():
    """The SIGTERM handler runs in the main thread, which sits in stop_event.wait(); a signal landing while that
    thread holds the Event's lock (entering or leaving the wait) must not make the handler wait for the same
    lock: the driver then never stopped gracefully (seen in a clean-clone run: an upgrade's snapshot not taken)."""
    stop = threading.Event()
    saved = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        runtime.install_signal_handlers(stop)
        handler = signal.getsignal(signal.SIGTERM)
        returned = threading.Event()

        def main_thread_inside_wait():
            with stop._cond:                      # what Event.wait holds at its entry and exit
                handler(signal.SIGTERM, None)
            returned.set()

        threading.Thread(target=main_thread_inside_wait, daemon=True).start()
        assert returned.wait(5), "the handler blocked on the stop event's lock, which its own thread held"
        assert stop.wait(5), "the stop was never requested"
    finally:
        signal.signal(signal.SIGTERM, saved[0])
        signal.signal(signal.SIGINT, saved[1])


def test_a_kill_takes_every_process_of_the_driver_even_in_a_group_of_its_own(tmp_path):
    """A real process tree: the "driver" (a session of its own, as a Pod's) starts a "daemon" that puts itself in
    a process group of its own, as PySpark's daemon does with its workers. The kill takes both (killing the
    driver's group alone, as the faults did, left the daemon and its workers running)."""
    import subprocess
    import sys

    pids = tmp_path / "pids"
    daemon = ("import os,time,sys; os.setpgid(0,0); open(sys.argv[1],'a').write(f'{os.getpid()}\\n'); "
              "time.sleep(600)")
    driver_code = ("import subprocess,sys,os,time; open(sys.argv[1],'a').write(f'{os.getpid()}\\n'); "
           f"subprocess.Popen([sys.executable,'-c',{daemon!r},sys.argv[1]]); time.sleep(600)")
    driver = subprocess.Popen([sys.executable, "-c", driver_code, str(pids)], start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(pids.read_text().split() if pids.exists() else []) < 2:
            time.sleep(0.05)
        _, daemon_pid = (int(p) for p in pids.read_text().split())
        assert os.getpgid(daemon_pid) == daemon_pid != os.getpgid(driver.pid)
        assert process_tree.descendants(driver.pid) == [driver.pid, daemon_pid]
        os.environ[faults.DRIVER_PID_ENV] = str(driver.pid)
        os.environ[faults.DRIVER_PGID_ENV] = str(os.getpgid(driver.pid))
        faults.kill_driver()
        assert driver.wait(30) == -signal.SIGKILL
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _alive(daemon_pid):
            time.sleep(0.05)
        assert not _alive(daemon_pid), "the daemon in its own process group survived the kill"
    finally:
        if driver.poll() is None:
            driver.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"     # a zombie waits for its (dead) parent's reaper
    except FileNotFoundError:
        return False


def test_the_driver_is_held_once_after_a_batch_reached_the_sink_until_released(monkeypatch, tmp_path):
    release = tmp_path / "release"
    slept = []
    monkeypatch.setattr(faults, "_sleep", lambda s: (slept.append(s), release.touch()))
    enable(monkeypatch, **{faults.HOLD_IN_SINK_ENV: "60", faults.HOLD_RELEASE_ENV: str(release),
                           faults.FROM_BATCH_ENV: "2"})
    faults.batch_in_sink(1)
    assert not slept                                   # before the first faulted batch
    faults.batch_in_sink(2)
    assert len(slept) == 1                             # held until the release file appeared
    faults.batch_in_sink(3)
    assert len(slept) == 1                             # once per process
