"""The ledger tips of many streams of one Kafka cluster in one read: the operator's progress reads.

A stream's tip is the newest batch-complete record of its ledger (``resolution.last_batch_record`` reads one).
The operator needs every running stream's tip every few seconds; one client and two requests per stream do
not scale to hundreds of streams. :func:`read_tips` serves all the streams of a cluster at once:

* one ListOffsets request (read_committed, so the end is the last stable offset) for the batch partitions of
  every ledger asked about;
* records are fetched only for the ledgers whose end moved since the caller's last answer (``known``), all
  through one consumer assigned to those partitions, from a few records before each end;
* a ledger that cannot be read gets its own error; the others are answered.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from .clients import FRESH, LEDGER, FreshClients, SharedClients
from .ledger import _LEADER_ERRORS, SinkUnavailable
from .protocol import BATCH_PARTITION, BatchCompleteRecord

TAIL = 8   # the batch-complete record is among a batch partition's last few (history records come before it)


@dataclass(frozen=True)
class Tip:
    end: int                                # the batch partition's last stable offset when read
    record: BatchCompleteRecord | None      # its newest batch-complete record (None: no batch yet)


def read_tips(conf: dict[str, str], topics: Sequence[str], known: Mapping[str, Tip] | None = None, *,
              timeout_s: float = 10.0,
              clients: FreshClients | SharedClients = FRESH) -> dict[str, Tip | Exception]:
    """Each ledger topic's tip (``conf``: the cluster's client settings, credentials included); an answer in
    ``known`` whose end has not moved is given again without reading records."""
    known = known or {}
    deadline = time.monotonic() + timeout_s
    out: dict[str, Tip | Exception] = {}
    with clients.admin(conf) as admin:
        ends = _ends(admin, sorted(set(topics)), deadline, out)
    moved = {}
    for topic, end in ends.items():
        before = known.get(topic)
        if before is not None and before.end == end:
            out[topic] = before
        elif end <= 0:
            out[topic] = Tip(end, None)
        else:
            moved[topic] = end
    if moved:
        with clients.consumer(conf, LEDGER) as consumer:
            out.update(_newest(consumer, moved, deadline))
    return out


def _ends(admin, topics: list[str], deadline: float, out: dict) -> dict[str, int]:
    """The batch partitions' last stable offsets; a ledger whose partition does not exist yet ends at 0. A
    partition whose leader is moving is asked again until ``deadline``; other errors are that ledger's answer."""
    from confluent_kafka import IsolationLevel
    from confluent_kafka.admin import OffsetSpec

    ends: dict[str, int] = {}
    pending, looked_up = list(topics), False
    while pending:
        timeout = max(0.1, deadline - time.monotonic())
        futures = admin.list_offsets({TopicPartition(t, BATCH_PARTITION): OffsetSpec.latest() for t in pending},
                                     isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=timeout)
        retry, missing = [], []
        for tp, fut in futures.items():
            try:
                ends[tp.topic] = fut.result().offset
            except KafkaException as exc:
                err = exc.args[0]
                if err.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._NOENT):
                    missing.append(tp.topic)
                elif (err.retriable() or err.code() in _LEADER_ERRORS) and time.monotonic() < deadline:
                    retry.append(tp.topic)
                else:
                    out[tp.topic] = SinkUnavailable(f"cannot read the end of ledger {tp.topic}: {err}")
        if missing and not looked_up:
            # A long-lived client keeps "no such topic" in its metadata cache for minutes, and a ledger is made
            # by the driver after the operator's first read: ask for those topics' metadata, then once more.
            looked_up = True
            for t in missing:
                admin.list_topics(topic=t, timeout=max(0.1, deadline - time.monotonic()))
            retry += missing
        else:
            ends.update({t: 0 for t in missing})
        pending = retry
        if pending:
            time.sleep(0.05)
    return ends


def _newest(consumer, ends: dict[str, int], deadline: float) -> dict[str, Tip | Exception]:
    """The newest batch-complete record before each topic's end, all partitions read at once."""
    consumer.assign([TopicPartition(t, BATCH_PARTITION, max(0, end - TAIL)) for t, end in ends.items()])
    newest: dict[str, bytes] = {}
    failed: dict[str, str] = {}
    open_ = set(ends)
    while open_:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        # poll, not consume(n): the last offset of a transactional partition is a marker never delivered
        msg = consumer.poll(min(remaining, 1.0))
        if msg is None:
            continue
        topic, err = msg.topic(), msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                open_.discard(topic)
            elif topic in open_:
                open_.discard(topic)
                failed[topic] = str(err)
            continue
        if topic not in open_:
            continue
        if msg.offset() >= ends[topic]:
            open_.discard(topic)
            continue
        value = msg.value()
        if value is not None and "kind" not in json.loads(value):
            newest[topic] = value
        if msg.offset() + 1 >= ends[topic]:
            open_.discard(topic)
    out: dict[str, Tip | Exception] = {}
    for topic, end in ends.items():
        if topic in failed:
            out[topic] = SinkUnavailable(f"reading ledger {topic}[{BATCH_PARTITION}]: {failed[topic]}")
        elif topic in open_:
            out[topic] = SinkUnavailable(f"timed out reading ledger {topic}[{BATCH_PARTITION}] up to offset {end}")
        else:
            raw = newest.get(topic)
            out[topic] = Tip(end, BatchCompleteRecord.decode(raw) if raw else None)
    return out
