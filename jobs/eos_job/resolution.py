"""Resolution: the step before every (re)start of a stream (the operator calls it).

It runs only after the previous driver is gone. It fences every slot
transactional id of the current and the previous generation, so no hanging
transaction keeps read_committed consumers waiting for a timeout; then it reads
the ledger and the checkpoint and reports what is committed, whether a batch is
partially committed, and what the restart will replay. Running it twice gives
the same report.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable, Mapping

from confluent_kafka import KafkaException

from . import checkpoint, protocol
from .ledger import (SinkUnavailable, admin_client, base_config, describe_topics, ledger_consumer, list_offsets,
                     records, watermarks, sink_security, topic_denied)
from .ledger_scan import read_latest_many
from .protocol import BatchCompleteRecord, SlotLedgerRecord
from .clients import FRESH, LEDGER, FreshClients, SharedClients
from .epoch import read_generations
from .fencing import DENSE_MAX_BROKERS, fence_all
from .kafka_security import KafkaSecrets
from .spec import RunConfig
from .snapshot import NotASnapshot, read_manifest
from .status import CheckpointFacts, ProbedSnapshot, ResolutionReport
from .storage import Loc, S3Options

log = logging.getLogger(__name__)


def _still_held(admin, topics: dict, names: list[str], timeout_s: float, *,
                sleep: Callable[[float], None] = time.sleep, first_wait_s: float = 0.05, max_wait_s: float = 0.5,
                budget_s: float = 5.0) -> set[tuple[str, int]]:
    """Partitions an open transaction still holds after fencing; markers of the aborts may trail by a moment.

    They usually land within tens of milliseconds and the restart waits for them, so the pauses between
    looks start short (``first_wait_s``) and double up to ``max_wait_s``: the common case costs about as
    long as the markers take, and a partition still held after ``budget_s`` of pauses is given up on."""
    wait, waited = first_wait_s, 0.0
    while True:
        held = open_transaction_partitions(admin, topics, names, timeout_s)
        if not held or waited >= budget_s:
            return held
        pause = min(wait, budget_s - waited)
        sleep(pause)
        waited += pause
        wait = min(wait * 2, max_wait_s)


def open_transaction_partitions(admin, topics: dict, names: list[str], timeout_s: float) -> set[tuple[str, int]]:
    """Partitions whose last stable offset trails the high watermark: an open transaction holds them."""
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    tps = [TopicPartition(t, p) for t in names for p in topics[t].partitions]
    if not tps:
        return set()
    try:
        stable = list_offsets(admin, tps, OffsetSpec.latest(), timeout_s, IsolationLevel.READ_COMMITTED)
        high = list_offsets(admin, tps, OffsetSpec.latest(), timeout_s, IsolationLevel.READ_UNCOMMITTED)
    except KafkaException as exc:
        raise SinkUnavailable(f"resolution could not read the end offsets of {names}: {exc.args[0]}; the sink "
                              "cluster must be reachable (every partition with a leader) before the stream "
                              "restarts") from exc
    return {tp for tp, off in stable.items() if off < high[tp]}


def checkpoint_facts(config: RunConfig, s3: S3Options | None = None, *, snapshot: str | None = None) -> CheckpointFacts:
    """What the checkpoint the restart will run on says: ``config.checkpoint_dir``, or for a start from a
    snapshot into an empty location, the snapshot's copy (the driver seeds the location with it: same
    checkpoint identity, same ledger keys). ``snapshot``: also that snapshot's manifest, if it has one."""
    ckpt = Loc.of(config.checkpoint_dir, s3)
    if config.restore_from and checkpoint.checkpoint_id(ckpt) is None:
        ckpt = Loc.of(config.restore_from, s3) / "checkpoint"
    probed = None
    if snapshot:
        try:
            m = read_manifest(Loc.of(snapshot, s3))
            probed = ProbedSnapshot(path=snapshot, stream_uid=(m.get("stream") or {}).get("uid"),
                                    batch=m.get("lastBatch"), time=m.get("time"), checkpoint_id=m.get("checkpointId"))
        except NotASnapshot:
            probed = None
    return CheckpointFacts(checkpoint_dir=config.checkpoint_dir, state=checkpoint.state(ckpt), snapshot=probed,
                           checkpoint_id=checkpoint.checkpoint_id(ckpt),
                           last_offsets_batch=checkpoint.last_offsets_batch(ckpt),
                           last_committed_batch=checkpoint.last_committed_batch(ckpt),
                           replay_batch=checkpoint.replay_batch(ckpt))


