#!/usr/bin/env python3
"""Micro-benchmark of the slot task's produce path, outside Spark.

Measures, for one slot's worth of ~100-byte records in Arrow batches, the
wall and CPU time (this process, librdkafka threads included) of one
transaction written

* ``sink``: with ``eos_job.slot_produce.produce_batch`` as it is (per-record
  ``produce`` with keyword arguments and a per-record delivery callback);
* ``sink+onlyerror``: the same with ``delivery.report.only.error=true``
  (delivery callbacks for failed records only);
* ``zip``: a fast path for the common case (no topic/partition/headers/error
  columns, no poison records): ``for k, v in zip(keys, values): produce(...)``;
* ``zip+onlyerror``: both;
* ``zip+onlyerror+audit``: the same with the two audit headers every record of the sink carries
  (``eos_job.audit.audit_headers``: ``eos.batch``, ``eos.slot``), i.e. the sink's common case minus its
  per-row bookkeeping, so that ``zip+onlyerror`` against it is what the headers cost;
* ``produce_batch``: ``Producer.produce_batch`` with a list of dicts.

Variants alternate over ``--repeats``; the median counts. Run:
``PYTHONPATH=jobs:stack .venv/bin/python benchmarks/produce_micro.py``
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for _p in (REPO / "stack", REPO / "jobs", REPO):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import pyarrow as pa  # noqa: E402
from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

VARIANTS = ("sink", "sink+onlyerror", "zip", "zip+onlyerror", "zip+onlyerror+audit", "produce_batch")


class _Cfg:
    def __init__(self, topic):
        self.topic = topic
        self.dead_letter_topic = None
        self.batch = 0
        self.checkpoint_id = "0123456789abcdef"
        self.generation = 0


def arrow_batches(n: int, per_batch: int = 10_000) -> list[pa.RecordBatch]:
    out = []
    pad = b"x" * 79
    for start in range(0, n, per_batch):
        keys = [b"%010d" % i for i in range(start, min(n, start + per_batch))]
        out.append(pa.RecordBatch.from_arrays([pa.array([k + b"|" + pad for k in keys], pa.binary()),
                                               pa.array(keys, pa.binary())], names=["value", "key"]))
    return out


def run_variant(variant: str, producer: Producer, topic: str, batches: list[pa.RecordBatch]) -> None:
    from eos_job.slot_produce import produce_batch
    failures: list = []

    def on_delivery(err, msg):
        if err is not None:
            failures.append(err)

    producer.begin_transaction()
    if variant.startswith("sink"):
        for b in batches:
            produce_batch(_Cfg(topic), producer, b, 0, on_delivery, {})
    elif variant.startswith("zip"):
        from eos_job.audit import audit_headers
        produce = producer.produce
        cfg = _Cfg(topic)
        headers = audit_headers(cfg.checkpoint_id, cfg.generation, 0, cfg.batch) if variant.endswith("audit") else None
        for b in batches:
            names = b.schema.names
            keys = b.column(names.index("key")).to_pylist()
            values = b.column(names.index("value")).to_pylist()
            for k, v in zip(keys, values):
                try:
                    produce(topic, v, k, headers=headers, on_delivery=on_delivery)
                except BufferError:
                    producer.poll(0.5)
                    produce(topic, v, k, headers=headers, on_delivery=on_delivery)
    elif variant == "produce_batch":
        for b in batches:
            names = b.schema.names
            keys = b.column(names.index("key")).to_pylist()
            values = b.column(names.index("value")).to_pylist()
            msgs = [{"key": k, "value": v} for k, v in zip(keys, values)]
            while msgs:
                queued = producer.produce_batch(topic, msgs, on_delivery=on_delivery)
                if queued == len(msgs):
                    break
                # a full queue refuses the rest (no BufferError): serve deliveries and retry those
                msgs = [m for m in msgs if "_error" in m]
                for m in msgs:
                    del m["_error"]
                producer.poll(0.5)
    producer.commit_transaction(60)
    if failures:
        raise RuntimeError(f"{len(failures)} delivery failures: {failures[0]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=50_000,
                    help="records per transaction (one slot of a 100,000-record batch at parallelism 2)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--bootstrap")
    a = ap.parse_args(argv)
    bootstrap = a.bootstrap
    if not bootstrap:
        from eos_stack.common import read_env_file
        bootstrap = read_env_file(REPO / ".stack" / "env")["KAFKA_BOOTSTRAP"]
    run_id = uuid.uuid4().hex[:6]
    topic = f"bench-micro-{run_id}"
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        for f in admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)]).values():
            f.result(30)
        batches = arrow_batches(a.records)
        producers = {}
        for v in VARIANTS:
            conf = {"bootstrap.servers": bootstrap, "transactional.id": f"bench-micro-{run_id}-{v}",
                    "enable.idempotence": True, "acks": "all", "partitioner": "murmur2_random", "linger.ms": 5}
            if "onlyerror" in v:
                conf["delivery.report.only.error"] = True
            producers[v] = Producer(conf)
            producers[v].init_transactions(30)
        res: dict[str, list[tuple[float, float]]] = {v: [] for v in VARIANTS}
        try:
            for rep in range(a.repeats + 1):  # the first round warms up
                order = VARIANTS if rep % 2 == 0 else tuple(reversed(VARIANTS))
                for v in order:
                    w0, c0 = time.perf_counter(), time.process_time()
                    run_variant(v, producers[v], topic, batches)
                    w, c = time.perf_counter() - w0, time.process_time() - c0
                    if rep:
                        res[v].append((w, c))
            print(f"{a.records:,} records per transaction, median of {a.repeats}:")
            print("| variant | wall s | CPU s | records/s (wall) | CPU µs/record | CPU vs sink |")
            print("| --- | ---: | ---: | ---: | ---: | ---: |")
            base = statistics.median(c for _, c in res["sink"])
            for v in VARIANTS:
                w = statistics.median(x for x, _ in res[v])
                c = statistics.median(y for _, y in res[v])
                print(f"| {v} | {w:.3f} | {c:.3f} | {a.records / w:,.0f} | {c / a.records * 1e6:.2f} "
                      f"| {c / base:.2f} |")
        finally:
            for f in admin.delete_topics([topic], operation_timeout=30).values():
                f.result(60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
