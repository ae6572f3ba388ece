"""Which records are poison: dead letters only for what is wrong with a record by itself.

A record is poison when
- the transformation marked it (its ``error`` column),
- ``produce()`` refused it alone: ``MSG_SIZE_TOO_LARGE``, the record over the producer's message.max.bytes,
- it is over its topic's max.message.bytes by itself (read at start, ``request_limits``; checked before it
  is produced, when the producer sends records uncompressed), or
- the broker refused it with a record error (too large, invalid record or timestamp) *while it was alone
  in its request*.

Everything else is not the record's fault and never a dead letter: a request the broker refuses whole
(librdkafka hands the same ``MSG_SIZE_TOO_LARGE`` to every record of it), a transient error
(``_UNKNOWN_PARTITION`` right after the topic gained partitions, ``_QUEUE_FULL``, ``_MSG_TIMED_OUT``,
``NOT_ENOUGH_REPLICAS``, a leader change), a fenced producer. Such a transaction is aborted and written
again: a record the broker refused with a record error becomes a *suspect* and goes in a request of its own
the next time (``Verdicts``); only if it is refused again, alone, is it poison. Any other failure makes
the slot fence again (``sink.write_slot``), and its task fails when that does not cure it. Suspects and
verdicts are a broker's deterministic answers about one record, so a replay makes the same choice.
"""
from __future__ import annotations

import hashlib
import logging
from collections import Counter

from .audit import audit_headers

log = logging.getLogger(__name__)

# A v2 record batch's header: a batch of one record is at least this plus the record's key and value.
BATCH_HEADER = 61
DEAD_LETTER_MAX_VALUE = 512 * 1024   # what a dead letter keeps of a record's value at most


def _codes(*names: str) -> frozenset:
    from confluent_kafka import KafkaError
    return frozenset(getattr(KafkaError, n) for n in names if hasattr(KafkaError, n))


# Refusals the broker gives a record (or, for the size ones, a whole request: then every record of it).
RECORD_ERRORS = _codes("MSG_SIZE_TOO_LARGE", "RECORD_LIST_TOO_LARGE", "INVALID_RECORD", "INVALID_TIMESTAMP",
                       "CORRUPT_MESSAGE")
_TOO_LARGE = _codes("MSG_SIZE_TOO_LARGE")


def refused_on_produce(err) -> bool:
    """``produce()`` raised ``err`` for one record: poison only when the record alone is over the producer's
    message.max.bytes; anything else (``_UNKNOWN_PARTITION``, ``_UNKNOWN_TOPIC``, a fenced or failed
    producer) is retried with a fresh fence."""
    return not err.fatal() and err.code() in _TOO_LARGE


def checked_limits(producer_config: dict[str, str], topic_bytes: dict[str, int]) -> dict[str, int]:
    """The topic limits a record's size is checked against before it is produced: none when the producer
    compresses, since a record over the limit may then still fit (the broker's answer for the record,
    alone in its request, decides)."""
    codec = producer_config.get("compression.type", producer_config.get("compression.codec", "none"))
    return dict(topic_bytes) if codec in ("none", "") else {}


def too_large(topic: str, key: bytes | None, value: bytes | None, limits: dict[str, int]) -> str | None:
    """Why the record is over its topic's max.message.bytes by itself, or None (fits, or limit unknown)."""
    limit = limits.get(topic)
    if limit is None:
        return None
    size = BATCH_HEADER + len(key or b"") + len(value or b"")
    if size <= limit:
        return None
    return (f"MSG_SIZE_TOO_LARGE: the record takes at least {size} bytes in a batch of its own, over "
            f"max.message.bytes {limit} of topic {topic!r}")


def identity(topic: str, key: bytes | None, value: bytes | None) -> bytes:
    """A record's identity for ``Verdicts``: a 128-bit digest of (topic, key, value), so that a slot whose
    every record was refused (a request limit lowered under a large slot) costs no copy of its values."""
    h = hashlib.blake2b(digest_size=16)
    for part in (topic.encode(), key, value):
        h.update(b"\x00" if part is None else b"\x01%d:" % len(part) + part)
    return h.digest()


class Verdicts:
    """What the rounds of one slot task learned of its records: ``poison`` (identity -> why) and
    ``suspects`` (refused with a record error in a request of several: sent alone next time)."""

    def __init__(self, alone: bool = True):
        self.poison: dict[bytes, str] = {}
        self.suspects: set[bytes] = set()
        self.alone = alone   # False only in the negative control (faults: ``poison-alone``)

    def __bool__(self) -> bool:
        return bool(self.poison or self.suspects)

    def learn(self, failures: list[tuple[str, bytes, object]], slot: int, batch: int) -> bool:
        """Take a round's delivery failures ((topic, identity, KafkaError)); True when something new was
        learned, so that writing the slot again can end otherwise. A failure that is no record error, or a
        refusal learned before, teaches nothing: the caller then fences again."""
        learned = False
        split = Counter()
        for topic, ident, err in failures:
            if err.code() not in RECORD_ERRORS:
                continue
            if ident in self.suspects or not self.alone:
                if ident not in self.poison:     # refused while alone in its request: poison by itself
                    self.poison[ident] = str(err)
                    learned = True
            else:
                self.suspects.add(ident)
                split[(topic, err.str())] += 1
                learned = True
        for (topic, why), n in split.items():
            log.warning("slot %d batch %d: topic %r refused %d record(s) sent in requests of several (%s); "
                        "each goes in a request of its own now, and only one refused alone is a dead letter. A "
                        "request over the topic's max.message.bytes is refused whole: keep "
                        "sink.producerConfig.batch.size under it", slot, batch, topic, n, why)
        return learned


def dead_letter(cfg, topic: str, key, value, why: str, slot: int) -> tuple[str, bytes | None, object, list]:
    """The dead letter of a poison record (topic, value, key, headers): what came in, why, where it was going
    and which slot and batch, for ``sink.deadLetterTopic`` in the slot's transaction."""
    if not cfg.dead_letter_topic:
        raise RuntimeError(f"a record for topic {topic!r} cannot be written ({why}) and sink.deadLetterTopic "
                           "is not set: set it so poison records are kept, or fix the transformation. "
                           "The stream stops here rather than drop the record")
    headers = [("eos.error", str(why)[:4000].encode()), ("eos.topic", topic.encode()),
               *audit_headers(cfg.checkpoint_id, cfg.generation, slot, cfg.batch)]
    value_bytes = value if isinstance(value, (bytes, type(None))) else str(value).encode()
    room = DEAD_LETTER_MAX_VALUE
    limits = [cfg.topic_limits.get(cfg.dead_letter_topic), cfg.producer_config.get("message.max.bytes")]
    limits = [int(x) for x in limits if x is not None and str(x).isdigit()]
    if limits:   # keep the dead letter itself writable: under its topic's and its producer's limits
        framing = BATCH_HEADER + 64 + len(key or b"") + sum(len(k) + len(v) + 8 for k, v in headers)
        room = max(0, min(room, min(limits) - framing))
    if value_bytes is not None and len(value_bytes) > room:
        value_bytes = value_bytes[:room]
    return cfg.dead_letter_topic, value_bytes, key, headers
