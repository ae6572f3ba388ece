"""The ledger topic, set up and checked: created (or grown) compacted and at least as durable as the sink topic
it vouches for, and refused before a driver writes when it is not (cleanup policy, replicas,
``min.insync.replicas``, unclean leader election) or holds another stream's records. Its records are read and
written by ``eos_job.ledger``.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from . import protocol
from .ledger import SinkUnavailable, describe_topics, records, refuse_foreign, watermarks

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Durability:
    """What the ledger topic must have to be at least as durable as the sink topic it vouches for: a ledger
    record lost while its output stays (an unclean leader, a lost lone replica) makes a replay write committed
    output again."""
    replication: int           # at least the sink topic's, and min(3, brokers)
    min_insync: int            # at least the sink topic's, and 2 from 3 replicas on
    sink_topic: str = ""
    brokers: int = 1

    def config(self) -> dict[str, str]:
        return {"min.insync.replicas": str(self.min_insync), "unclean.leader.election.enable": "false"}


def ledger_durability(admin: AdminClient, sink_topic: str, timeout_s: float = 15.0) -> Durability:
    """The durability the ledger of ``sink_topic`` needs on this cluster."""
    md = describe_topics(admin, timeout_s).get(sink_topic)
    brokers = getattr(admin, "_eos_brokers", 1)
    sink_rf = replication_factor(md) if md is not None and md.error is None else 1
    try:
        sink_isr = int(topic_config(admin, sink_topic, timeout_s).get("min.insync.replicas") or 1)
    except SinkUnavailable as exc:   # a stream's principal may hold no DescribeConfigs on its sink topic
        log.warning("%s: the ledger's min.insync.replicas follows its replication factor only", exc)
        sink_isr = 1
    rf = max(min(3, brokers), sink_rf)
    return Durability(rf, max(2 if rf >= 3 else 1, min(sink_isr, rf)), sink_topic, brokers)


def replication_factor(md) -> int:
    """A topic's replication factor: its partitions' fewest replicas."""
    return min((len(p.replicas) for p in md.partitions.values()), default=0)


def topic_config(admin: AdminClient, topic: str, timeout_s: float) -> dict[str, str]:
    """A topic's effective configuration (its own settings and the brokers' defaults)."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    res = ConfigResource(ResourceType.TOPIC, topic)
    try:
        entries = admin.describe_configs([res])[res].result(timeout_s)
    except KafkaException as exc:
        raise SinkUnavailable(f"cannot read the configuration of topic {topic!r}: {exc}; grant the sink principal "
                              "DescribeConfigs on it") from exc
    return {k: e.value for k, e in entries.items()}


def ensure_ledger_topic(admin: AdminClient, topic: str, slots: int, durability: Durability, *,
                        timeout_s: float = 30.0) -> None:
    """Create the compacted ledger topic as durable as ``durability`` asks, or grow it to ``slots + 1``
    partitions. Idempotent; an existing topic's durability is ``check_ledger_topic``'s."""
    wanted = protocol.ledger_partitions_needed(slots)
    existing = describe_topics(admin, timeout_s).get(topic)
    if existing is None or existing.error is not None:
        fut = admin.create_topics([NewTopic(topic, num_partitions=wanted, replication_factor=durability.replication,
                                            config={
            "cleanup.policy": "compact",
            # Keep compaction from touching recent records; the ledger is tiny anyway.
            "min.compaction.lag.ms": "3600000",
            "segment.bytes": str(16 * 1024 * 1024),
            **durability.config(),
        })])[topic]
        try:
            fut.result(timeout_s)
            log.info("created ledger topic %s with %d partitions, replication factor %d, min.insync.replicas %d",
                     topic, wanted, durability.replication, durability.min_insync)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise SinkUnavailable(f"cannot create the ledger topic {topic!r}: {exc}; grant the sink principal "
                                      f"CreateTopics or create it: kafka-topics --create --topic {topic} --partitions "
                                      f"{wanted} --replication-factor {durability.replication} --config "
                                      f"cleanup.policy=compact{_configs(durability)}") from exc
        wait_partitions(admin, topic, wanted, timeout_s)
        return
    have = len(existing.partitions)
    if have < wanted:
        fut = admin.create_partitions([NewPartitions(topic, wanted)])[topic]
        try:
            fut.result(timeout_s)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.INVALID_PARTITIONS:
                raise
        wait_partitions(admin, topic, wanted, timeout_s)


