"""Kafka side of the ledger: clients, the latest-record read and the history read (the topic's set-up and
checks are ``eos_job.ledger_topic``).

The ledger is a compacted topic per stream. Partition 0 carries the driver's
batch-complete records; slot p owns partition p+1 (see ``protocol``). Reading a
slot's latest record looks at the last few offsets of its partition only, and
widens the window backwards only when the newest records belong to another
checkpoint identity (after a restore or a stateless start): milliseconds in the
steady state, never a scan of the topic.
"""
from __future__ import annotations

import contextlib
import logging
import re
import time
from typing import Iterator

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from . import protocol
from .clients import LEDGER, closed_admin, consumer_conf
from .kafka_security import KafkaSecretMissing, KafkaSecrets, java_config, librdkafka_config

log = logging.getLogger(__name__)


class SinkUnavailable(RuntimeError):
    """The sink cluster or one of its topics cannot be used; the message says what to do."""


class LedgerHeldBack(SinkUnavailable):
    """A ledger read ended at a last stable offset an open transaction holds below the partition's end."""


def sink_security(sink, secrets: KafkaSecrets | None = None) -> dict[str, str]:
    """Connection security for every client of the sink cluster (producers, ledger readers, admin).

    TLS settings may also come from ``sink.producerConfig``; SASL and TLS material from ``sink.credentials``
    and ``sink.tls``: their Secret values from ``secrets`` (the operator reads the Secrets) or the
    environment (the stream's Pods). The values are never logged.
    """
    conf = {k: v for k, v in sink.producer_config.items() if k.startswith(("security.", "ssl."))}
    try:
        conf.update(librdkafka_config("sink", sink.credentials, sink.tls,
                                      secrets if secrets is not None else KafkaSecrets.from_env("sink")))
    except KafkaSecretMissing as exc:
        raise SinkUnavailable(str(exc)) from None
    return conf


def sink_java_security(sink, secrets: KafkaSecrets | None = None) -> dict[str, str]:
    """``sink_security`` for Kafka's Java client (``sink.writer: jvm``): SASL as ``sasl.jaas.config``, TLS
    material as inline PEM (``ssl.truststore.type=PEM``), so nothing is written to disk. Never logged."""
    try:
        return java_config("sink", sink.credentials, sink.tls,
                           secrets if secrets is not None else KafkaSecrets.from_env("sink"))
    except KafkaSecretMissing as exc:
        raise SinkUnavailable(str(exc)) from None


def source_security(source, secrets: KafkaSecrets | None = None) -> dict[str, str]:
    """Connection security of the Python clients of the source cluster (the replay horizon's reads)."""
    return librdkafka_config("source", source.credentials, source.tls,
                             secrets if secrets is not None else KafkaSecrets.from_env("source"))


def base_config(bootstrap: str, extra: dict[str, str] | None = None) -> dict:
    conf = {"bootstrap.servers": bootstrap}
    conf.update(extra or {})
    return conf


# Errors librdkafka reports only through error_cb: a wrong password or TLS peer shows up there, while the
# request itself merely times out.
ACCESS_ERRORS = (KafkaError._AUTHENTICATION, KafkaError._SSL, KafkaError.SASL_AUTHENTICATION_FAILED)


@contextlib.contextmanager
def admin_client(conf: dict, bootstrap: str | None = None) -> Iterator[AdminClient]:
    """An admin client, closed when the block ends (``closed_admin``). ``bootstrap``: named in error messages."""
    seen: list[KafkaError] = []
    with closed_admin({**conf, "error_cb": lambda err: seen.append(err) if err.code() in ACCESS_ERRORS else None}) \
            as admin:
        admin._eos_access_errors = seen
        if bootstrap is not None:
            admin._eos_bootstrap = bootstrap
        yield admin


def describe_topics(admin: AdminClient, timeout_s: float) -> dict:
    try:
        md = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        admin.poll(0)   # serves error_cb: why the brokers were unreachable
        denied = getattr(admin, "_eos_access_errors", None)
        if denied:
            raise SinkUnavailable(f"Kafka at {admin_bootstrap(admin)} refused the connection: authentication "
                                  f"failed ({denied[-1].str()}); check the credentials, the TLS settings and "
                                  "their Secrets") from exc
        raise SinkUnavailable(f"cannot reach Kafka at {admin_bootstrap(admin)} within {timeout_s:.0f}s ({exc}); "
                              "check sink.bootstrapServers and that the brokers are up") from exc
    admin._eos_brokers = len(md.brokers)   # how many brokers: resolution's fencing sizes its connections by it
    return md.topics


