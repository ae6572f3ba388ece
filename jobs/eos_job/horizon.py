"""The replay horizon: how far back the source still reaches behind the stream.

A restart replays from the source positions of the last batch in the sink. If
retention deletes records before the stream read them, they are lost to it
(Spark's ``failOnDataLoss`` then stops the query). The protocol asks for this to
be visible *before* it happens, so the operator checks it periodically, whether
the driver runs or not (a suspended or failed stream is the one falling behind):

* the positions come from the ledger's last batch-complete record (the sink
  cluster; no access to the checkpoint store needed);
* the source's earliest and latest offsets come from the source cluster;
* for a partition with a backlog, the timestamp of its oldest unprocessed record
  plus the topic's ``retention.ms`` says when retention may delete it.

:func:`assess` is pure; :func:`observe` does the Kafka reads.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Mapping

from confluent_kafka import TopicPartition

from .clients import FRESH, SOURCE, FreshClients, SharedClients
from .kafka_security import KafkaSecrets
from .ledger import base_config, list_offsets, source_security
from .protocol import BatchCompleteRecord
from .resolution import last_batch_record
from .spec import RunConfig
from .status import MAX_LAG_PARTITIONS, PartitionLag, ReplayHorizon

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartitionView:
    topic: str
    partition: int
    earliest: int                   # first offset the source still retains
    latest: int                     # next offset to be written
    checkpointed: int | None        # next offset the stream reads (None: not in the stream's positions yet)
    oldest_unprocessed_ms: int | None = None   # timestamp of the record at ``checkpointed``, if any
    retention_ms: int | None = None            # None: the topic deletes nothing by time

    @property
    def name(self) -> str:
        return f"{self.topic}/{self.partition}"


def _iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds >= 7200:
        return f"{seconds // 3600} h"
    if seconds >= 120:
        return f"{seconds // 60} min"
    return f"{seconds} s"


def assess(batch: int, views: list[PartitionView], now: float, *,
           warn_seconds: float | None = None) -> ReplayHorizon:
    """The horizon of ``batch``'s positions against ``views`` (``now`` in epoch seconds).

    Exceeded wins over Shrinking: records already lost matter more than records at risk.
    A partition is Shrinking when its oldest unprocessed record is deleted by retention in
    less than ``warn_seconds`` (default: half the topic's retention).
    """
    lost, backlog = 0, 0
    worst_lost: tuple[int, PartitionView] | None = None
    soonest: tuple[float, PartitionView] | None = None
    for v in views:
        if v.checkpointed is None:
            continue
        if v.earliest > v.checkpointed:
            gone = v.earliest - v.checkpointed
            lost += gone
            if worst_lost is None or gone > worst_lost[0]:
                worst_lost = (gone, v)
        backlog += max(0, v.latest - max(v.checkpointed, v.earliest))
        if (v.latest > v.checkpointed >= v.earliest and v.retention_ms is not None
                and v.oldest_unprocessed_ms is not None):
            left = (v.oldest_unprocessed_ms + v.retention_ms) / 1000.0 - now
            if soonest is None or left < soonest[0]:
                soonest = (left, v)
    checked = _iso(now)
    lag = partition_lag(views)
    if worst_lost is not None:
        v = worst_lost[1]
        message = (f"retention deleted {lost} records before the stream read them ({v.name}: the stream is at "
                   f"offset {v.checkpointed}, the source keeps only from {v.earliest}); they are lost to this "
                   "stream and Spark stops the query there (failOnDataLoss). To go on without them set "
                   "source.acceptDataLoss: true; to prevent it, raise the topic's retention.ms")
        return ReplayHorizon(state="Exceeded", batch=batch, checked_at=checked, backlog_records=backlog,
                             lost_records=lost, seconds_left=soonest[0] if soonest else None, partition=v.name,
                             message=message, lag=lag)
    if soonest is not None:
        left, v = soonest
        assert v.retention_ms is not None and v.oldest_unprocessed_ms is not None
        threshold = warn_seconds if warn_seconds is not None else v.retention_ms / 2000.0
        if left < threshold:
            message = (f"retention deletes the oldest record the stream has not processed in about "
                       f"{_duration(left)} ({v.name} offset {v.checkpointed}, written "
                       f"{_iso(v.oldest_unprocessed_ms / 1000.0)}, retention.ms {v.retention_ms}); the stream is "
                       f"{backlog} records behind. Let the stream catch up (resume it, raise its parallelism "
                       "or maxOffsetsPerTrigger) or raise the topic's retention.ms")
            return ReplayHorizon(state="Shrinking", batch=batch, checked_at=checked, backlog_records=backlog,
                                 seconds_left=round(left, 1), partition=v.name, message=message, lag=lag)
    return ReplayHorizon(state="Safe", batch=batch, checked_at=checked, backlog_records=backlog,
                         seconds_left=round(soonest[0], 1) if soonest else None,
                         partition=soonest[1].name if soonest else None, lag=lag)


def partition_lag(views: list[PartitionView]) -> list[PartitionLag]:
    """Each partition's records beyond the stream's positions (retained or not), largest first."""
    lags = [PartitionLag(topic=v.topic, partition=v.partition, records=v.latest - v.checkpointed)
            for v in views if v.checkpointed is not None and v.latest > v.checkpointed]
    return sorted(lags, key=lambda x: (-x.records, x.topic, x.partition))[:MAX_LAG_PARTITIONS]


# ------------------------------------------------------------------- Kafka reads
def _retention(admin, topics: list[str], timeout_s: float) -> dict[str, int | None]:
    """retention.ms per topic; None when the topic deletes nothing by time (-1, or compaction only)."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    out: dict[str, int | None] = {}
    futures = admin.describe_configs([ConfigResource(ResourceType.TOPIC, t) for t in topics],
                                     request_timeout=timeout_s)
    for res, fut in futures.items():
        entries = fut.result(timeout=timeout_s)
        policy = entries["cleanup.policy"].value if "cleanup.policy" in entries else "delete"
        ms = int(entries["retention.ms"].value) if "retention.ms" in entries else -1
        out[res.name] = ms if ms >= 0 and "delete" in (policy or "delete") else None
    return out


def _oldest_timestamps(conf: dict[str, str], wanted: set[tuple[str, int, int]], timeout_s: float,
                       clients: FreshClients | SharedClients = FRESH) -> dict[tuple[str, int, int], int]:
    """The timestamp (ms) of the record at each wanted (topic, partition, offset): one consumer, each partition
    assigned once per round (streams behind on the same partition at different offsets take several rounds)."""
    found: dict[tuple[str, int, int], int] = {}
    rounds: list[dict[tuple[str, int], int]] = []
    for t, p, o in sorted(wanted):
        free = next((r for r in rounds if (t, p) not in r), None)
        if free is None:
            rounds.append(free := {})
        free[(t, p)] = o
    if not rounds:
        return found
    deadline = time.monotonic() + timeout_s
    with clients.consumer(conf, SOURCE) as consumer:
        for at in rounds:
            consumer.assign([TopicPartition(t, p, o) for (t, p), o in at.items()])
            left = set(at)
            while left and time.monotonic() < deadline:
                msg = consumer.poll(min(1.0, max(0.01, deadline - time.monotonic())))
                if msg is None or msg.error():
                    continue
                key = (msg.topic(), msg.partition())
                if key in left:
                    left.discard(key)
                    found[(*key, at[key])] = msg.timestamp()[1]
                    consumer.pause([TopicPartition(*key)])
            assigned = consumer.assignment()
            if assigned:
                consumer.resume(assigned)   # a pause outlives unassign() in librdkafka
            consumer.unassign()
    return found


def observe(config: RunConfig, *, timeout_s: float = 10.0, now: float | None = None,
            kafka: Mapping[str, KafkaSecrets] | None = None,
            on_error: Callable[[Exception], None] | None = None,
            clients: FreshClients | SharedClients = FRESH) -> ReplayHorizon | None:
    """The stream's replay horizon now; None when no batch with source positions is in the ledger yet.
    ``kafka``: Secret values of both ends' security (the operator's); else the environment's. ``on_error``
    sees a ledger read that failed (answered None; see last_batch_record); other failures raise."""
    record = last_batch_record(config, timeout_s=timeout_s, kafka=kafka, on_error=on_error, clients=clients)
    src = config.spec.source
    conf = base_config(src.bootstrap_servers, source_security(src, (kafka or {}).get("source")))
    answer = observe_many(conf, {"stream": (config, record)}, timeout_s=timeout_s, now=now, clients=clients)["stream"]
    if isinstance(answer, Exception):
        raise answer
    return answer


def observe_many(conf: dict[str, str], streams: Mapping[str, tuple[RunConfig, BatchCompleteRecord | None]], *,
                 timeout_s: float = 10.0, now: float | None = None,
                 clients: FreshClients | SharedClients = FRESH) -> dict[str, ReplayHorizon | None | Exception]:
    """The replay horizons of streams whose source is one cluster (``conf``: its client settings, credentials
    included), each from the ledger's last batch-complete record given with it (None: no batch yet, so no
    horizon). The source topics' partitions, earliest and latest offsets and retention are read once for all of
    them (the operator's horizon checks, batched per cluster); a failed read is every stream's answer."""
    out: dict[str, ReplayHorizon | None | Exception] = {
        key: None for key, (_, record) in streams.items() if record is None or not record.source_offsets}
    todo = {key: item for key, item in streams.items() if key not in out}
    if not todo:
        return out
    try:
        with clients.admin(conf) as admin:
            cluster = _read_cluster(admin, sorted({t for cfg, _ in todo.values() for t in cfg.spec.source.topics}),
                                    timeout_s)
        earliest, latest, retention = cluster
        positions = {key: {(t, int(p)): o for t, parts in record.source_offsets.items() for p, o in parts.items()}
                     for key, (_, record) in todo.items()}
        behind = {key: {k: o for k, o in pos.items()
                        if k in latest and latest[k] > o >= earliest[k] and retention.get(k[0]) is not None}
                  for key, pos in positions.items()}
        stamps = _oldest_timestamps(conf, {(t, p, o) for b in behind.values() for (t, p), o in b.items()},
                                    timeout_s, clients)
    except Exception as exc:  # noqa: BLE001 - the cluster's answer for each of its streams
        return {**out, **{key: exc for key in todo}}
    at = time.time() if now is None else now
    for key, (config, record) in todo.items():
        topics = set(config.spec.source.topics)
        views = [PartitionView(topic=t, partition=p, earliest=earliest[(t, p)], latest=latest[(t, p)],
                               checkpointed=positions[key].get((t, p)),
                               oldest_unprocessed_ms=stamps.get((t, p, positions[key].get((t, p)))),
                               retention_ms=retention.get(t)) for t, p in sorted(earliest) if t in topics]
        out[key] = assess(record.batch, views, at,
                          warn_seconds=config.spec.source.replay_horizon_warning_seconds) if views else None
    return out


def _read_cluster(admin, topics: list[str], timeout_s: float):
    """Earliest and latest offsets of every partition of ``topics``, and their retention."""
    from confluent_kafka.admin import OffsetSpec

    tps = []
    for t in topics:
        # The source topics' metadata only: the whole cluster's (every stream's sink and ledger topics) would be
        # fetched and parsed for each check, a cost that grows with the number of streams.
        info = admin.list_topics(topic=t, timeout=timeout_s).topics.get(t)
        if info is not None and info.error is None:
            tps += [TopicPartition(t, p) for p in sorted(info.partitions)]
    if not tps:
        return {}, {}, {}
    earliest = list_offsets(admin, tps, OffsetSpec.earliest(), timeout_s)
    latest = list_offsets(admin, tps, OffsetSpec.latest(), timeout_s)
    return earliest, latest, _retention(admin, sorted({tp.topic for tp in tps}), timeout_s)
