"""The exactly-once Kafka sink: one transaction per output slot and micro-batch.

Why ``foreachBatch`` + ``mapInArrow`` and not the Python streaming data source
writer: ``foreachBatch`` hands the driver the batch id and lets it run the
batch-complete step after every slot reported and before Spark writes
``commits/N``; ``mapInArrow`` over ``repartition(P, key)`` gives each slot task
its rows as Arrow record batches (no per-row Python conversion by Spark) with
the slot equal to the shuffle partition id, which is deterministic across
replays (or, with ``job.slotsFrom: sourcePartitions``, over the source's own
tasks, each mapped to a slot by ``source_slots``). The data source writer would
give the same guarantees but its batch id reaches executors only through a
task-local property, and its commit runs after the data was already handed
over, which buys nothing here.

Write path of slot p in batch N (shared/design/exactly-once-protocol.md):
fence (``init_transactions``) → read the slot's latest ledger record
(read_committed) → skip if N is already recorded → else one transaction with
every output record and the slot's ledger record → commit → report. A producer
held in the worker and clean since its last commit (amendment A2,
docs/protocol-amendments.md) skips the fence and the read and decides on the
record it committed last; any failure of it discards it and falls back to
fence-then-read.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import pyarrow as pa

from . import faults, poison, protocol, slot_stats
from .contract import BatchRefused, DriverSuperseded
from .ledger import ledger_consumer, read_latest
from .protocol import SlotAction, SlotCommit, SlotLedgerRecord
from .slot_produce import produce_batch
from .slot_rows import SlotRows
from .slot_stats import SlotStats

log = logging.getLogger(__name__)

COMMIT_SCHEMA = ("slot int, batch long, count long, digest string, skipped boolean, dead_letters long, "
                 "nondeterministic boolean, attempt int, " + slot_stats.SCHEMA)

# Producer errors that mean "this producer can no longer be trusted": start over with a fresh fence.
MAX_FENCE_ROUNDS = 5
# Writes of a slot within one fence: a whole request refused, its records each alone, then dead letters.
POISON_ROUNDS = 3


@dataclass(frozen=True)
class SlotWriterConfig:
    """Everything a slot task needs; pickled to the executors once per batch."""
    bootstrap: str
    producer_config: dict[str, str] = field(repr=False)  # may carry SASL credentials: never printed
    topic: str
    dead_letter_topic: str | None
    ledger_topic: str
    tx_prefix: str
    generation: int
    stream_uid: str
    checkpoint_id: str
    spec_hash: str
    transaction_timeout_ms: int
    batch: int
    slots: int
    input: str = ""          # the batch's input digest: a slot record of the same batch for another is refused
    output_hash: str = ""
    epoch: int = 0           # the driver's epoch (see eos_job.epoch)
    skip_all: bool = False   # the whole batch is in the sink (another generation): run the plan, write nothing
    audit: bool = True       # sink.auditHeaders: every record names its batch and slot (eos_job.audit)
    slot_map: tuple[int, ...] = ()   # job.slotsFrom sourcePartitions: the slot of each task index (source_slots)
    # The negative controls the driver read from its own environment (faults.unsafe_switches); a worker
    # never reads them from its own, which Spark settings reach.
    unsafe: frozenset[str] = frozenset()
    # max.message.bytes of the sink topics, read at start (request_limits): a record over it alone is poison.
    topic_limits: dict[str, int] = field(default_factory=dict)


class _SlotClients:
    """A slot's transactional producer and ledger reader, kept across batches in a Python worker.

    Keeping the producer saves the fence round trip per batch; keeping it *clean* (no error since its last
    successful ``commit_transaction``) also saves the ledger read (amendment A2): ``last_record`` is then the
    slot's newest ledger record, since anyone who wrote there since fenced this producer, whose transaction
    then fails at the broker, and that failure is handled as "fence again and re-read", never as success.
    """

    def __init__(self, cfg: SlotWriterConfig, slot: int):
        from confluent_kafka import Producer
        self.txid = protocol.transactional_id(cfg.tx_prefix, cfg.generation, slot)
        conf = dict(cfg.producer_config)
        conf.update({
            "bootstrap.servers": cfg.bootstrap,
            "transactional.id": faults.transactional_id(self.txid, cfg.unsafe),
            "enable.idempotence": True,
            "acks": "all",
            # Java clients' default partitioner: consumers that co-partition by key agree.
            "partitioner": "murmur2_random",
            "transaction.timeout.ms": cfg.transaction_timeout_ms,
            "linger.ms": conf.get("linger.ms", 5),
            # Only failures need a callback: what the broker refused, and why (poison.Verdicts).
            "delivery.report.only.error": True,
            # Dense connections: every broker at once, so the fence's coordinator lookup does not wait for
            # librdkafka's sparse-connection timer (up to 500 ms; eos_job.fencing). A hidden librdkafka
            # property (not in its CONFIGURATION.md), which sink.producerConfig may set back to true.
            "enable.sparse.connections": conf.get("enable.sparse.connections", False),
        })
        self.producer = Producer(conf)
        t0 = time.monotonic()
        # The fence: aborts (or completes) any unfinished transaction of an older attempt of this slot.
        self.producer.init_transactions(cfg.transaction_timeout_ms / 1000)
        self.fence_ms = (time.monotonic() - t0) * 1000
        log.debug("fenced %s in %.1f ms", self.txid, self.fence_ms)
        self.consumer = ledger_consumer(cfg.bootstrap, _client_security(cfg.producer_config))
        self.fresh = True
        # A2: the slot record this producer committed (or read, right after its fence) last, under which
        # (ledger topic, key, driver epoch), and whether nothing failed since: False before begin_transaction,
        # True only once commit_transaction returned (or the fence's read returned).
        self.last_record: SlotLedgerRecord | None = None
        self.last_scope: tuple[str, str, int] | None = None
        self.clean = False
        self.commit_ms = 0.0   # the last commit_transaction's wall time (slot_stats)

    def close(self) -> None:
        try:
            self.consumer.close()
        except Exception:  # noqa: BLE001 - best effort on a client we are discarding
            pass
        self.producer = None


_clients: dict[str, _SlotClients] = {}


def _client_security(conf: dict[str, str]) -> dict[str, str]:
    # producer_config already carries the sink's security settings (ledger.sink_security).
    return {k: v for k, v in conf.items() if k.startswith(("security.", "sasl.", "ssl."))}


def _slot_clients(cfg: SlotWriterConfig, slot: int, fresh: bool) -> _SlotClients:
    """The worker's producer of the slot; a new (fenced) one if ``fresh`` or none is held."""
    txid = protocol.transactional_id(cfg.tx_prefix, cfg.generation, slot)
    held = _clients.get(txid)
    if held is not None and (fresh or held.producer is None):
        held.close()
        held = None
    if held is None:
        held = _SlotClients(cfg, slot)
        _clients[txid] = held
    return held


