"""The replay horizon's assessment (pure) and the batch record that carries the positions."""
from __future__ import annotations

import json

from eos_job import checkpoint
from eos_job.horizon import PartitionView, assess
from eos_job.protocol import BatchCompleteRecord

NOW = 1_800_000_000.0          # epoch seconds
HOUR_MS = 3_600_000


def view(p: int = 0, *, earliest: int = 0, latest: int = 100, at: int | None = 100,
         age_s: float | None = None, retention_ms: int | None = HOUR_MS) -> PartitionView:
    ts = None if age_s is None else int((NOW - age_s) * 1000)
    return PartitionView("orders", p, earliest, latest, at, oldest_unprocessed_ms=ts, retention_ms=retention_ms)


def test_a_stream_that_has_read_everything_is_safe():
    h = assess(7, [view(0), view(1, earliest=40, latest=90, at=90)], NOW)
    assert (h.state, h.batch, h.backlog_records, h.lost_records, h.seconds_left) == ("Safe", 7, 0, 0, None)
    assert h.checked_at == "2027-01-15T08:00:00Z"


def test_a_backlog_young_enough_is_safe_and_reports_the_time_left():
    h = assess(7, [view(0, at=60, age_s=600)], NOW)     # 10 min old of 60 min retention
    assert (h.state, h.backlog_records, h.partition) == ("Safe", 40, "orders/0")
    assert h.seconds_left == 3000.0


def test_the_horizon_shrinks_past_half_the_retention_by_default():
    h = assess(7, [view(0, at=60, age_s=600), view(1, at=10, age_s=2400)], NOW)   # 40 of 60 min used
    assert (h.state, h.partition, h.backlog_records) == ("Shrinking", "orders/1", 130)
    assert h.seconds_left == 1200.0
    assert "in about 20 min" in h.message and "orders/1 offset 10" in h.message and "retention.ms" in h.message


def test_the_warning_threshold_can_be_set():
    old = [view(0, at=10, age_s=2400)]                    # 20 min left
    assert assess(7, old, NOW, warn_seconds=600).state == "Safe"
    assert assess(7, old, NOW, warn_seconds=1800).state == "Shrinking"


def test_records_deleted_before_they_were_read_are_reported_lost():
    h = assess(9, [view(0, earliest=150, latest=200, at=120), view(1, earliest=5, latest=9, at=0),
                   view(2, at=50, age_s=3000)], NOW)
    assert (h.state, h.lost_records, h.partition) == ("Exceeded", 35, "orders/0")
    assert h.backlog_records == 50 + 4 + 50
    assert "deleted 35 records" in h.message and "failOnDataLoss" in h.message


def test_topics_without_time_retention_and_partitions_the_stream_has_not_seen_never_warn():
    h = assess(3, [view(0, at=0, age_s=10**7, retention_ms=None), view(1, earliest=500, latest=900, at=None)], NOW)
    assert (h.state, h.lost_records, h.backlog_records, h.seconds_left) == ("Safe", 0, 100, None)


def test_batch_records_carry_the_source_positions_and_old_records_still_decode():
    rec = BatchCompleteRecord(4, 2, 10, 0, 0, {"orders": {"0": 12, "1": 7}})
    assert BatchCompleteRecord.decode(rec.encode()) == rec
    old = json.dumps({"batch": 3, "slots": 2, "count": 5, "skipped_slots": 0, "dead_letters": 1}).encode()
    assert BatchCompleteRecord.decode(old).source_offsets == {}


def test_kafka_offsets_merges_every_source_of_the_offset_log(tmp_path):
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "5").write_text(
        'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1}\n{"orders":{"1":7,"0":12}}\n{"audit":{"0":3}}\n')
    assert checkpoint.kafka_offsets(tmp_path, 5) == {"orders": {"0": 12, "1": 7}, "audit": {"0": 3}}


def test_lag_per_partition_is_the_records_beyond_the_positions_largest_first():
    h = assess(7, [view(0, at=60, age_s=600), view(1, latest=90, at=90), view(2, earliest=50, latest=80, at=20),
                   view(3, at=None)], NOW)
    # Partition 1 is caught up (left out), 3 is not in the positions yet (unknown), 2 lost 30 and lags 60.
    assert [(x.partition, x.records) for x in h.lag] == [(2, 60), (0, 40)]
    many = assess(7, [view(p, latest=1000 + p, at=0) for p in range(80)], NOW)
    assert len(many.lag) == 50 and many.lag[0].partition == 79 and many.lag[-1].records == 1030
