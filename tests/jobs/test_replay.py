"""Catching up a checkpoint that is behind the sink (eos_job.replay) on real checkpoint folders: the ledger's
history is the first source of a batch's input, the previous checkpoint (replayOffsetsFrom) fills in what the
ledger does not hold, and every batch is re-run through the same writer that judges it against the ledger."""
import json
import threading

import pytest

from eos_job import checkpoint, protocol, replay
from eos_job.contract import BatchRefused
from eos_job.storage import Loc

pytestmark = pytest.mark.unit

QUERY_ID = "3f0c6a52-0000-4000-8000-000000000001"


def offset_log(end: int) -> str:
    return "v1\n" + json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": end}) + "\n" + \
        json.dumps({"events": {"0": end}}) + "\n"


def make_ckpt(root, logged: range, committed: range, query_id: str = QUERY_ID) -> Loc:
    ckpt = Loc.of(root)
    (ckpt / "offsets").mkdir()
    (ckpt / "commits").mkdir()
    (ckpt / "metadata").write_text(json.dumps({"id": query_id}) + "\n")
    for n in logged:
        (ckpt / "offsets" / str(n)).write_text(offset_log(10 * (n + 1)))
    for n in committed:
        (ckpt / "commits" / str(n)).write_text("v1\n{}\n")
    return ckpt


def recorded(n: int, end: int | None = None) -> protocol.BatchHistoryRecord:
    end = 10 * (n + 1) if end is None else end
    return protocol.BatchHistoryRecord(n, 0, 2, {"events": {"0": [None, end]}}, offset_log(end), "o", True)


class Spark:
    """Stands in for one trigger of the query: commits the batch logged without a commit, noting its input."""

    def __init__(self, ckpt: Loc):
        self.ckpt, self.ran = ckpt, []

    def __call__(self, batch: int) -> None:
        assert checkpoint.replay_batch(self.ckpt) == batch
        self.ran.append((batch, checkpoint.kafka_offsets(self.ckpt, batch)["events"]["0"]))
        (self.ckpt / "commits" / str(batch)).write_text("v1\n{}\n")


def test_the_ledgers_input_wins_and_the_previous_checkpoint_fills_in_what_it_lacks(tmp_path):
    ckpt = make_ckpt(tmp_path / "restored", range(0, 3), range(0, 3))        # a snapshot at batch 2
    previous = make_ckpt(tmp_path / "live", range(0, 8), range(0, 7))         # the stream ran on to batch 7
    (previous / "offsets" / "4").write_text(offset_log(999))                  # not what the sink holds
    history = {n: recorded(n) for n in (3, 4, 5)}                             # 6 and 7: not in the ledger
    spark = Spark(ckpt)
    assert replay.catch_up(ckpt, history, spark, threading.Event(), previous) == 5
    assert spark.ran == [(3, 40), (4, 50), (5, 60), (6, 70), (7, 80)]


def test_a_snapshot_older_than_sparks_retained_offsets_is_caught_up_from_the_ledger(tmp_path):
    ckpt = make_ckpt(tmp_path / "restored", range(0, 3), range(0, 3))
    previous = make_ckpt(tmp_path / "live", range(5, 8), range(5, 7))         # Spark deleted offsets/0..4
    history = {n: recorded(n) for n in range(3, 6)}
    spark = Spark(ckpt)
    assert replay.catch_up(ckpt, history, spark, threading.Event(), previous) == 5
    assert [n for n, _ in spark.ran] == [3, 4, 5, 6, 7]


def test_a_batch_known_to_neither_is_refused_before_anything_runs(tmp_path):
    ckpt = make_ckpt(tmp_path / "restored", range(0, 3), range(0, 3))
    previous = make_ckpt(tmp_path / "live", range(5, 8), range(5, 7))
    spark = Spark(ckpt)
    with pytest.raises(BatchRefused, match=r"batch\(es\) \[3, 4\]"):
        replay.catch_up(ckpt, {}, spark, threading.Event(), previous)
    assert spark.ran == []


def test_another_lineage_and_the_checkpoint_itself_add_nothing(tmp_path):
    ckpt = make_ckpt(tmp_path / "restored", range(0, 3), range(0, 3))
    other = make_ckpt(tmp_path / "other", range(0, 8), range(0, 8), query_id="another-query")
    spark = Spark(ckpt)
    assert replay.catch_up(ckpt, {}, spark, threading.Event(), other) == 0
    assert replay.catch_up(ckpt, {}, spark, threading.Event(), ckpt) == 0
    assert spark.ran == []


def test_the_checkpoints_own_logged_batch_runs_as_logged_unless_the_ledger_says_otherwise(tmp_path):
    ckpt = make_ckpt(tmp_path / "c", range(0, 4), range(0, 3))               # offsets/3 logged, no commit
    spark = Spark(ckpt)
    assert replay.catch_up(ckpt, {3: recorded(3)}, spark, threading.Event()) == 1
    assert spark.ran == [(3, 40)]
    ckpt = make_ckpt(tmp_path / "d", range(0, 4), range(0, 3))
    spark = Spark(ckpt)
    assert replay.catch_up(ckpt, {3: recorded(3, end=33)}, spark, threading.Event()) == 1
    assert spark.ran == [(3, 33)]


def test_catch_up_plans_over_the_ledger_and_the_previous_checkpoint():
    history = {n: recorded(n) for n in (3, 4)}
    assert protocol.catch_up(2, history, frozenset(range(0, 8))) == ([3, 4, 5, 6, 7], None)
    assert protocol.catch_up(2, history, frozenset(range(6, 8)))[0] == []
    assert "[5]" in protocol.catch_up(2, history, frozenset(range(6, 8)))[1]
    no_log = {3: protocol.BatchHistoryRecord(3, 0, 2, {}, "", "o", True)}
    assert protocol.catch_up(2, no_log, frozenset({3}))[0] == [3]     # the previous checkpoint has its log