def _discard(cfg: SlotWriterConfig, slot: int) -> None:
    held = _clients.pop(protocol.transactional_id(cfg.tx_prefix, cfg.generation, slot), None)
    if held is not None:
        held.close()


def write_slot(cfg: SlotWriterConfig, slot: int, attempt: int, batches: Iterable[pa.RecordBatch],
               stats: SlotStats | None = None) -> SlotCommit:
    """Write one slot of one batch exactly once. Raises when the outcome cannot be made certain.

    ``batches`` is read once, as Spark delivers it: the decision (fence, ledger read) comes first, then
    every batch is produced as it arrives (``SlotRows`` counts and digests it on the way and keeps it for
    a second round), and the ledger record, which carries the slot's count and digest, goes last. ``stats``
    gets the task's pool hit, producers, fences, ledger reads and their times.
    """
    rows = SlotRows(batches)
    stats = stats if stats is not None else SlotStats()
    stats.tasks += 1
    try:
        return _write_slot(cfg, slot, attempt, rows, stats)
    finally:
        rows.close()


def _write_slot(cfg: SlotWriterConfig, slot: int, attempt: int, rows: SlotRows, stats: SlotStats) -> SlotCommit:
    from confluent_kafka import KafkaException

    if cfg.skip_all:
        # The rows are computed (a stateful plan updates its state for this batch), none is written.
        count, digest = rows.drain()
        stats.whole_skips += 1
        return SlotCommit(slot, cfg.batch, count, digest, skipped=True, attempt=attempt)
    key = protocol.slot_key(cfg.stream_uid, cfg.checkpoint_id, cfg.generation, slot)
    unfenced = faults.unsafe("fence", cfg.unsafe)   # the negative control also trusts a held-back read
    # What the broker said of single records, kept across fresh fences.
    verdicts = poison.Verdicts(alone=not faults.unsafe("poison-alone", cfg.unsafe))
    scope = (cfg.ledger_topic, key, cfg.epoch)
    keep_trusting = faults.unsafe("held-clean", cfg.unsafe)   # the negative control: a failure leaves it clean
    last_exc: Exception | None = None
    trusted = False
    for round_no in range(MAX_FENCE_ROUNDS):
        clients = _slot_clients(cfg, slot, fresh=False)
        trusted = held_trusted(clients, scope)
        if not trusted and not clients.fresh:
            # Held but not clean (an error or a task that ended mid-transaction since its last commit), or of
            # another ledger key or driver epoch: fence again, then read (steps 1 and 2).
            stats.stale_producers += 1
            clients = _slot_clients(cfg, slot, fresh=True)
        clients = _counted(stats, clients)
        try:
            if trusted:
                # A2: no fence, no read; a newer driver's epoch marker cannot be there (writing it fences).
                stats.pool_hits += 1
                stats.trusted += 1
                recorded, stream_epoch = clients.last_record, 0
            else:
                recorded, stream_epoch = _read_slot(cfg, clients, slot, key, unfenced, stats)
                # What the read said; clean only once this producer's own commit returned (A2).
                clients.last_record, clients.last_scope = recorded, scope
            clients.fresh = False
            decision = protocol.decide_slot(cfg.batch, recorded, input=cfg.input, output_hash=cfg.output_hash,
                                            epoch=cfg.epoch, stream_epoch=stream_epoch,
                                            input_slots=bool(cfg.slot_map) or faults.unsafe("spec-check", cfg.unsafe))
            if decision.action is SlotAction.SUPERSEDED:
                raise DriverSuperseded(f"slot {slot}: {decision.reason}")
            if decision.action is SlotAction.REFUSE:
                raise BatchRefused(f"slot {slot}: {decision.reason}; nothing was written")
            if decision.action is SlotAction.REPLAN:
                raise RuntimeError(f"slot {slot}: {decision.reason}; nothing was written, and the restart re-runs "
                                   "the ledger's batches before planning new ones")
            if decision.action is SlotAction.SKIP and not faults.unsafe("ledger-skip", cfg.unsafe):
                count, digest = rows.drain()
                # Another spec's output of the same input differs by design; only this spec's replay is compared.
                same_spec = not (recorded.output_hash and cfg.output_hash) or recorded.output_hash == cfg.output_hash
                nondet = (recorded.batch == cfg.batch and same_spec
                          and (recorded.count, recorded.digest) != (count, digest))
                if nondet:
                    log.warning("slot %d batch %d: replay differs from the committed output "
                                "(count %d vs %d, digest %016x vs %016x): the transformation is not deterministic",
                                slot, cfg.batch, count, recorded.count, digest, recorded.digest)
                return SlotCommit(slot, cfg.batch, recorded.count, recorded.digest, skipped=True,
                                  dead_letters=recorded.dead_letters, nondeterministic=nondet, attempt=attempt)
            if not rows.any_rows():
                # Nothing to write, and a replay of this batch has nothing either: no transaction needed.
                return SlotCommit(slot, cfg.batch, 0, 0, skipped=False, attempt=attempt)
            faults.before_slot_commit(cfg.batch, slot)
            dead = _transaction(cfg, clients, slot, key, rows, round_no, verdicts)
            stats.commit_ms += clients.commit_ms
            faults.slot_committed(cfg.batch, slot)
            return SlotCommit(slot, cfg.batch, rows.count, rows.digest, skipped=False, dead_letters=dead,
                              attempt=attempt)
        except KafkaException as exc:
            err = exc.args[0]
            last_exc = exc
            if trusted:
                stats.trusted_fallbacks += 1
            log.warning("slot %d batch %d: %s (fatal=%s, abortable=%s, retriable=%s); fencing again",
                        slot, cfg.batch, err, err.fatal(), err.txn_requires_abort(), err.retriable())
            if err.txn_requires_abort() and clients.producer is not None:
                try:
                    clients.producer.abort_transaction(cfg.transaction_timeout_ms / 1000)
                except KafkaException:
                    pass
            if keep_trusting and clients.producer is not None and not err.fatal():
                clients.clean = True   # UNSAFE (held-clean): the failed or unknown commit is forgotten
            else:
                _discard(cfg, slot)
            time.sleep(min(0.2 * 2 ** round_no, 5.0))
        except Exception:
            _discard(cfg, slot)
            raise
    raise RuntimeError(f"slot {slot} of batch {cfg.batch}: could not commit after {MAX_FENCE_ROUNDS} fenced "
                       f"attempts; last error: {last_exc}") from last_exc


