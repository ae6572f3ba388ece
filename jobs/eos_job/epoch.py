"""What a driver takes at start: its generation (from the ledger's history) and its epoch.

Generations: the ledger keeps every (generation, slot count, first batch) that
wrote (``protocol.GenerationHistory``), so resolution fences every generation
that ever wrote and a re-created resource, whose status starts at generation 0
again, continues the stream's history (``protocol.effective_generation``).

Driver epochs: "never two drivers" without trusting that the old Pod is gone.

A driver on an unreachable node, or a second driver started by hand, keeps
running: its slot tasks fence the new driver's producers, and a fenced producer
simply fences again. So every driver start takes the next epoch of the stream
(recorded in ledger partition 0) and, before its query starts, stamps it on the
newest ledger record of every slot of its checkpoint (fence, read, write the
same record with the new epoch, commit: the slot's own transactional id, so
the write path's fence-then-read order covers it). Every slot record the driver
writes afterwards carries its epoch. A slot task reads its record after its own
fence (step 2 of the write path); a record of a newer epoch means a newer
driver runs the stream, and the task fails for good (``DriverSuperseded``)
instead of fencing again. An older driver's commit that raced the stamp fails
on the stamp's fence and, retried, reads the stamp.

Two drivers that start within the same moment could read the same last epoch;
the operator never starts two at once, so that takes a second driver started by
hand at the same instant.
"""
from __future__ import annotations

import logging
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from confluent_kafka import Producer

from . import faults, protocol
from .contract import DriverSuperseded, JobFailed
from .fencing import fence_config
from .ledger import idempotent_producer, ledger_consumer, produce_sync, read_latest

log = logging.getLogger(__name__)


def generation(bootstrap: str, sec: dict[str, str], ledger_topic: str, stream_uid: str, requested: int,
               slots: int, next_batch: int, slots_from: str = "key") -> int:
    """The generation this driver writes under, recorded in the ledger's generation history with its slot
    count and how its slots are derived (``job.slotsFrom``)."""
    consumer = ledger_consumer(bootstrap, sec)
    try:
        history = read_generations(consumer, ledger_topic, stream_uid)
    finally:
        consumer.close()
    gen = protocol.effective_generation(requested, slots, history, slots_from)
    if gen != requested:
        log.warning("the ledger's generation history %s: running generation %d, not %d (a re-created stream "
                    "continues its history)", history.generations, gen, requested)
    if gen in history.slots_of() and (history.slots_of()[gen], history.slots_from(gen)) != (slots, slots_from):
        raise JobFailed(f"generation {gen} wrote {history.slots_of()[gen]} slots from "
                        f"{history.slots_from(gen)}, this spec asks for {slots} from {slots_from}: a change of "
                        "job.parallelism or job.slotsFrom needs a new transactional-id generation (an upgrade "
                        "through the operator bumps it); nothing was written")
    updated = history.with_generation(gen, slots, next_batch, slots_from)
    if updated != history:
        produce_sync(idempotent_producer(bootstrap, sec), ledger_topic, protocol.BATCH_PARTITION,
                     protocol.generations_key(stream_uid), updated.encode())
    return gen


def read_generations(consumer, ledger_topic: str, stream_uid: str,
                     timeout_s: float = 30.0) -> protocol.GenerationHistory:
    return protocol.GenerationHistory.decode(read_latest(consumer, ledger_topic, protocol.BATCH_PARTITION,
                                                         protocol.generations_key(stream_uid),
                                                         timeout_s=timeout_s))


def take(bootstrap: str, sec: dict[str, str], ledger_topic: str, stream_uid: str) -> int:
    """The next epoch of the stream, recorded in the ledger."""
    consumer = ledger_consumer(bootstrap, sec)
    try:
        raw = read_latest(consumer, ledger_topic, protocol.BATCH_PARTITION, protocol.epoch_key(stream_uid))
    finally:
        consumer.close()
    epoch = (protocol.EpochRecord.decode(raw).epoch if raw is not None else 0) + 1
    record = protocol.EpochRecord(epoch, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                  os.environ.get("HOSTNAME") or socket.gethostname())
    producer = idempotent_producer(bootstrap, sec)
    produce_sync(producer, ledger_topic, protocol.BATCH_PARTITION, protocol.epoch_key(stream_uid), record.encode())
    return epoch


def stamp(*, bootstrap: str, sec: dict[str, str], ledger_topic: str, tx_prefix: str, generation: int,
          stream_uid: str, checkpoint_id: str, slots: int, epoch: int, transaction_timeout_ms: int) -> None:
    """Put ``epoch`` on every slot's newest ledger record of this checkpoint and generation."""
    t0 = time.monotonic()

    def one(slot: int) -> None:
        txid = protocol.transactional_id(tx_prefix, generation, slot)
        key = protocol.slot_key(stream_uid, checkpoint_id, generation, slot)
        # A fencing producer (dense: no wait on librdkafka's sparse-connection timer; see eos_job.fencing).
        producer = Producer({**fence_config(bootstrap, faults.transactional_id(txid), sec, dense=True),
                             "transaction.timeout.ms": transaction_timeout_ms})
        consumer = ledger_consumer(bootstrap, sec)
        try:
            producer.init_transactions(transaction_timeout_ms / 1000)      # fence first, then read
            raw = read_latest(consumer, ledger_topic, protocol.ledger_partition(slot), key,
                              held_back_ok=faults.unsafe("fence"))
            recorded = protocol.SlotLedgerRecord.decode(raw) if raw is not None else None
            if recorded is not None and recorded.epoch > epoch:
                raise DriverSuperseded(f"slot {slot} carries epoch {recorded.epoch}, newer than this "
                                              f"driver's {epoch}: another driver started since")
            stamped = replace(recorded, epoch=epoch) if recorded is not None else \
                protocol.SlotLedgerRecord(batch=-1, count=0, digest=0, epoch=epoch)
            producer.begin_transaction()
            producer.produce(ledger_topic, value=stamped.encode(), key=key.encode(),
                             partition=protocol.ledger_partition(slot))
            producer.commit_transaction(transaction_timeout_ms / 1000)
        finally:
            consumer.close()
            producer.flush(0)

    with ThreadPoolExecutor(max_workers=min(8, slots), thread_name_prefix="eos-stamp") as pool:
        list(pool.map(one, range(slots)))
    log.info("driver epoch %d stamped on %d slots in %.0f ms", epoch, slots, (time.monotonic() - t0) * 1000)

