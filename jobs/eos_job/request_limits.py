"""How large one produce request may be on the sink's topics: read at start, applied by the slot producers.

Kafka checks each record batch against its topic's ``max.message.bytes``. librdkafka fills a partition's
batch up to ``batch.size`` (bounded by ``message.max.bytes``) and, unlike Kafka's Java producer, does not
split a batch the broker refuses as too large: the whole request fails with ``MSG_SIZE_TOO_LARGE``, the
transaction with it, and none of those records is wrong by itself. So before the stream starts, the
driver reads ``max.message.bytes`` of the sink topic and the dead-letter topic (Kafka answers a topic's
effective value, the broker's ``message.max.bytes`` where the topic sets none) and compares it with the
largest request the slot producers would send.

The choice: where ``sink.producerConfig`` leaves ``batch.size`` unset, the runtime sets it under the
smallest limit and says so in the log, as a platform should; where the user set ``batch.size`` and the
request it allows cannot fit, the start is refused with both settings named, since an explicit setting is
never silently overridden. Either way no request of several records can be refused for its size, and a
refusal the sink still meets (a topic's limit lowered while the stream runs, a topic the transformation
routes records to) is retried by the slot in requests of one record (``poison``), never dead-lettered.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from confluent_kafka import KafkaException

from .contract import SpecRefused

log = logging.getLogger(__name__)

# librdkafka's defaults (CONFIGURATION.md): a batch is filled up to the smaller of the two.
DEFAULT_BATCH_SIZE = 1_000_000
DEFAULT_MESSAGE_MAX_BYTES = 1_000_000


def batch_room(limit: int) -> int:
    """The largest batch.size under a topic limit: room for the request's framing and for a compression
    codec that grows incompressible data by a few bytes."""
    return limit - max(1024, limit // 100)


@dataclass(frozen=True)
class SinkLimits:
    """``topic_bytes``: max.message.bytes of each sink topic that could be read; ``batch_size``: the
    batch.size the runtime gives the slot producers (None: the configured one fits)."""
    topic_bytes: dict[str, int] = field(default_factory=dict)
    batch_size: int | None = None

    def producer_overrides(self) -> dict[str, str]:
        return {} if self.batch_size is None else {"batch.size": str(self.batch_size)}


def _setting(conf: dict[str, str], key: str) -> int | None:
    try:
        return int(conf[key]) if key in conf else None
    except ValueError:
        return None   # librdkafka itself refuses the producer, naming the setting


def fit_batch(producer_config: dict[str, str], topic_bytes: dict[str, int], fields: dict[str, str]) -> SinkLimits:
    """The batch.size the slot producers need under ``topic_bytes`` (``fields``: topic -> the spec field that
    names it); raises SpecRefused when an explicit ``sink.producerConfig.batch.size`` cannot fit."""
    if not topic_bytes:
        return SinkLimits()
    topic = min(topic_bytes, key=topic_bytes.get)
    limit = topic_bytes[topic]
    room = batch_room(limit)
    explicit = _setting(producer_config, "batch.size")
    max_bytes = _setting(producer_config, "message.max.bytes") or DEFAULT_MESSAGE_MAX_BYTES
    request = min(explicit or DEFAULT_BATCH_SIZE, max_bytes)
    if request <= room:
        return SinkLimits(dict(topic_bytes))
    where = f"topic {topic!r} ({fields.get(topic, 'a sink topic')})"
    if explicit is not None:
        raise SpecRefused(
            f"sink.producerConfig.batch.size = {explicit} does not fit {where}: its max.message.bytes = {limit}, "
            f"and the broker refuses a whole request of records above it (MSG_SIZE_TOO_LARGE), none of which is "
            f"wrong by itself. Set sink.producerConfig.batch.size to at most {room} (or remove it: the runtime "
            f"then fits it), or raise the topic's max.message.bytes; nothing was written")
    log.info("sink.producerConfig.batch.size is not set: the slot producers use batch.size=%d, under "
             "max.message.bytes=%d of %s (librdkafka's default request of %d bytes would be refused whole)",
             room, limit, where, request)
    return SinkLimits(dict(topic_bytes), room)


def read_topic_limits(admin, topics: list[str], timeout_s: float) -> dict[str, int]:
    """max.message.bytes of each of ``topics``; a topic whose configs cannot be read (no describe-configs ACL)
    is left out with a warning: its requests are then fitted by the slots' retries alone."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    resources = {ConfigResource(ResourceType.TOPIC, t): t for t in topics}
    futures = admin.describe_configs(list(resources), request_timeout=timeout_s)
    limits: dict[str, int] = {}
    for res, fut in futures.items():
        topic = resources.get(res, getattr(res, "name", None))
        try:
            entry = fut.result(timeout_s).get("max.message.bytes")
            value = int(entry.value) if entry is not None and entry.value is not None else None
            limits[topic] = value if value is not None else _broker_limit(admin, timeout_s)
        except (KafkaException, ValueError, TimeoutError) as exc:
            log.warning("cannot read max.message.bytes of topic %r (%s): the start check of its request size is "
                        "skipped; grant the stream describe-configs on it", topic, exc)
    return limits


def _broker_limit(admin, timeout_s: float) -> int:
    """message.max.bytes of a broker of the cluster: the limit of a topic that sets none."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    broker = next(iter(admin.list_topics(timeout=timeout_s).brokers))
    res = ConfigResource(ResourceType.BROKER, str(broker))
    entries = admin.describe_configs([res], request_timeout=timeout_s)[res].result(timeout_s)
    return int(entries["message.max.bytes"].value)


def check_sink_limits(admin, producer_config: dict[str, str], fields: dict[str, str], timeout_s: float) -> SinkLimits:
    """The start check: read the limits of the topics in ``fields`` (topic -> spec field), fit the batch."""
    return fit_batch(producer_config, read_topic_limits(admin, list(fields), timeout_s), fields)
