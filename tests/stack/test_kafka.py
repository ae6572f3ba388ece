"""The local Kafka broker really does transactions: commit, abort, isolation, fencing.

These are the broker guarantees the exactly-once sink is built on, checked
against the real broker that ``eos_stack`` runs (KRaft, Kafka 4.x).
"""
from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

TIMEOUT = 60.0


def txn_producer(bootstrap: str, transactional_id: str) -> Producer:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                  "transaction.timeout.ms": 60000, "linger.ms": 5})
    p.init_transactions(TIMEOUT)
    return p


def commit(p: Producer, topic: str, values: list[str]) -> None:
    p.begin_transaction()
    for v in values:
        p.produce(topic, key=v.encode(), value=v.encode())
    p.commit_transaction(TIMEOUT)


def read_until(bootstrap: str, topic: str, isolation: str, last_value: str) -> list[str]:
    """Every value in partition 0 from the beginning up to and including ``last_value``."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4().hex[:8]}",
                  "isolation.level": isolation, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest"})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        seen: list[str] = []
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                raise KafkaException(msg.error())
            seen.append(msg.value().decode())
            if seen[-1] == last_value:
                return seen
        pytest.fail(f"{isolation} consumer did not reach {last_value!r} within {TIMEOUT}s; saw {seen}")
    finally:
        c.close()


def test_read_committed_sees_only_committed_transactions(bootstrap, topic):
    p = txn_producer(bootstrap, f"tx-{uuid.uuid4().hex[:8]}")
    commit(p, topic, ["c0", "c1", "c2"])

    p.begin_transaction()
    for v in ["a0", "a1"]:
        p.produce(topic, key=v.encode(), value=v.encode())
    p.flush(TIMEOUT)  # the aborted records really are in the log, not only in the client
    p.abort_transaction(TIMEOUT)

    commit(p, topic, ["end"])  # a committed sentinel after the abort: both readers stop there

    assert read_until(bootstrap, topic, "read_committed", "end") == ["c0", "c1", "c2", "end"]
    assert read_until(bootstrap, topic, "read_uncommitted", "end") == ["c0", "c1", "c2", "a0", "a1", "end"]


def test_second_producer_with_same_transactional_id_fences_the_first(bootstrap, topic):
    tid = f"tx-{uuid.uuid4().hex[:8]}"
    old = txn_producer(bootstrap, tid)
    old.begin_transaction()
    old.produce(topic, value=b"zombie-0")
    old.flush(TIMEOUT)

    # The new instance's init_transactions bumps the epoch and aborts the open transaction.
    new = txn_producer(bootstrap, tid)

    with pytest.raises(KafkaException) as info:
        old.produce(topic, value=b"zombie-1")
        old.commit_transaction(TIMEOUT)
    err: KafkaError = info.value.args[0]
    assert err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH), err
    assert err.fatal(), f"fencing must be fatal for the old producer: {err}"
    old.purge()  # drop the undeliverable zombie-1 instead of a warning at exit

    commit(new, topic, ["fresh"])
    assert read_until(bootstrap, topic, "read_committed", "fresh") == ["fresh"]
    # The zombie's flushed record is in the log, but aborted.
    assert "zombie-0" in read_until(bootstrap, topic, "read_uncommitted", "fresh")


def test_cluster_ids_never_start_with_a_dash():
    """The storage tool reads `-t -abc...` as an option: a clean-clone `stack up` failed so once."""
    import base64

    from eos_stack.kafka import new_cluster_id
    ids = [new_cluster_id() for _ in range(3000)]
    assert not [i for i in ids if i.startswith("-")]
    assert all(len(base64.urlsafe_b64decode(i + "==")) == 16 for i in ids)
