"""The sink benchmark's job shapes and producer settings.

A shape is the job both sinks run, its input records, the check of an output topic and how the latency
probe stamps its records:

* ``map``: ``benchmarks/map_only.py``, a filter and a projection over ~100-byte keyed records
  (``kafka_io.produce_records``); the tenth whose key ends in 0 is dropped. An output holds every other
  key: exactly once for the exactly-once sink, at least once for the built-in one.
* ``stateful``: the colors count (``examples/colors/job.py``), a streaming groupBy count in update mode over
  JSON color events (``{"id": i, "color": c}``, the colors of ``examples.colors.generator.COLORS`` in a
  fixed order of 15, orange dropped by the job); every batch writes the updated count of each color it
  touched. An output's last count per color equals the input's.

Producer settings (``producers``): ``tuned`` gives Spark's kafka-clients producer (``kafka.*`` options of
the built-in sink) and the exactly-once sink's librdkafka producers (``sink.producerConfig``) the same
linger.ms, batch size, compression and acks; ``default`` sets none of them.
"""
from __future__ import annotations

import json
import random
from collections import Counter

import numpy as np

from benchmarks import kafka_io
from benchmarks.map_only import DROP_DIGIT
from examples.colors.generator import COLORS, DROPPED

INPUT_PARTITIONS = 4   # every input topic of the benchmark

# What each sink's producer does when nothing is set (kafka-clients 3.9, librdkafka 2.x, eos_job.sink).
DEFAULTS = {
    "builtin": "kafka-clients defaults: linger.ms 0, batch.size 16384, compression.type none, acks all, "
               "enable.idempotence true",
    "ours": "the runtime's linger.ms 5, acks all and enable.idempotence true (transactions), librdkafka's "
            "batch.size 1000000, batch.num.messages 10000, compression.type none",
}


def producers(linger_ms: int, batch_bytes: int, compression: str) -> dict[str, dict[str, dict[str, str]]]:
    """Per setting, the built-in sink's writer options and the exactly-once sink's ``producerConfig``.

    acks is ``all`` on both: the exactly-once sink's producers are transactional (the runtime sets acks all
    and refuses it in producerConfig), so the built-in sink is given the same. librdkafka also caps a batch
    by message count (batch.num.messages): raised to its maximum, so the byte size governs on both sides,
    as kafka-clients has no count cap.
    """
    return {
        "tuned": {
            "builtin": {"kafka.linger.ms": str(linger_ms), "kafka.batch.size": str(batch_bytes),
                        "kafka.compression.type": compression, "kafka.acks": "all",
                        "kafka.enable.idempotence": "true"},
            "ours": {"linger.ms": str(linger_ms), "batch.size": str(batch_bytes), "batch.num.messages": "1000000",
                     "compression.type": compression},
        },
        "default": {"builtin": {}, "ours": {}},
    }


class MapShape:
    name = "map"
    title = "map-only (filter + project)"
    module = "benchmarks.map_only"
    args = {"dropDigit": DROP_DIGIT}
    record_bytes = kafka_io.KEY_BYTES + kafka_io.VALUE_BYTES
    describe = (f"`benchmarks/map_only.py`: drops the records whose key ends in {DROP_DIGIT} (a tenth), keeps key "
                f"and value; ~{kafka_io.KEY_BYTES + kafka_io.VALUE_BYTES}-byte keyed records")

    @staticmethod
    def kept(n: int) -> np.ndarray:
        """Which of records 0..n-1 the job keeps."""
        return np.arange(n) % 10 != int(DROP_DIGIT)

    def produce(self, bootstrap: str, topic: str, n: int) -> float:
        return kafka_io.produce_records(bootstrap, topic, n)

    def audit(self, bootstrap: str, topic: str, n: int) -> dict:
        return kafka_io.audit(bootstrap, topic, n, expect=self.kept(n))

    @staticmethod
    def problem(sink: str, au: dict) -> str | None:
        """What is wrong with an output: ours must hold every kept key once, the built-in sink at least once."""
        if au["missing"] or au["unexpected"]:
            return f"{au['missing']} kept keys missing, {au['unexpected']} unexpected records"
        if sink != "builtin" and (au["duplicates"] or au["records"] != au["expected"]):
            return f"{au['duplicates']} duplicates ({au['records']:,} records for {au['expected']:,} keys)"
        return None

    @staticmethod
    def summary(au: dict) -> str:
        return (f"{au['records']:,} records, {au['distinct']:,} of {au['expected']:,} kept keys, "
                f"{au['duplicates']} duplicates, {au['missing']} missing, {au['unexpected']} unexpected")

    # latency probe: the value carries the sequence number; a record is visible when it is read
    _pad = b"x" * (kafka_io.VALUE_BYTES - 10 - 1 - 19 - 1)

    def latency_value(self, seq: int, key: bytes, ts_ns: int) -> bytes:
        return b"%s|%019d|%s" % (key, ts_ns, self._pad)


