"""Candidate fixes of the exactly-once sink, applied in the benchmark only.

``eos_job/sink.py`` is not edited by the benchmark. To measure a proposed
change, ``patched_slot_task(name)`` returns a drop-in for ``sink.slot_task``
whose task patches ``eos_job.sink`` inside the Python worker for the duration
of that task only (restored in ``finally``), so runs of the unmodified sink in
the same workers are not affected.

Patches:

* ``ledger-check``: reuse a worker's cached slot producer only if the slot's
  latest ledger record is the one this producer committed; otherwise another
  Python worker has written the slot since (its ``init_transactions`` fenced
  this producer), so fence again *before* writing instead of failing in the
  middle of the transaction. (The real change would reuse the ledger read that
  ``write_slot`` already does; this patch does an extra read.)
* ``refence-each-batch``: a new producer and ``init_transactions`` for every
  slot and batch (no producer reuse).
* ``fast-read``: ``ledger._scan`` with ``consumer.poll`` instead of
  ``consumer.consume(num_messages=500, timeout=1.0)``. ``consume`` returns only
  when 500 messages are there or the timeout expired, and the last offset of a
  transactional partition is a commit marker that is never delivered, so the
  loop always ends on the end-of-partition event after the full second: every
  ledger read takes at least one second per window, while ``poll`` returns as
  soon as a message or the end-of-partition event is there.
* ``timing``: no change in behaviour; times the steps of each slot task (fence,
  ledger read, digest, produce loop, the rest of the transaction = begin +
  ledger record + commit) and prints one ``EOS-BENCH-TIMING {json}`` line per
  task to stderr, which the benchmark collects.
* ``none``: the unmodified sink through the same wrapper.

Names combine with ``+``: ``ledger-check+timing``.
"""
from __future__ import annotations

import json
import sys
import time

PATCHES = ("none", "ledger-check", "refence-each-batch", "fast-read", "timing")
TIMING_TAG = "EOS-BENCH-TIMING "


def patched_slot_task(names: str):
    """A replacement for ``eos_job.sink.slot_task`` (driver side) applying patches ``a+b`` in each task."""
    parts = names.split("+")
    for name in parts:
        if name not in PATCHES:
            raise ValueError(f"unknown patch {name!r}; one of {PATCHES}")

    def factory(cfg):
        from eos_job import sink
        inner = sink.slot_task(cfg)

        def run(iterator):
            undos = [_apply(name) for name in parts]
            timing = _Timing(cfg) if "timing" in parts else None
            try:
                if timing is None:
                    yield from inner(iterator)
                else:
                    with timing:
                        yield from inner(_timed_iter(iterator, timing))
            finally:
                for undo in reversed(undos):
                    undo()

        return run

    return factory


class _Timing:
    """Wraps the sink's steps for one task; prints the seconds of each."""
    active = None

    def __init__(self, cfg):
        self.cfg = cfg
        self.t = {"recv": 0.0, "fence": 0.0, "read_latest": 0.0, "digest": 0.0, "produce_loop": 0.0,
                  "transaction": 0.0, "rows": 0}
        self.saved = {}

    def __enter__(self):
        from eos_job import sink
        self.start = time.perf_counter()
        t = self.t

        def timed(name, fn):
            def wrapper(*a, **kw):
                t0 = time.perf_counter()
                try:
                    return fn(*a, **kw)
                finally:
                    t[name] += time.perf_counter() - t0
            return wrapper

        self.saved = {k: getattr(sink, k) for k in ("read_latest", "_count_and_digest", "_produce_batch",
                                                     "_transaction", "_SlotClients")}
        sink.read_latest = timed("read_latest", self.saved["read_latest"])
        sink._count_and_digest = timed("digest", self.saved["_count_and_digest"])
        sink._produce_batch = timed("produce_loop", self.saved["_produce_batch"])
        sink._transaction = timed("transaction", self.saved["_transaction"])
        base = self.saved["_SlotClients"]

        class TimedClients(base):
            def __init__(self, *a, **kw):
                t0 = time.perf_counter()
                try:
                    super().__init__(*a, **kw)
                finally:
                    t["fence"] += time.perf_counter() - t0

        sink._SlotClients = TimedClients
        return self

    def __exit__(self, *exc):
        from eos_job import sink
        from pyspark import TaskContext
        for k, v in self.saved.items():
            setattr(sink, k, v)
        t = dict(self.t)
        t["task"] = time.perf_counter() - self.start
        t["tx_rest"] = t["transaction"] - t["produce_loop"]  # begin + ledger record + commit (+ retries)
        ctx = TaskContext.get()
        t.update(slot=ctx.partitionId() if ctx else -1, batch=self.cfg.batch, ok=exc[0] is None)
        sys.stderr.write(TIMING_TAG + json.dumps(t) + "\n")
        sys.stderr.flush()
        return False


