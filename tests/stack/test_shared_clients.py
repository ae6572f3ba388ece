"""A consumer lent by eos_job.clients.SharedClients comes back as new: what one reader paused, the next reads."""
from __future__ import annotations

import time

from confluent_kafka import Producer, TopicPartition

from eos_job.clients import SOURCE, SharedClients


def first_offset(consumer, topic: str, timeout_s: float = 10.0) -> int | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = consumer.poll(0.5)
        if m is not None and not m.error():
            return m.offset()
    return None


def test_the_next_borrower_reads_a_partition_the_last_one_paused(bootstrap, topic):
    p = Producer({"bootstrap.servers": bootstrap})
    for _ in range(3):
        p.produce(topic, b"v", partition=0)
    assert p.flush(30) == 0
    clients = SharedClients()
    try:
        for reader in range(2):   # the replay horizon's reader pauses each partition once it has its record
            with clients.consumer({"bootstrap.servers": bootstrap}, SOURCE) as c:
                c.assign([TopicPartition(topic, 0, 1)])
                assert first_offset(c, topic) == 1, f"reader {reader} got nothing"
                c.pause([TopicPartition(topic, 0)])
        assert clients.created == 1, "the second reader borrowed the first one's consumer"
    finally:
        clients.close()