def _configs(d: Durability) -> str:
    return "".join(f" --config {k}={v}" for k, v in d.config().items())


def check_ledger_topic(admin: AdminClient, consumer: Consumer, topic: str, stream_uid: str,
                       durability: Durability, timeout_s: float = 15.0) -> None:
    """The ledger's assumptions, checked before a driver writes: compacted (a record must never expire: a
    replay would write its slot again), as durable as the sink (``Durability``) and this stream's alone
    (another stream's open transactions could hide a committed record from a read_committed read)."""
    entries = topic_config(admin, topic, timeout_s)
    policy = entries.get("cleanup.policy") or ""
    if "compact" not in policy.split(",") or "delete" in policy.split(","):
        raise SinkUnavailable(f"ledger topic {topic!r} has cleanup.policy={policy}: its records would expire and "
                              "a replay would then write committed output again. Set cleanup.policy=compact "
                              f"(kafka-configs --alter --entity-type topics --entity-name {topic} --add-config "
                              "cleanup.policy=compact)")
    durability_problem(topic, describe_topics(admin, timeout_s).get(topic), entries, durability)
    low, high = watermarks(consumer, topic, protocol.BATCH_PARTITION, timeout_s)
    for msg in records(consumer, topic, protocol.BATCH_PARTITION, max(low, high - 8), high,
                       time.monotonic() + timeout_s):
        refuse_foreign(topic, stream_uid, msg.key())


def durability_problem(topic: str, md, entries: dict[str, str], need: Durability) -> None:
    """Raise when the ledger topic is less durable than ``need``, naming the setting, both values and the fix."""
    why = (f"the sink topic {need.sink_topic!r} and a cluster of {need.brokers} broker(s) need at least "
           f"{need.replication} replicas and min.insync.replicas {need.min_insync}; a ledger record lost while its "
           "output stays makes a replay write committed output again")
    rf = replication_factor(md) if md is not None and md.error is None else 0
    if rf < need.replication:
        raise SinkUnavailable(f"ledger topic {topic!r} has replication factor {rf}, the required is "
                              f"{need.replication} ({why}). Add replicas with kafka-reassign-partitions (a plan "
                              f"naming {need.replication} brokers for each partition of {topic}), or, while no "
                              "stream uses it, delete the topic and let the driver create it")
    isr = int(entries.get("min.insync.replicas") or 1)
    unclean = (entries.get("unclean.leader.election.enable") or "false").lower()
    for key, value, ok, wanted in (("min.insync.replicas", isr, isr >= need.min_insync, need.min_insync),
                                   ("unclean.leader.election.enable", unclean, unclean == "false", "false")):
        if not ok:
            raise SinkUnavailable(f"ledger topic {topic!r} has {key}={value}, the required is {wanted} ({why}). "
                                  f"Set it: kafka-configs --alter --entity-type topics --entity-name {topic} "
                                  f"--add-config {key}={wanted}")


def wait_partitions(admin: AdminClient, topic: str, wanted: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        md = admin.list_topics(topic=topic, timeout=timeout_s).topics.get(topic)
        if md is not None and md.error is None and len(md.partitions) >= wanted and all(
                p.leader >= 0 for p in md.partitions.values()):
            return
        time.sleep(0.1)
    raise SinkUnavailable(f"ledger topic {topic!r} did not get {wanted} partitions with leaders in {timeout_s:.0f}s")


def ledger_partition_count(admin: AdminClient, topic: str, timeout_s: float = 15.0) -> int:
    md = describe_topics(admin, timeout_s).get(topic)
    if md is None or md.error is not None:
        return 0
    return len(md.partitions)
