"""A slot's records handed to its transactional producer: the produce loop of the slot task (``sink``).

The common case (key and value only, nothing to route, no record that may be over its topic's limit) is a
lean loop; the rest looks at each record: its own topic, partition and headers, an error the job attached,
what the broker already said of it (``poison.Verdicts``), its size. ``cfg`` is the slot task's
``sink.SlotWriterConfig``.
"""
from __future__ import annotations

import pyarrow as pa

from . import poison
from .audit import audit_headers

QUEUE_FULL_WAITS = 120   # half-second waits for room in librdkafka's queue before the slot fences again


def produce_batch(cfg, producer, b: pa.RecordBatch, slot: int, on_delivery,
                   verdicts: poison.Verdicts) -> int:
    from confluent_kafka import KafkaException

    names = b.schema.names
    keys = b.column(names.index("key")).to_pylist() if "key" in names else [None] * b.num_rows
    values = b.column(names.index("value")).to_pylist()
    topics = b.column(names.index("topic")).to_pylist() if "topic" in names else None
    parts = b.column(names.index("partition")).to_pylist() if "partition" in names else None
    headers = b.column(names.index("headers")).to_pylist() if "headers" in names else None
    errors = b.column(names.index("error")).to_pylist() if "error" in names else None
    produce = producer.produce
    default_topic = cfg.topic
    # Every record names its slot and batch (eos_job.audit): what `kubectl eos verify` checks; the stream may
    # opt out (sink.auditHeaders: false), as the headers cost about as much as the rest of this loop.
    audit = audit_headers(cfg.checkpoint_id, cfg.generation, slot, cfg.batch) if cfg.audit else None
    limits = poison.checked_limits(cfg.producer_config, cfg.topic_limits)
    if (topics is None and parts is None and headers is None and errors is None and not verdicts
            and not may_be_too_large(b, limits.get(default_topic))):
        # The common case, kept lean: key/value only, nothing to route.
        dead = 0
        for k, v in zip(keys, values):
            try:
                produce(default_topic, v, k, headers=audit, on_delivery=on_delivery)
            except BufferError:
                send(producer, default_topic, v, k, audit, None, on_delivery)
            except KafkaException as exc:
                if not poison.refused_on_produce(exc.args[0]):
                    raise   # not the record's fault: fence again (write_slot)
                dead += 1
                send(producer, *poison.dead_letter(cfg, default_topic, k, v, f"KafkaException: {exc.args[0]}",
                                                    slot), None, None)
        return dead
    dead = 0
    for i in range(b.num_rows):
        topic = (topics[i] if topics is not None else None) or default_topic
        k, v = keys[i], values[i]
        why = errors[i] if errors is not None else None
        ident = poison.identity(topic, k, v) if verdicts else None
        if why is None and ident is not None:
            why = verdicts.poison.get(ident)
        if why is None and limits:
            why = poison.too_large(topic, k, v, limits)
        if why is None:
            hdrs = ([(h["key"], h["value"]) for h in headers[i]] + (audit or []) if headers is not None and headers[i]
                    else audit)
            part = parts[i] if parts is not None else None
            alone = ident is not None and ident in verdicts.suspects
            try:
                if alone:   # refused in a request of several: this time in a request of its own
                    flush(cfg, producer)
                send(producer, topic, v, k, hdrs, part, on_delivery)
                if alone:
                    flush(cfg, producer)
                continue
            except KafkaException as exc:  # refused before sending
                if not poison.refused_on_produce(exc.args[0]):
                    raise   # not the record's fault (an unknown partition, a fenced producer): fence again
                why = f"KafkaException: {exc.args[0]}"
        dead += 1
        send(producer, *poison.dead_letter(cfg, topic, k, v, why, slot), None, None)
    return dead


def may_be_too_large(b: pa.RecordBatch, limit: int | None) -> bool:
    """Whether a record of ``b`` may be over its topic's ``limit`` by itself: one vectorised look per batch
    keeps the per-record check off the common path."""
    if limit is None or b.num_rows == 0:
        return False
    import pyarrow.compute as pc
    names = b.schema.names
    size = pc.fill_null(pc.binary_length(b.column(names.index("value"))), 0)
    if "key" in names:
        size = pc.add(size, pc.fill_null(pc.binary_length(b.column(names.index("key"))), 0))
    return pc.max(size).as_py() + poison.BATCH_HEADER > limit


def send(producer, topic: str, value, key, headers, partition, on_delivery) -> None:
    """produce(), waiting for room while librdkafka's local queue is full (BufferError, _QUEUE_FULL)."""
    from confluent_kafka import KafkaError, KafkaException
    kw = {} if partition is None else {"partition": partition}
    for _ in range(QUEUE_FULL_WAITS):
        try:
            producer.produce(topic, value=value, key=key, headers=headers, on_delivery=on_delivery, **kw)
            return
        except BufferError:
            producer.poll(0.5)
    raise KafkaException(KafkaError(KafkaError._QUEUE_FULL, f"the producer's queue stayed full for "
                                                            f"{QUEUE_FULL_WAITS * 0.5:.0f}s"))


def flush(cfg, producer) -> None:
    """Wait until every record produced so far was answered: the next one goes in a request of its own."""
    from confluent_kafka import KafkaError, KafkaException
    if producer.flush(cfg.transaction_timeout_ms / 1000) > 0:
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "records not answered within the transaction "
                                                               "timeout while isolating a refused record"))