def held_trusted(clients: _SlotClients, scope: tuple[str, str, int]) -> bool:
    """A2: whether a held producer may decide on its last record with no fence and no read: held (not just
    fenced), clean since its last commit, for the same ledger topic, slot key and driver epoch."""
    return not clients.fresh and clients.clean and clients.last_scope == scope


def _counted(stats: SlotStats, clients: _SlotClients) -> _SlotClients:
    """A fresh producer was made and fenced (``_SlotClients``): count it (a held one counts once its read held)."""
    if clients.fresh:
        stats.new_producers += 1
        stats.fences += 1
        stats.fence_ms += clients.fence_ms
    return clients


def _read_slot(cfg: SlotWriterConfig, clients: _SlotClients, slot: int, key: str,
               unfenced: bool, stats: SlotStats | None = None) -> tuple[SlotLedgerRecord | None, int]:
    """Step 2 of the write path, after the fence: the slot's newest ledger record, and the newest epoch
    marker the read met on its way back to it (a driver that started since this slot's last commit marked
    the partition under every generation's transactional id: ``eos_job.epoch.mark``)."""
    marker = protocol.epoch_key(cfg.stream_uid).encode()
    met: dict[bytes, list[bytes]] = {marker: []}
    t0 = time.monotonic()
    try:
        raw = read_latest(clients.consumer, cfg.ledger_topic, protocol.ledger_partition(slot), key,
                          held_back_ok=unfenced, met=met)
    finally:
        # Left assigned, the reader would fetch the partition every fetch.wait.max.ms until the slot's next
        # batch (benchmarks/results/2026-11-28-ledger-idle.md).
        clients.consumer.unassign()
    if stats is not None:
        stats.ledger_reads += 1
        stats.ledger_ms += (time.monotonic() - t0) * 1000
    recorded = SlotLedgerRecord.decode(raw) if raw is not None else None
    if faults.unsafe("stream-epoch", cfg.unsafe):
        return recorded, 0
    return recorded, max((protocol.EpochRecord.decode(v).epoch for v in met[marker]), default=0)