def resolve(config: RunConfig, *, timeout_s: float = 60.0, s3: S3Options | None = None,
            kafka: Mapping[str, KafkaSecrets] | None = None, facts: CheckpointFacts | None = None,
            fence_pool: int | None = None, dense_fences: bool | None = None) -> ResolutionReport:
    """``s3``: how to reach a checkpoint bucket (``store: s3``), keys included, and ``kafka``: the Secret
    values of the sink's credentials and TLS, when the caller (the operator) has none in its environment.
    ``facts``: the checkpoint as read elsewhere (a Pod that mounts the stream's claim), instead of here.
    ``fence_pool``: how many transactional ids to fence at once (``fencing.DEFAULT_POOL``), all of them
    within ``timeout_s``; ``dense_fences``: whether the fencing producers connect every broker at once
    (``fencing.fence_all``), by default on clusters of up to ``fencing.DENSE_MAX_BROKERS`` brokers."""
    spec, stream = config.spec, config.stream
    sink = spec.sink
    sec = sink_security(sink, (kafka or {}).get("sink"))
    # A PVC is mounted at checkpoint.path in the driver; where that path does not exist (the operator without
    # a probe's facts), an absent checkpoint means "not visible here", not "none yet".
    readable = facts is not None or spec.checkpoint.store != "pvc" or Path(spec.checkpoint.path).is_dir()
    if facts is None:
        facts = checkpoint_facts(config, s3)
    ckpt_id = facts.checkpoint_id
    slots = spec.job.parallelism
    with admin_client(base_config(sink.bootstrap_servers, sec), sink.bootstrap_servers) as admin:
        topics = describe_topics(admin, min(timeout_s, 15.0))
        ledger = config.ledger_topic()
        md = topics.get(ledger)
        topic_denied(admin, ledger, md)
        ledger_parts = len(md.partitions) if md is not None and md.error is None else 0
        t0 = time.monotonic()
        brokers = getattr(admin, "_eos_brokers", 0)
        dense = 0 < brokers <= DENSE_MAX_BROKERS if dense_fences is None else dense_fences
        # The driver's partition-0 writer first: a driver killed inside one of its (millisecond) transactions
        # holds partition 0's last stable offset back, and the generation history is read from there.
        fenced = fence_all(sink.bootstrap_servers, [protocol.driver_transactional_id(stream.transactional_prefix)],
                           timeout_s, sec, pool_size=fence_pool, dense=dense)
        generations = protocol.GenerationHistory()
        if ledger_parts:
            consumer = ledger_consumer(sink.bootstrap_servers, sec)
            try:
                generations = read_generations(consumer, ledger, stream.uid, timeout_s)
            finally:
                consumer.close()
        gen = protocol.effective_generation(stream.generation, slots, generations, config.spec.job.slots_from)
        # Every generation that ever wrote (the ledger's history), and the previous one with every slot the
        # ledger has room for (ledgers written before the history existed).
        to_fence = {g: n for g, n in generations.slots_of().items()}
        to_fence[gen] = max(slots, to_fence.get(gen, 0))
        if gen > 0:
            to_fence[gen - 1] = max(to_fence.get(gen - 1, 0), slots, ledger_parts - 1)
        watched = [t for t in (sink.topic, sink.dead_letter_topic, ledger) if t and t in topics]
        held_before = open_transaction_partitions(admin, topics, watched, timeout_s)
        txids = [protocol.transactional_id(stream.transactional_prefix, g, slot)
                 for g, n in sorted(to_fence.items()) for slot in range(n)]
        fenced += fence_all(sink.bootstrap_servers, txids, timeout_s, sec, pool_size=fence_pool, dense=dense)
        held_after = _still_held(admin, topics, watched, timeout_s)
        held_ledger = sorted(p for t, p in held_after if t == ledger)
        if held_ledger:
            raise SinkUnavailable(
                f"after fencing every generation that wrote ({sorted(to_fence)}), ledger {ledger} partitions "
                f"{held_ledger} still have an open transaction: another producer writes the ledger topic. A ledger "
                "belongs to one stream: give this stream its own sink.ledgerTopic (or stop the other writer)")
        report = ResolutionReport(stream_uid=stream.uid, checkpoint_id=ckpt_id, checkpoint_readable=readable,
                                  generation=gen,
                                  slots=slots, fenced_transactional_ids=fenced,
                                  checkpoint_last_offsets_batch=facts.last_offsets_batch,
                                  checkpoint_last_committed_batch=facts.last_committed_batch)
        if ledger_parts and ckpt_id:
            consumer = ledger_consumer(sink.bootstrap_servers, sec)
            try:
                per_slot: dict[str, int] = {}
                # Every slot's record and the batch-complete record, in one pass over the ledger's partitions.
                wants = {protocol.ledger_partition(slot): protocol.slot_key(stream.uid, ckpt_id, gen, slot)
                         for slot in range(min(slots, ledger_parts - 1))}
                wants[protocol.BATCH_PARTITION] = protocol.batch_key(stream.uid, ckpt_id, gen)
                latest = read_latest_many(admin, consumer, ledger, wants, timeout_s=timeout_s)
                raw = latest.pop(protocol.BATCH_PARTITION)
                report.last_complete_batch = BatchCompleteRecord.decode(raw).batch if raw is not None else None
                for part, raw in latest.items():
                    batch = SlotLedgerRecord.decode(raw).batch if raw is not None else -1
                    if batch >= 0:   # -1: only a driver epoch's stamp, no batch yet
                        per_slot[str(part - protocol.ledger_partition(0))] = batch
                report.last_committed_batch_per_slot = per_slot
            finally:
                consumer.close()
        replay = facts.replay_batch
        report.replay_batch = replay
        if replay is not None:
            done = sorted(int(s) for s, b in report.last_committed_batch_per_slot.items() if b >= replay)
            report.replay_slots_already_committed = done
            report.partially_committed = 0 < len(done) < slots
        report.open_transactions_aborted = len(held_before - held_after)
        if held_after:
            log.warning("after fencing, partitions %s still have open transactions of another producer: "
                        "is the sink topic shared with another transactional writer?", sorted(held_after))
        report.summary = _summarise(report)
        log.info("resolution of %s/%s in %.0f ms: %s", stream.namespace, stream.name,
                 (time.monotonic() - t0) * 1000, report.summary)
        return report


