"""The benchmarks' Kafka side: their topics, the keyed input records, and the exactly-once check of an output.

* ``Topics``: the topics a benchmark creates (or that its streams create), all
  deleted at its end; its admin client closed by ``close()``.
* ``produce_records``: N records of ~100 bytes (``KEY_BYTES + VALUE_BYTES``),
  key ``%010d`` of 0..N-1, value the key, ``|`` and padding (or a value of its own per record).
* ``input_ends``: a topic's end offsets by partition.
* ``audit``: an output topic read read_committed, every key 0..N-1 counted (or only the expected ones).

Used by the sink benchmark (``sink_throughput.py``, ``sink_shapes.py``) and ``executors.py``.
"""
from __future__ import annotations

import time
import uuid
from typing import Callable

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from benchmarks.report import say

KEY_BYTES, VALUE_BYTES = 10, 90


class Topics:
    def __init__(self, bootstrap: str):
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        self.created: list[str] = []

    def create(self, topics: dict[str, int]) -> None:
        futs = self.admin.create_topics([NewTopic(t, num_partitions=n, replication_factor=1) for t, n in topics.items()])
        for t, f in futs.items():
            f.result(30)
            self.created.append(t)
        # The create's answer comes before every broker's metadata has the topic: the sink's pre-flight,
        # which reads metadata, would call it missing.
        deadline = time.monotonic() + 30
        while set(topics) - set(self.admin.list_topics(timeout=10).topics):
            if time.monotonic() > deadline:
                raise RuntimeError(f"topics {sorted(topics)} created but not in the metadata after 30 s")
            time.sleep(0.1)

    def track(self, topic: str) -> None:
        self.created.append(topic)

    def delete(self, topics: list[str]) -> None:
        """Delete these topics now (those that exist), e.g. a measured run's output once it was read back."""
        existing = set(self.admin.list_topics(timeout=15).topics)
        gone = [t for t in dict.fromkeys(topics) if t in existing]
        if gone:
            for f in self.admin.delete_topics(gone, operation_timeout=30).values():
                try:
                    f.result(60)
                except Exception as exc:  # noqa: BLE001 - cleanup is best effort
                    say(f"could not delete a topic: {exc}")
        self.created = [t for t in self.created if t not in topics]

    def delete_all(self) -> None:
        self.delete(self.created)

    def close(self) -> None:
        """Close the admin client now: left to the garbage collector, it may be destroyed on its own librdkafka
        thread, which aborts the process."""
        self.admin.__exit__(None, None, None)


def produce_records(bootstrap: str, topic: str, n: int, value: Callable[[int], bytes] | None = None) -> float:
    """N keyed ~100-byte records (``value(i)``: record i's value instead); returns the seconds it took."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1_000_000,
                  "queue.buffering.max.messages": 1_000_000, "acks": "all", "enable.idempotence": True})
    errors: list = []
    p_conf_cb = lambda err, _m: errors.append(err) if err else None  # noqa: E731
    pad = b"x" * (VALUE_BYTES - KEY_BYTES - 1)
    t0 = time.monotonic()
    step = max(n // 5, 1)
    for i in range(n):
        k = b"%010d" % i
        v = k + b"|" + pad if value is None else value(i)
        try:
            p.produce(topic, key=k, value=v, on_delivery=p_conf_cb)
        except BufferError:
            p.poll(0.2)
            p.produce(topic, key=k, value=v, on_delivery=p_conf_cb)
        if (i + 1) % step == 0 and n >= 100_000:
            say(f"  produced {i + 1:,}/{n:,}")
    if p.flush(300) or errors:
        raise RuntimeError(f"could not produce the input: {errors[:3]}")
    return time.monotonic() - t0


def input_ends(bootstrap: str, topic: str) -> dict[str, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-ends-{uuid.uuid4().hex[:6]}"})
    try:
        parts = c.list_topics(topic, timeout=15).topics[topic].partitions
        return {str(p): c.get_watermark_offsets(TopicPartition(topic, p), timeout=15)[1] for p in parts}
    finally:
        c.close()


def audit(bootstrap: str, topic: str, n: int, timestamps: bool = False, expect: np.ndarray | None = None) -> dict:
    """Read ``topic`` read_committed: every key 0..n-1 counted; with ``timestamps``, also the first and last
    record timestamps (epoch seconds). ``expect`` (n booleans): only these keys are expected, the others
    (a filtered job's dropped records) count as ``unexpected`` when seen; ``expected`` is their number."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-audit-{uuid.uuid4().hex[:8]}",
                  "isolation.level": "read_committed", "enable.partition.eof": True,
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        parts = list(c.list_topics(topic, timeout=15).topics[topic].partitions)
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        seen = np.zeros(n, dtype=np.uint32)
        eof: set[int] = set()
        total = other = 0
        first_ms, last_ms = None, None
        deadline = time.monotonic() + 300
        while len(eof) < len(parts):
            if time.monotonic() > deadline:
                raise TimeoutError(f"audit of {topic}: no end of partitions after 300s")
            keys = []
            for m in c.consume(10_000, 1.0):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        eof.add(m.partition())
                        continue
                    raise RuntimeError(f"audit of {topic}: {err}")
                keys.append(m.key())
                if timestamps:
                    ts = m.timestamp()[1]
                    first_ms = ts if first_ms is None else min(first_ms, ts)
                    last_ms = ts if last_ms is None else max(last_ms, ts)
            if keys:   # counted a consume() at a time: ten million records read back in seconds, not minutes
                total += len(keys)
                ks = _key_numbers(keys)
                inside = (ks >= 0) & (ks < n)
                other += len(keys) - int(inside.sum())
                np.add.at(seen, ks[inside], 1)
        distinct = int(np.count_nonzero(seen))
        out = {"records": total, "distinct": distinct, "duplicates": total - distinct - other,
               "missing": n - distinct, "unexpected": other}
        if expect is not None:
            wanted = int(np.count_nonzero(seen[expect]))
            out.update({"expected": int(expect.sum()), "distinct": wanted, "missing": int(expect.sum()) - wanted,
                        "unexpected": other + int(np.count_nonzero(seen[~expect]))})
        if timestamps:
            out.update({"first_record_ts": first_ms / 1000 if first_ms else None,
                        "last_record_ts": last_ms / 1000 if last_ms else None})
        return out
    finally:
        c.close()


def _key_numbers(keys: list) -> np.ndarray:
    """Record keys (``%010d``) as numbers; -1 for a key that is not one."""
    try:
        arr = np.array(keys)
        if arr.dtype.kind == "S":
            return arr.astype(np.int64)
    except (ValueError, TypeError, OverflowError):
        pass
    return np.array([int(k) if k is not None and k.isdigit() and len(k) < 19 else -1 for k in keys], dtype=np.int64)