def _transaction(cfg: SlotWriterConfig, clients: _SlotClients, slot: int, key: str, rows: SlotRows,
                 round_no: int, verdicts: poison.Verdicts) -> int:
    """begin → every record of the slot as it arrives (poison ones to the dead-letter topic) → ledger record
    (the slot's count and digest, final once every batch arrived) → commit. A commit the broker's refusal of
    records made fail is aborted and written again while that teaches something of single records
    (``poison.Verdicts``); any other failure is raised, and the slot fences again."""
    from confluent_kafka import KafkaError, KafkaException

    producer = clients.producer
    for _ in range(POISON_ROUNDS):
        failures: list[tuple[str, bytes, KafkaError]] = []

        def on_delivery(err, msg):  # runs inside poll/flush/commit
            if err is not None:
                failures.append((msg.topic(), poison.identity(msg.topic(), msg.key(), msg.value()), err))

        started = time.monotonic()
        clients.clean = False   # A2: from here until commit_transaction returns, the outcome is not known
        producer.begin_transaction()
        dead = 0
        try:
            for b in rows:
                dead += produce_batch(cfg, producer, b, slot, on_delivery, verdicts)
            record = SlotLedgerRecord(cfg.batch, rows.count, rows.digest, dead, cfg.spec_hash, cfg.input,
                                      cfg.output_hash, cfg.epoch)
            producer.produce(cfg.ledger_topic, value=record.encode(), key=key.encode(),
                             partition=protocol.ledger_partition(slot))
            faults.in_transaction(cfg.batch, slot, round_no, producer)
            faults.committing(cfg.batch, slot, producer)
            t_commit = time.monotonic()
            producer.commit_transaction(cfg.transaction_timeout_ms / 1000)
            faults.commit_returned(cfg.batch, slot)   # a test may lose the outcome of the commit just applied
            clients.commit_ms = (time.monotonic() - t_commit) * 1000
            clients.last_record, clients.clean = record, True
            _warn_if_slow(cfg, slot, time.monotonic() - started)
            return dead
        except KafkaException as exc:
            # A request the broker refused while records were still being produced leaves the transaction in
            # an erroneous state, and the next produce() says so (_STATE): gather the broker's answers first.
            failed = exc.args[0].txn_requires_abort() or exc.args[0].code() == KafkaError._STATE
            if failed:
                producer.flush(cfg.transaction_timeout_ms / 1000)
            if not failed or not verdicts.learn(failures, slot, cfg.batch):
                raise
            producer.abort_transaction(cfg.transaction_timeout_ms / 1000)
    raise KafkaException(KafkaError(KafkaError._FAIL, "records kept being refused after dead-lettering"))