def _summarise(r: ResolutionReport) -> str:
    parts = [f"fenced {r.fenced_transactional_ids} transactional ids"]
    if not r.checkpoint_readable:
        parts.append("the checkpoint (checkpoint.store pvc) is not mounted here: the driver reads it and "
                     "replays its last uncommitted batch, if any, skipping the slots the ledger has")
    elif r.checkpoint_id is None:
        parts.append("no checkpoint yet: the stream starts fresh")
    else:
        parts.append(f"checkpoint committed batch {r.checkpoint_last_committed_batch}")
        if r.last_complete_batch is not None:
            parts.append(f"ledger complete through batch {r.last_complete_batch}")
    if r.replay_batch is not None:
        if r.partially_committed:
            parts.append(f"batch {r.replay_batch} is PARTIALLY committed (slots {r.replay_slots_already_committed} "
                         f"of {r.slots}); the restart replays it and skips those slots")
        elif len(r.replay_slots_already_committed) == r.slots:
            parts.append(f"batch {r.replay_batch} is fully in the sink; the restart replays it and writes nothing new")
        else:
            parts.append(f"the restart replays batch {r.replay_batch}")
    return "; ".join(parts)


def last_batch_record(config: RunConfig, *, timeout_s: float = 10.0,
                      kafka: Mapping[str, KafkaSecrets] | None = None,
                      on_error: Callable[[Exception], None] | None = None,
                      clients: FreshClients | SharedClients = FRESH) -> BatchCompleteRecord | None:
    """The newest batch-complete record of the stream's ledger, whatever its checkpoint: the driver writes
    it last of a batch's records in partition 0, so it is among the partition's last few (batch history
    records and tombstones come before it). Cheap, no fencing; None if there is none or Kafka fails
    (``on_error`` sees that failure: the operator counts it). The operator polls it for
    ``status.lastCommittedBatch``, with its clients shared per cluster (``clients``)."""
    import json

    from confluent_kafka import TopicPartition

    sink = config.spec.sink
    conf = base_config(sink.bootstrap_servers, sink_security(sink, (kafka or {}).get("sink")))
    with clients.consumer(conf, LEDGER) as consumer:
        tp = TopicPartition(config.ledger_topic(), protocol.BATCH_PARTITION)
        try:
            low, high = watermarks(consumer, tp.topic, tp.partition, timeout_s)
            if high <= low:
                return None
            newest = None
            for msg in records(consumer, tp.topic, tp.partition, max(low, high - 8), high,
                                time.monotonic() + timeout_s):
                value = msg.value()
                if value is not None and "kind" not in json.loads(value):
                    newest = value
            return BatchCompleteRecord.decode(newest) if newest is not None else None
        except (KafkaException, SinkUnavailable) as exc:
            if on_error is not None:
                on_error(exc)
            return None
