"""Fakes of the sink's Kafka side shared by the job runtime's unit tests: a slot's clients as ``sink._SlotClients``
leaves them after its fence, a slot's rows, a slot writer's config."""
from __future__ import annotations

from types import SimpleNamespace

import pyarrow as pa

from eos_job import protocol, sink


class FakeSlotClients:
    """What ``sink._SlotClients`` holds right after its fence, with no Kafka behind it."""

    def __init__(self):
        self.consumer = SimpleNamespace(unassign=lambda: None)
        self.producer = object()
        self.fresh = True
        self.fence_ms = self.commit_ms = 0.0
        self.last_record, self.last_scope, self.clean = None, None, False   # as _SlotClients after its fence


def slot_rows(n: int) -> list[pa.RecordBatch]:
    return [pa.RecordBatch.from_pydict({"key": [b"k%d" % i for i in range(n)], "value": [b"v"] * n,
                                        protocol.HASH_COL: list(range(1, n + 1))})]


BASE = dict(bootstrap="x:9092", producer_config={}, topic="out", dead_letter_topic=None, ledger_topic="ledger",
            tx_prefix="p", generation=0, stream_uid="u", spec_hash="h", transaction_timeout_ms=1000, slots=2)


def slot_config(batch: int) -> sink.SlotWriterConfig:
    return sink.SlotWriterConfig(**BASE, checkpoint_id="c", batch=batch)
