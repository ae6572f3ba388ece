"""Resolution's batched ledger read (eos_job.ledger_scan) answers what one read per partition answers."""
from __future__ import annotations

import uuid

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from eos_job.ledger import ledger_consumer, read_latest
from eos_job.ledger_scan import read_latest_many

PARTS = 12


def test_the_batched_read_finds_each_partitions_newest_record_of_its_key(stack_env):
    bootstrap = stack_env["KAFKA_BOOTSTRAP"]
    topic = f"scan-{uuid.uuid4().hex[:8]}"
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(topic, PARTS, 1)])[topic].result(30)
        p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"scan-{topic}"})
        p.init_transactions(30)
        p.begin_transaction()
        wants = {}
        for part in range(PARTS):
            key = f"slot-{part}"
            wants[part] = key
            if part % 4 == 0:
                continue                                   # no record at all (an empty partition)
            writes = {1: [key], 2: [key] + ["noise"] * 20, 3: [key] * 3 + ["noise"] * 600}[part % 4]
            if part == 5:
                writes = ["noise"] * 30                   # records, none with the key
            for i, k in enumerate(writes):
                p.produce(topic, value=f"{k}-{i}".encode(), key=k.encode(), partition=part)
        p.commit_transaction(30)
        # As in resolution, read after the writer was fenced: its transaction's markers are written by then.
        Producer({"bootstrap.servers": bootstrap, "transactional.id": f"scan-{topic}"}).init_transactions(30)
        consumer = ledger_consumer(bootstrap)
        try:
            many = read_latest_many(admin, consumer, topic, wants, timeout_s=30)
            one = {part: read_latest(consumer, topic, part, key, timeout_s=30) for part, key in wants.items()}
        finally:
            consumer.close()
    assert many == one
    assert many[0] is None and many[5] is None and many[1] == b"slot-1-0" and many[2] == b"slot-2-0"
    assert many[3] == b"slot-3-2"                    # the newest of three, 600 records back
