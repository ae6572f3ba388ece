"""The newest record of a key in many ledger partitions at once (resolution reads every slot's).

One slot after another, a read costs a few round trips (its watermarks, then a window of records), about
33 ms a slot here: 34 s for 1,024 slots. Here the watermarks of all partitions come in one request, and
each round assigns every partition still looking, from the end of its window backwards, and reads them
together; a partition whose window did not hold the key looks again in a window eight times as large.
Call it only after the partitions' writers were fenced (see ledger.read_latest).
"""
from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from .ledger import SinkUnavailable, list_offsets


def read_latest_many(admin: AdminClient, consumer: Consumer, topic: str, wants: dict[int, str], *,
                     timeout_s: float = 30.0) -> dict[int, bytes | None]:
    """For each partition, the value of the newest committed record with its key (None if none)."""
    if not wants:
        return {}
    deadline = time.monotonic() + timeout_s
    tps = [TopicPartition(topic, p) for p in sorted(wants)]
    low = list_offsets(admin, tps, OffsetSpec.earliest(), timeout_s)
    high = list_offsets(admin, tps, OffsetSpec.latest(), timeout_s)   # the high watermarks, as read_latest
    found: dict[int, bytes | None] = {p: None for p in wants}
    # partition -> (start, end) of the window to read this round
    looking = {p: (max(low[(topic, p)], high[(topic, p)] - 8), high[(topic, p)]) for p in wants
               if high[(topic, p)] > low[(topic, p)]}
    window = 8
    while looking:
        hits = _scan(consumer, topic, looking, {p: wants[p].encode() for p in looking}, deadline)
        found.update(hits)
        window *= 8
        looking = {p: (max(low[(topic, p)], start - window), start) for p, (start, _) in looking.items()
                   if p not in hits and start > low[(topic, p)]}
    return found


def _scan(consumer: Consumer, topic: str, ranges: dict[int, tuple[int, int]], want: dict[int, bytes],
          deadline: float) -> dict[int, bytes]:
    """The last record with each partition's key within its [start, end), all partitions read together."""
    consumer.assign([TopicPartition(topic, p, start) for p, (start, _) in ranges.items()])
    open_ = set(ranges)
    hits: dict[int, bytes] = {}
    try:
        while open_:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SinkUnavailable(f"timed out reading ledger {topic} partitions {sorted(open_)[:10]}")
            for msg in consumer.consume(500, min(remaining, 0.5)):
                p, err = msg.partition(), msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        open_.discard(p)
                        continue
                    raise SinkUnavailable(f"reading ledger {topic}[{p}]: {err}")
                if p not in open_:
                    continue
                if msg.offset() >= ranges[p][1]:
                    open_.discard(p)
                    continue
                if msg.key() == want[p]:
                    hits[p] = msg.value()
                if msg.offset() >= ranges[p][1] - 1:
                    open_.discard(p)
    finally:
        consumer.unassign()
    return hits
