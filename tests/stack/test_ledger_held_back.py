"""A ledger read that an open transaction holds back says so instead of answering short (issue 27, hole 2).

A read_committed consumer stops at the partition's last stable offset, which any open transaction holds back.
The slot's own fence leaves none of its own; a producer it did not fence (a driver of another generation still
running, another stream writing the ledger) can. Here a second transactional producer leaves a transaction open
on a ledger partition between two committed slot records: the read must raise
``LedgerHeldBack`` naming the partition and both offsets, not return the older record as the slot's newest."""
from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from eos_job.ledger import LedgerHeldBack, ledger_consumer, read_latest

pytestmark = pytest.mark.stack


def test_a_read_stopped_short_by_an_open_transaction_is_an_error_not_an_answer(stack_env):
    bootstrap = stack_env["KAFKA_BOOTSTRAP"]
    topic = f"held-ledger-{uuid.uuid4().hex[:8]}"
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(60)

    def producer(txid: str) -> Producer:
        p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txid})
        p.init_transactions(60)
        return p

    slot = producer(f"{topic}-slot")
    slot.begin_transaction()
    slot.produce(topic, key=b"k", value=b"batch 1", partition=1)
    slot.commit_transaction(60)
    other = producer(f"{topic}-other")          # never fenced by the slot's id
    other.begin_transaction()
    other.produce(topic, key=b"x", value=b"open", partition=1)
    other.flush(30)
    slot.begin_transaction()                     # the slot's newer record, behind the open transaction
    slot.produce(topic, key=b"k", value=b"batch 2", partition=1)
    slot.commit_transaction(60)

    consumer = ledger_consumer(bootstrap, {})
    try:
        with pytest.raises(LedgerHeldBack, match=rf"{topic}\[1\]: an open transaction holds its last stable offset"):
            read_latest(consumer, topic, 1, "k", timeout_s=30)
        other.abort_transaction(60)
        assert read_latest(consumer, topic, 1, "k", timeout_s=30) == b"batch 2"
    finally:
        consumer.close()