def _warn_if_slow(cfg: SlotWriterConfig, slot: int, seconds: float) -> None:
    """A slot transaction that took over half of transaction.timeout.ms: the next bigger one may be aborted by
    Kafka (the task then retries it, and retries again: stuck, never lossy). Say so before it happens."""
    limit = cfg.transaction_timeout_ms / 1000
    if seconds > limit / 2:
        log.warning("slot %d batch %d: its transaction took %.1f s of sink.transactionTimeoutMs %.0f s; lower "
                    "source.maxOffsetsPerTrigger or raise sink.transactionTimeoutMs before batches outgrow it",
                    slot, cfg.batch, seconds, limit)


def slot_task(cfg: SlotWriterConfig):
    """The function given to ``mapInArrow``: runs once per slot partition on an executor."""

    def run(iterator: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext
        ctx = TaskContext.get()
        slot, attempt = ctx.partitionId(), ctx.attemptNumber()
        if cfg.slot_map:
            if slot >= len(cfg.slot_map):
                raise RuntimeError(f"task {slot} of batch {cfg.batch}: the driver mapped {len(cfg.slot_map)} "
                                   "tasks to slots; nothing was written")
            slot = cfg.slot_map[slot]
        stats = SlotStats()
        commit = write_slot(cfg, slot, attempt, iterator, stats)
        yield pa.RecordBatch.from_pylist([{**commit.to_row(), **stats.to_row()}], schema=_commit_arrow_schema())

    return run


_ARROW = {"int": pa.int32(), "long": pa.int64(), "string": pa.string(), "boolean": pa.bool_(), "double": pa.float64()}


def _commit_arrow_schema() -> pa.Schema:
    """COMMIT_SCHEMA's columns as Arrow types."""
    return pa.schema([(name, _ARROW[kind]) for name, kind in (c.split() for c in COMMIT_SCHEMA.split(", "))])