def _timed_iter(iterator, timing: _Timing):
    t = timing.t
    while True:
        t0 = time.perf_counter()
        try:
            b = next(iterator)
        except StopIteration:
            t["recv"] += time.perf_counter() - t0
            return
        t["recv"] += time.perf_counter() - t0
        t["rows"] += b.num_rows
        yield b


def _apply(name: str):
    from eos_job import protocol, sink

    orig_clients, orig_tx = sink._slot_clients, sink._transaction

    def undo():
        sink._slot_clients, sink._transaction = orig_clients, orig_tx

    if name == "fast-read":
        from eos_job import ledger
        orig_scan = ledger._scan
        ledger._scan = _scan_poll

        def undo_scan():
            ledger._scan = orig_scan
        return undo_scan
    if name == "refence-each-batch":
        sink._slot_clients = lambda cfg, slot, fresh: orig_clients(cfg, slot, True)
    elif name == "ledger-check":
        def slot_clients(cfg, slot, fresh):
            txid = protocol.transactional_id(cfg.tx_prefix, cfg.generation, slot)
            cached = sink._clients.get(txid)
            held = orig_clients(cfg, slot, fresh)
            if fresh or held is not cached:
                return held  # created (fenced) just now by this worker: valid
            # A reused producer is valid only if the slot's latest ledger record is the one it committed.
            mine = getattr(held, "bench_last_written", None)
            if mine is None:
                return orig_clients(cfg, slot, True)
            key = protocol.slot_key(cfg.stream_uid, cfg.checkpoint_id, cfg.generation, slot)
            raw = sink.read_latest(held.consumer, cfg.ledger_topic, protocol.ledger_partition(slot), key)
            latest = protocol.SlotLedgerRecord.decode(raw).batch if raw is not None else None
            if mine != (cfg.ledger_topic, key, latest):
                return orig_clients(cfg, slot, True)  # someone else wrote the slot since: we are fenced
            return held

        def transaction(cfg, clients, slot, key, batches, count, digest):
            dead = orig_tx(cfg, clients, slot, key, batches, count, digest)
            clients.bench_last_written = (cfg.ledger_topic, key, cfg.batch)
            return dead

        sink._slot_clients, sink._transaction = slot_clients, transaction
    return undo


def _scan_poll(consumer, topic: str, partition: int, start: int, end: int, want: bytes, deadline: float):
    """``eos_job.ledger._scan`` with ``poll``: returns at the end-of-partition event, not after a 1 s timeout."""
    from confluent_kafka import KafkaError, TopicPartition

    from eos_job.ledger import SinkUnavailable
    consumer.assign([TopicPartition(topic, partition, start)])
    found = None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise SinkUnavailable(f"timed out reading ledger {topic}[{partition}] from offset {start}")
        msg = consumer.poll(min(remaining, 1.0))
        if msg is None:
            continue
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                return found
            raise SinkUnavailable(f"reading ledger {topic}[{partition}]: {err}")
        if msg.offset() >= end:
            return found
        if msg.key() == want:
            found = msg.value()
