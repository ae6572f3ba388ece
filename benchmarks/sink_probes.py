"""Executor-side probes for the sink benchmark's cost breakdown.

Each probe is a ``mapInArrow`` function run over ``repartition(P, key)``, like
the exactly-once sink's slot task, that stops after one more step of the
sink's write path, so the difference between two probes is the cost of that
step:

* ``arrow``:    receive the slot's rows as Arrow batches (shuffle read, JVM to Python).
* ``convert``:  + the slot digest (numpy) and ``to_pylist`` of key and value, as ``_produce_batch`` does.
* ``produce``:  + the per-record ``produce`` loop of ``_produce_batch`` (idempotent producer,
                per-record delivery callback) and ``flush``: no transaction.
* ``tx``:       + one transaction per slot and batch (begin, produce, commit), no ledger.
* ``tx-onlyerror``: ``tx`` with ``delivery.report.only.error=true`` (no Python callback
                for successful records).

Each task returns one row with its own timings, so the report can say where
the executor time goes. The transactional probes use a transactional id per
(Python worker, slot) and so never fence each other; they are probes, not an
exactly-once writer.
"""
from __future__ import annotations

import os
import time
from typing import Iterator

import pyarrow as pa

PROBE_SCHEMA = ("slot int, rows long, t_recv double, t_convert double, t_produce double, t_commit double, "
                "pid int")
MODES = ("arrow", "convert", "produce", "tx", "tx-onlyerror")

_producers: dict[tuple, object] = {}


def _producer(mode: str, bootstrap: str, prefix: str, slot: int):
    from confluent_kafka import Producer
    key = (mode, prefix, slot)
    p = _producers.get(key)
    if p is not None:
        return p
    conf = {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
            "partitioner": "murmur2_random", "linger.ms": 5}
    if mode.startswith("tx"):
        conf["transactional.id"] = f"{prefix}-{mode}-{slot}-{os.getpid()}"
        conf["transaction.timeout.ms"] = 60000
    if mode.endswith("onlyerror"):
        conf["delivery.report.only.error"] = True
    p = Producer(conf)
    if mode.startswith("tx"):
        p.init_transactions(60)
    _producers[key] = p
    return p


def probe_task(mode: str, bootstrap: str, topic: str, prefix: str):
    if mode not in MODES:
        raise ValueError(f"unknown probe mode {mode!r}; one of {MODES}")

    def run(iterator: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import numpy as np
        from pyspark import TaskContext

        slot = TaskContext.get().partitionId()
        t0 = time.perf_counter()
        batches = [b for b in iterator]
        t1 = time.perf_counter()
        rows = sum(b.num_rows for b in batches)
        t2 = t3 = t4 = t1
        if mode != "arrow":
            hashes = [b.column(b.schema.get_field_index("__eos_hash")).to_numpy(zero_copy_only=False)
                      for b in batches if b.num_rows]
            if hashes:
                int(np.concatenate(hashes).astype(np.uint64).sum(dtype=np.uint64))
            converted = []
            for b in batches:
                names = b.schema.names
                converted.append((b.column(names.index("key")).to_pylist(), b.column(names.index("value")).to_pylist()))
            t2 = t3 = t4 = time.perf_counter()
            if mode != "convert" and rows:
                p = _producer(mode, bootstrap, prefix, slot)
                failures: list = []

                def on_delivery(err, msg):
                    if err is not None:
                        failures.append(err)

                if mode.startswith("tx"):
                    p.begin_transaction()
                produce = p.produce
                for keys, values in converted:
                    for i in range(len(values)):
                        k, v = keys[i], values[i]
                        try:
                            produce(topic, value=v, key=k, headers=None, on_delivery=on_delivery)
                        except BufferError:
                            p.poll(0.5)
                            produce(topic, value=v, key=k, headers=None, on_delivery=on_delivery)
                t3 = time.perf_counter()
                if mode.startswith("tx"):
                    p.commit_transaction(60)
                else:
                    if p.flush(60):
                        raise RuntimeError("probe producer: flush timed out")
                t4 = time.perf_counter()
                if failures:
                    raise RuntimeError(f"probe producer: {len(failures)} delivery failures, first {failures[0]}")
        row = {"slot": slot, "rows": rows, "t_recv": t1 - t0, "t_convert": t2 - t1, "t_produce": t3 - t2,
               "t_commit": t4 - t3, "pid": os.getpid()}
        yield pa.RecordBatch.from_pylist([row], schema=pa.schema([
            ("slot", pa.int32()), ("rows", pa.int64()), ("t_recv", pa.float64()), ("t_convert", pa.float64()),
            ("t_produce", pa.float64()), ("t_commit", pa.float64()), ("pid", pa.int32())]))

    return run
