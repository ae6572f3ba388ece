"""What a driver takes at start: its generation (from the ledger's history) and its epoch.

Generations: the ledger keeps every (generation, slot count, first batch) that
wrote (``protocol.GenerationHistory``), so resolution fences every generation
that ever wrote and a re-created resource, whose status starts at generation 0
again, continues the stream's history (``protocol.effective_generation``).

Driver epochs: "never two drivers" without trusting that the old Pod is gone.

A driver on an unreachable node, or a second driver started by hand, keeps
running: its slot tasks fence the new driver's producers, and a fenced producer
simply fences again. So every driver start takes the next epoch of the stream
(recorded in ledger partition 0) and, before its query starts, marks it
(``mark``): under every transactional id of every generation that ever wrote,
it fences the id and writes an epoch marker into that slot's ledger partition,
and on the newest record of each slot of its own checkpoint and generation it
stamps the epoch. A slot task reads its record after its own fence (step 2 of
the write path), back from the partition's end, so it meets every marker
written since its last commit; a newer epoch there, or on its record, means a
newer driver runs the stream, whatever generation or checkpoint this one has,
and the task fails for good (``DriverSuperseded``) instead of fencing again.
An older driver's commit that raced the marker fails on the marker's fence
and, retried, reads it. The driver's own partition-0 writes go through one
transactional id per stream (``driver_producer``), which every start fences
first; ``EpochWatch`` looks once, before the run's first write.

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

from confluent_kafka import KafkaException, Producer

from . import faults, protocol
from .contract import DriverSuperseded, JobFailed
from .fencing import fence_config
from .ledger import (SinkUnavailable, base_config, idempotent_producer, ledger_consumer, produce_sync, read_latest,
                     records, refuse_foreign, watermarks)

log = logging.getLogger(__name__)


def generation(bootstrap: str, sec: dict[str, str], ledger_topic: str, stream_uid: str, requested: int,
               slots: int, next_batch: int, slots_from: str = "key") -> int:
    """The generation this driver writes under, recorded in the ledger's generation history with its slot
    count and how its slots are derived (``job.slotsFrom``)."""
    return claim_generation(bootstrap, sec, ledger_topic, stream_uid, requested, slots, next_batch, slots_from)[0]


def claim_generation(bootstrap: str, sec: dict[str, str], ledger_topic: str, stream_uid: str, requested: int,
                     slots: int, next_batch: int,
                     slots_from: str = "key") -> tuple[int, protocol.GenerationHistory]:
    """``generation`` and the history it wrote (every generation that ever wrote, this one included)."""
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
    return gen, updated


def read_generations(consumer, ledger_topic: str, stream_uid: str,
                     timeout_s: float = 30.0) -> protocol.GenerationHistory:
    return protocol.GenerationHistory.decode(read_latest(consumer, ledger_topic, protocol.BATCH_PARTITION,
                                                         protocol.generations_key(stream_uid),
                                                         timeout_s=timeout_s))


def take(bootstrap: str, sec: dict[str, str], ledger_topic: str, stream_uid: str) -> tuple[int, int]:
    """The next epoch of the stream, recorded in the ledger; and the offset of partition 0 from which an
    ``EpochWatch`` looks for newer ones (the end before this driver's record)."""
    consumer = ledger_consumer(bootstrap, sec)
    try:
        raw = read_latest(consumer, ledger_topic, protocol.BATCH_PARTITION, protocol.epoch_key(stream_uid))
        since = watermarks(consumer, ledger_topic, protocol.BATCH_PARTITION, 30.0)[1]
    finally:
        consumer.close()
    epoch = (protocol.EpochRecord.decode(raw).epoch if raw is not None else 0) + 1
    record = protocol.EpochRecord(epoch, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                  os.environ.get("HOSTNAME") or socket.gethostname())
    producer = idempotent_producer(bootstrap, sec)
    produce_sync(producer, ledger_topic, protocol.BATCH_PARTITION, protocol.epoch_key(stream_uid), record.encode())
    return epoch, since


def newest_epoch(bootstrap: str, sec: dict[str, str], ledger_topic: str, stream_uid: str) -> int:
    """The stream's newest epoch, as partition 0 records it (0 if none)."""
    consumer = ledger_consumer(bootstrap, sec)
    try:
        raw = read_latest(consumer, ledger_topic, protocol.BATCH_PARTITION, protocol.epoch_key(stream_uid))
    finally:
        consumer.close()
    return protocol.EpochRecord.decode(raw).epoch if raw is not None else 0


class EpochWatch:
    """Partition 0 since this driver took its epoch (and the few records before it), read before the run's
    first partition-0 write: a newer epoch stops the driver with that epoch named (later writes fail anyway:
    a newer driver's start fences this one's writer), and a record of another stream refuses the ledger: of
    two streams started together on one empty ``ledgerTopic``, whose start checks
    (``ledger_topic.check_ledger_topic``) both saw none of the other's records, at least one meets the other's
    here before it records a batch."""

    def __init__(self, bootstrap: str, sec: dict[str, str], ledger_topic: str, stream_uid: str, epoch: int,
                 since: int):
        self.consumer = ledger_consumer(bootstrap, sec)
        self.topic, self.uid, self.epoch = ledger_topic, stream_uid, epoch
        self.key = protocol.epoch_key(stream_uid).encode()
        self.position = max(0, since - 8)    # the start check read up to about there

    def check(self) -> None:
        """Raise ``DriverSuperseded`` if a newer epoch of the stream was taken."""
        low, high = watermarks(self.consumer, self.topic, protocol.BATCH_PARTITION, 30.0)
        newest = 0
        if high > max(low, self.position):
            for msg in records(self.consumer, self.topic, protocol.BATCH_PARTITION, max(low, self.position), high,
                               time.monotonic() + 30.0):
                refuse_foreign(self.topic, self.uid, msg.key())
                if msg.key() == self.key and msg.value() is not None:
                    newest = max(newest, protocol.EpochRecord.decode(msg.value()).epoch)
            self.position = high
        if newest > self.epoch:
            raise DriverSuperseded(f"a newer driver (epoch {newest}) runs this stream; this one (epoch "
                                   f"{self.epoch}) stops without writing to the ledger")

    def close(self) -> None:
        self.consumer.close()


def driver_producer(bootstrap: str, sec: dict[str, str], tx_prefix: str, unsafe: frozenset[str]) -> Producer:
    """The driver's partition-0 writer, transactional under ``<prefix>-driver``: its ``init_transactions``, at
    the driver's start before it takes its epoch, fences the previous driver's, so a superseded driver's
    next batch record fails (``write_driver_record``) instead of landing after the newer driver's. With
    ``stream-epoch`` switched off (the negative control) an id of its own that fences nothing."""
    txid = protocol.driver_transactional_id(tx_prefix)
    if faults.unsafe("stream-epoch", unsafe):
        txid = f"{txid}-unfenced-{os.getpid()}-{time.time_ns()}"
    producer = Producer({**base_config(bootstrap, sec), "transactional.id": txid, "acks": "all", "linger.ms": 0,
                         "transaction.timeout.ms": DRIVER_TRANSACTION_MS})
    producer.init_transactions(30)
    return producer


# A batch record's transaction lasts milliseconds: one left open by a killed driver holds partition 0's last
# stable offset back only this long, if no newer driver fences it first.
DRIVER_TRANSACTION_MS = 10_000


def write_driver_record(producer: Producer, topic: str, key: str, value: bytes,
                        more: tuple[tuple[str, bytes | None], ...] = ()) -> None:
    """``key: value`` (then ``more``) to partition 0 in one transaction of the driver's producer."""
    try:
        producer.begin_transaction()
        for k, v in ((key, value), *more):
            producer.produce(topic, value=v, key=k.encode(), partition=protocol.BATCH_PARTITION)
        producer.commit_transaction(30)
    except KafkaException as exc:
        err = exc.args[0]
        if err.fatal():
            raise DriverSuperseded(f"this driver's ledger writer was fenced ({err.str()}): a newer driver of the "
                                   "stream started; this one stops without writing to the ledger") from exc
        if err.txn_requires_abort():
            producer.abort_transaction(30)
        raise SinkUnavailable(f"could not write to {topic}[{protocol.BATCH_PARTITION}]: {err}") from exc


MARK_ROUNDS = 5


def mark(*, bootstrap: str, sec: dict[str, str], ledger_topic: str, tx_prefix: str, history: protocol.GenerationHistory,
         generation: int, stream_uid: str, checkpoint_id: str | None, epoch: int,
         transaction_timeout_ms: int) -> None:
    """Write ``epoch``'s marker into every ledger slot partition under every generation's transactional id of
    it (the fence aborts what a driver of that generation left open), and stamp it on the newest record of
    each slot of this checkpoint and generation."""
    t0 = time.monotonic()
    ids = sorted({(g, slot) for g, slots, _ in history.generations for slot in range(slots)})

    def one(g: int, slot: int) -> None:
        txid = protocol.transactional_id(tx_prefix, g, slot)
        own = g == generation and checkpoint_id is not None
        key = protocol.slot_key(stream_uid, checkpoint_id, g, slot) if own else None
        for round_no in range(MARK_ROUNDS):
            try:
                return _mark_one(bootstrap, sec, ledger_topic, txid, slot, key, stream_uid, epoch,
                                 transaction_timeout_ms)
            except KafkaException as exc:
                # A driver of that generation still running fenced the marker back: fence again.
                if round_no == MARK_ROUNDS - 1:
                    raise
                log.warning("epoch marker of %s: %s; fencing again", txid, exc.args[0])
                time.sleep(0.2 * 2 ** round_no)

    # Other generations' markers first: the own generation's read of a slot partition must not meet one of
    # them still open there (a ledger partition is per slot, shared by every generation): LedgerHeldBack.
    own = [gs for gs in ids if gs[0] == generation and checkpoint_id is not None]
    with ThreadPoolExecutor(max_workers=min(8, max(1, len(ids))), thread_name_prefix="eos-mark") as pool:
        for phase in ([gs for gs in ids if gs not in own], own):
            list(pool.map(lambda gs: one(*gs), phase))
    log.info("driver epoch %d marked in %d transactional ids of %d generation(s) in %.0f ms", epoch, len(ids),
             len(history.generations), (time.monotonic() - t0) * 1000)


def _mark_one(bootstrap: str, sec: dict[str, str], ledger_topic: str, txid: str, slot: int, key: str | None,
              stream_uid: str, epoch: int, transaction_timeout_ms: int) -> None:
    # A fencing producer (dense: no wait on librdkafka's sparse-connection timer; see eos_job.fencing).
    producer = Producer({**fence_config(bootstrap, faults.transactional_id(txid), sec, dense=True),
                         "transaction.timeout.ms": transaction_timeout_ms})
    consumer = ledger_consumer(bootstrap, sec) if key is not None else None
    partition = protocol.ledger_partition(slot)
    try:
        producer.init_transactions(transaction_timeout_ms / 1000)      # fence first, then read
        stamped = None
        if key is not None:
            raw = read_latest(consumer, ledger_topic, partition, key, held_back_ok=faults.unsafe("fence"))
            recorded = protocol.SlotLedgerRecord.decode(raw) if raw is not None else None
            if recorded is not None and recorded.epoch > epoch:
                raise DriverSuperseded(f"slot {slot} carries epoch {recorded.epoch}, newer than this "
                                       f"driver's {epoch}: another driver started since")
            stamped = replace(recorded, epoch=epoch) if recorded is not None else \
                protocol.SlotLedgerRecord(batch=-1, count=0, digest=0, epoch=epoch)
        producer.begin_transaction()
        producer.produce(ledger_topic, value=protocol.EpochRecord(epoch).encode(),
                         key=protocol.epoch_key(stream_uid).encode(), partition=partition)
        if stamped is not None:
            producer.produce(ledger_topic, value=stamped.encode(), key=key.encode(), partition=partition)
        producer.commit_transaction(transaction_timeout_ms / 1000)
    finally:
        if consumer is not None:
            consumer.close()
        producer.flush(0)