def topic_denied(admin: AdminClient, topic: str, md) -> None:
    """Raise when the broker refused to describe ``topic`` to this user (an ACL is missing)."""
    if md is not None and md.error is not None and md.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        raise SinkUnavailable(f"Kafka at {admin_bootstrap(admin)}: topic {topic!r}: Topic authorization failed; "
                              "grant the stream's user its ACLs")


def admin_bootstrap(admin: AdminClient) -> str:
    return getattr(admin, "_eos_bootstrap", "the configured bootstrap servers")


def require_topics(admin: AdminClient, topics: dict[str, str], timeout_s: float = 15.0) -> None:
    """``topics`` maps a topic to the spec field that names it."""
    existing = describe_topics(admin, timeout_s)
    for topic, field in topics.items():
        md = existing.get(topic)
        if md is None or md.error is not None:
            raise SinkUnavailable(f"{field}: topic {topic!r} does not exist on the sink cluster; "
                                  f"create it (e.g. kafka-topics --create --topic {topic}) and restart")


def refuse_foreign(topic: str, stream_uid: str, key: bytes | None) -> None:
    """A partition-0 record of another stream: this ledger is shared, which the protocol cannot allow."""
    if key is not None and not key.startswith(f"{stream_uid}/".encode()):
        raise SinkUnavailable(f"ledger topic {topic!r} holds records of another stream (key {key[:80]!r}): a "
                              "ledger belongs to one stream. Give this stream its own sink.ledgerTopic")


def ledger_consumer(bootstrap: str, extra: dict[str, str] | None = None) -> Consumer:
    """A read_committed reader of the ledger (eos_job.clients.LEDGER), never committing offsets."""
    return Consumer(consumer_conf(base_config(bootstrap, extra), LEDGER))