class StatefulShape:
    name = "stateful"
    title = "stateful (colors count)"
    module = "examples.colors.job"
    args = {"drop": ",".join(DROPPED)}
    # The 15 colors of one cycle, in a fixed shuffled order: record i has PATTERN[i % 15].
    PATTERN = random.Random(15).sample([c for c, w in COLORS.items() for _ in range(w)], sum(COLORS.values()))
    _values = [c.encode() for c in PATTERN]
    record_bytes = kafka_io.KEY_BYTES + len(b'{"id": 5000000, "color": "green"}')
    describe = ("`examples/colors/job.py`: JSON color events, orange dropped, groupBy(color).count() in update "
                f"mode, state in {len(COLORS) - len(DROPPED)} keys; ~{record_bytes}-byte records (key `%010d`)")

    @classmethod
    def color(cls, seq: int) -> str:
        return cls.PATTERN[seq % len(cls.PATTERN)]

    @classmethod
    def value(cls, seq: int) -> bytes:
        return b'{"id": %d, "color": "%s"}' % (seq, cls._values[seq % len(cls._values)])

    @classmethod
    def expected(cls, n: int) -> dict[str, int]:
        """The final count per counted color of records 0..n-1."""
        full, rest = divmod(n, len(cls.PATTERN))
        c = Counter({k: w * full for k, w in COLORS.items()})
        c.update(cls.PATTERN[:rest])
        return {k: v for k, v in sorted(c.items()) if k not in DROPPED and v}

    def produce(self, bootstrap: str, topic: str, n: int) -> float:
        return kafka_io.produce_records(bootstrap, topic, n, value=self.value)

    def audit(self, bootstrap: str, topic: str, n: int) -> dict:
        from eos_job.verify import audit_counts
        a = audit_counts(bootstrap, topic, timeout_s=120)
        want = self.expected(n)
        return {"final": a.final, "expected": want, "updates": a.updates, "duplicates": len(a.duplicates),
                "regressions": len(a.regressions), "counts_equal": a.final == want}

    @staticmethod
    def problem(sink: str, au: dict) -> str | None:
        """Ours: the last count per color equals the input's, no update twice or going back; the built-in
        sink: the last counts equal the input's (an update written twice is at-least-once)."""
        if not au["counts_equal"]:
            return f"final counts {au['final']} != expected {au['expected']}"
        if sink != "builtin" and (au["duplicates"] or au["regressions"]):
            return f"{au['duplicates']} updates written twice, {au['regressions']} going back"
        return None

    @staticmethod
    def summary(au: dict) -> str:
        return (f"{au['updates']:,} count updates, final counts {'equal' if au['counts_equal'] else 'DIFFER from'} "
                f"the input's {json.dumps(au['expected'])}, {au['duplicates']} repeated, "
                f"{au['regressions']} going back")

    def latency_value(self, seq: int, key: bytes, ts_ns: int) -> bytes:
        return self.value(seq)


SHAPES = {s.name: s for s in (MapShape(), StatefulShape())}
