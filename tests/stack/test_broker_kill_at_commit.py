"""A broker SIGKILLed when a slot's commit had landed but its answer had not reached the slot, and its negative
control, on a broker of this test alone (no Spark: the slot write path as the executors run it).

What a broker kill at commit time can do to a slot: the broker wrote the commit (its transaction markers are in
the log, and a restarted broker serves them), then died before answering, so the slot's ``commit_transaction``
fails and the slot does not know whether its batch is in the sink. The kill is real (SIGKILL of the test's own
broker, restarted on the same data); the moment is forced: the test's hook at the slot's "committed" point (a
fault hook outside the protocol's code) kills the broker and raises the transport error the slot would have
met had the kill come a moment earlier. The slot fences again once the broker is back and reads its ledger
record: its own commit, so it skips. With ``ledger-skip`` off (the negative control) it writes the batch again,
and the read_committed id audit must report every id of it twice.
"""
from __future__ import annotations

import threading
import uuid

import pyarrow as pa
import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from eos_job import faults, protocol, sink
from eos_job.ledger_topic import Durability, ensure_ledger_topic
from eos_job.verify import audit_ids, open_transactions
from eos_stack import kafka
from tests.harness.private import KAFKA_HEAP

pytestmark = pytest.mark.stack

TIMEOUT = 60.0
IDS = range(200)


@pytest.mark.parametrize("safety", ["on", "off"], ids=["ledger-skip", "negative-control-without-it"])
def test_a_commit_that_landed_unheard_before_a_broker_kill_is_not_written_again(private_kafka, monkeypatch, safety):
    bootstrap = private_kafka.bootstrap
    run = uuid.uuid4().hex[:8]
    out, ledger = f"test-bk-out-{run}", f"test-bk-ledger-{run}"
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        for fut in admin.create_topics([NewTopic(out, num_partitions=1, replication_factor=1)],
                                       operation_timeout=30).values():
            fut.result(timeout=TIMEOUT)
        ensure_ledger_topic(admin, ledger, 1, Durability(1, 1), timeout_s=TIMEOUT)

    restarted = threading.Event()
    kills: list[tuple[int, int]] = []

    def killed_before_the_answer(batch: int, slot: int) -> None:
        if kills:
            return
        kills.append((batch, slot))
        kafka.hard_kill(private_kafka.stack, start=False)         # the commit is in the broker's log
        threading.Thread(target=lambda: (kafka.up(private_kafka.stack, heap=KAFKA_HEAP), restarted.set()),
                         daemon=True).start()
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down before it answered the commit"))

    monkeypatch.setattr(faults, "slot_committed", killed_before_the_answer)
    unsafe = frozenset() if safety == "on" else frozenset({"ledger-skip"})
    cfg = sink.SlotWriterConfig(
        bootstrap=bootstrap, producer_config={}, topic=out, dead_letter_topic=None, ledger_topic=ledger,
        tx_prefix=f"eos-test-bk-{run}", generation=0, stream_uid=uuid.uuid4().hex, checkpoint_id="c",
        spec_hash="h", transaction_timeout_ms=60000, batch=0, slots=1, input="batch-0", output_hash="o",
        unsafe=unsafe)
    rows = pa.RecordBatch.from_pydict({"key": [str(i).encode() for i in IDS], "value": [b"%d" % i for i in IDS],
                                       protocol.HASH_COL: [i + 1 for i in IDS]})
    try:
        commit = sink.write_slot(cfg, 0, 0, iter([rows]))
    finally:
        sink._discard(cfg, 0)
    assert kills == [(0, 0)] and restarted.wait(120), "the broker was not killed at the commit, or not restarted"

    ids = audit_ids(bootstrap, out, set(IDS), TIMEOUT)
    assert open_transactions(bootstrap, [out, ledger]) == set()
    if safety == "on":
        assert commit.skipped and commit.count == len(IDS), commit      # its own commit, found in the ledger
        assert ids.violations() == [] and ids.records == len(IDS), ids.violations()
    else:
        assert not commit.skipped
        assert not ids.missing and sorted(ids.duplicates) == list(IDS), ids.violations()