def watermarks(consumer: Consumer, topic: str, partition: int, timeout_s: float) -> tuple[int, int]:
    """A partition's low and high watermarks; retried while its leader is not yet known (a topic or
    partitions just created, a leader moving after a broker restart)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout_s, cached=False)
        except KafkaException as exc:
            if not exc.args[0].retriable() and exc.args[0].code() not in _LEADER_ERRORS or \
                    time.monotonic() > deadline:
                raise
            time.sleep(0.2)


_LEADER_ERRORS = (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                  KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.UNKNOWN_LEADER_EPOCH,
                  KafkaError.FENCED_LEADER_EPOCH, KafkaError.REPLICA_NOT_AVAILABLE)


def list_offsets(admin: AdminClient, tps: list[TopicPartition], spec, timeout_s: float,
                 isolation_level=None) -> dict[tuple[str, int], int]:
    """Each partition's offset for ``spec`` (earliest, latest); retried while a leader moves (just after a
    broker restart the metadata can name a leader epoch the broker does not know yet)."""
    deadline = time.monotonic() + timeout_s
    kwargs = {} if isolation_level is None else {"isolation_level": isolation_level}
    while True:
        futs = admin.list_offsets({tp: spec for tp in tps}, request_timeout=timeout_s, **kwargs)
        try:
            return {(tp.topic, tp.partition): f.result().offset for tp, f in futs.items()}
        except KafkaException as exc:
            err = exc.args[0]
            if not err.retriable() and err.code() not in _LEADER_ERRORS or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def read_latest(consumer: Consumer, topic: str, partition: int, key: str, *,
                timeout_s: float = 30.0, held_back_ok: bool = False,
                met: dict[bytes, list[bytes]] | None = None) -> bytes | None:
    """The value of the newest committed record with ``key`` in one ledger partition; the values of the keys
    of ``met`` that the read passed on its way back from the end (at least every one newer than the answer)
    are appended to their lists.

    Call it only after the partition's writer was fenced: then no open
    transaction holds the read_committed end back and the read is complete.
    """
    deadline = time.monotonic() + timeout_s
    low, high = watermarks(consumer, topic, partition, timeout_s)
    want = key.encode()
    end, window = high, 8
    while end > low:
        start = max(low, end - window)
        found = _scan(consumer, topic, partition, start, end, want, deadline, held_back_ok, met)
        if found is not None:
            return found
        end, window = start, window * 8
    return None


def _scan(consumer: Consumer, topic: str, partition: int, start: int, end: int, want: bytes,
          deadline: float, held_back_ok: bool = False, met: dict[bytes, list[bytes]] | None = None) -> bytes | None:
    found = None
    for msg in records(consumer, topic, partition, start, end, deadline, held_back_ok):
        if msg.key() == want:
            found = msg.value()
        elif met is not None and msg.key() in met and msg.value() is not None:
            met[msg.key()].append(msg.value())
    return found


_HIGH_WATERMARK = re.compile(r"HighwaterMark (\d+)")


def records(consumer: Consumer, topic: str, partition: int, start: int, end: int, deadline: float,
            held_back_ok: bool = False):
    """The committed records of ``topic[partition]`` from ``start`` to ``end`` (or the partition's end);
    ``LedgerHeldBack`` where an open transaction stops the read short, unless ``held_back_ok`` (the ``fence``
    negative control)."""
    consumer.assign([TopicPartition(topic, partition, start)])
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise SinkUnavailable(f"timed out reading ledger {topic}[{partition}] from offset {start}")
        # poll, not consume(n): consume waits for n messages or its timeout, and the last offset of a
        # transactional partition is a commit marker that is never delivered.
        msg = consumer.poll(min(remaining, 1.0))
        if msg is None:
            continue
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                # A read_committed end is the last stable offset (so are its watermarks); librdkafka names the
                # partition's real end, its high watermark, in the event (tests/stack/test_ledger_held_back.py).
                hw = _HIGH_WATERMARK.search(err.str())
                if hw and msg.offset() < int(hw.group(1)) and not held_back_ok:
                    raise LedgerHeldBack(
                        f"ledger {topic}[{partition}]: an open transaction holds its last stable offset at "
                        f"{msg.offset()}, below its end {hw.group(1)}, so a read_committed read stops short and could miss "
                        "committed records; it is not taken as the answer. A producer this driver did not fence "
                        "(a driver of another generation or checkpoint still running, or another stream writing "
                        "this ledger) has a transaction open there: the restart's resolution fences every "
                        "generation of the stream, and the broker aborts it after transaction.timeout.ms")
                return
            raise SinkUnavailable(f"reading ledger {topic}[{partition}]: {err}")
        if msg.offset() >= end:
            return
        yield msg


def read_history(consumer: Consumer, topic: str, prefix: str, since: int | None, *,
                 timeout_s: float = 60.0) -> dict[int, list[bytes]]:
    """The values of every batch history key ``<prefix><N>`` in partition 0, newest first, back to the
    newest tombstone of the key (a tombstoned batch with nothing newer is left out).

    Reads backwards from the partition's end in growing windows and stops once it holds the record of
    batch ``since`` (the checkpoint's last committed batch): everything the ledger knows beyond the
    checkpoint is newer than that. Without ``since``, the whole partition (bounded by compaction).
    """
    deadline = time.monotonic() + timeout_s
    low, high = watermarks(consumer, topic, protocol.BATCH_PARTITION, timeout_s)
    want = prefix.encode()
    values: dict[int, list[bytes]] = {}
    deleted: set[int] = set()
    end, window = high, 64
    while end > low:
        start = max(low, end - window)
        chunk = [(m.key(), m.value()) for m in records(consumer, topic, protocol.BATCH_PARTITION, start, end,
                                                         deadline) if m.key() and m.key().startswith(want)]
        for key, value in reversed(chunk):
            n = int(key[len(want):])
            if n in deleted:
                continue
            if value is None:
                deleted.add(n)
            else:
                values.setdefault(n, []).append(value)
        if since is not None and (since in values or since in deleted):
            break
        end, window = start, window * 4
    return values


def idempotent_producer(bootstrap: str, extra: dict[str, str] | None = None) -> Producer:
    conf = base_config(bootstrap, extra)
    conf.update({"enable.idempotence": True, "acks": "all", "linger.ms": 0})
    return Producer(conf)


def produce_sync(producer: Producer, topic: str, partition: int, key: str, value: bytes | None,
                 timeout_s: float = 30.0, *, more: tuple[tuple[str, bytes | None], ...] = ()) -> None:
    """Write ``key: value`` (then each of ``more``, in order; None is a tombstone) and wait for all."""
    errors: list = []
    for k, v in ((key, value), *more):
        producer.produce(topic, value=v, key=k.encode(), partition=partition,
                         on_delivery=lambda err, _msg: errors.append(err) if err else None)
    remaining = producer.flush(timeout_s)
    if remaining or errors:
        raise SinkUnavailable(f"could not write to {topic}[{partition}]: "
                              f"{errors[0] if errors else 'delivery timed out'}")
