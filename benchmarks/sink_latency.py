"""The sink benchmark's latency phase: produce to read_committed visibility, per shape, rate and sink.

For each shape and each rate of ``--rates``, each sink runs as a continuous query with the same
processingTime trigger (``--trigger-ms``) over a fresh input topic, fed by a paced producer thread at
the rate for ``--latency-warmup`` + ``--seconds`` (the warm-up's records are not counted); a
read_committed consumer thread reads the output as it is committed. A record's latency is from the
moment it was handed to the producer to the moment the output that includes it was read:

* map-only: the output record itself (its key is the input's);
* stateful: the first count update of its color that counts it. Records of a color are counted in the
  order they were produced (a batch takes every partition up to its end): the k-th produced record of a
  color is visible once an update of that color says k or more. Records in flight while a batch is
  planned can be taken slightly out of order, which moves a latency by at most that flight time.

p50/p99/max per sink, and whether p99 is within the trigger interval + 1 s (issue 15's target). Records
not visible 60 s after the last was produced count with the time waited: the figures are then lower
bounds (``lower_bound``), and the target is missed.
"""
from __future__ import annotations

import json
import os
import statistics
import threading
import time
import uuid

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from benchmarks.report import say
from benchmarks.sink_meters import CpuMeter, progress
from benchmarks.sink_shapes import INPUT_PARTITIONS

SINKS = ("builtin", "ours")


class LatencyProbe:
    """A paced producer and a read_committed consumer for one sink's run."""

    def __init__(self, bootstrap: str, shape, in_topic: str, out_topic: str, rate: int, seconds: float,
                 warmup: float):
        self.bootstrap, self.shape, self.in_topic, self.out_topic = bootstrap, shape, in_topic, out_topic
        self.rate, self.total = rate, int(rate * (seconds + warmup))
        self.first_counted = int(rate * warmup)
        self.sent_ns = np.zeros(self.total, dtype=np.int64)      # when record seq was handed to the producer
        self.recv_ns = np.full(self.total, -1, dtype=np.int64)   # map-only: when it was read
        self.updates: list[tuple[str, int, int]] = []            # stateful: (color, count, read at)
        self.top: dict[str, int] = {}                            # stateful: highest count read per color
        if shape.name == "map":
            self.kept = shape.kept(self.total)
        else:
            colors = np.array([shape.color(i) for i in range(len(shape.PATTERN))])
            self.color_of = colors[np.arange(self.total) % len(colors)]
            self.kept = np.isin(self.color_of, list(shape.expected(len(colors))))
        self.dupes = 0
        self.produced = 0
        self.received = 0
        self.produce_lag_max = 0.0
        self.stop = threading.Event()
        self.stopped_ns = 0
        self.consumer_thread = threading.Thread(target=self._consume, daemon=True, name="lat-consumer")
        self.producer_thread = threading.Thread(target=self._produce, daemon=True, name="lat-producer")

    def _produce(self) -> None:
        p = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 1, "acks": "all",
                      "enable.idempotence": True})
        value, sent_ns = self.shape.latency_value, self.sent_ns
        start = time.perf_counter()
        sent = 0
        while sent < self.total and not self.stop.is_set():
            due = min(self.total, int((time.perf_counter() - start) * self.rate))
            self.produce_lag_max = max(self.produce_lag_max, (due - sent) / self.rate)
            while sent < due:
                k = b"%010d" % sent
                now = time.time_ns()
                try:
                    p.produce(self.in_topic, key=k, value=value(sent, k, now))
                except BufferError:
                    p.poll(0.05)
                    continue
                sent_ns[sent] = now
                sent += 1
            self.produced = sent
            p.poll(0)
            time.sleep(0.002)
        p.flush(60)
        self.produced = sent

    def _consume(self) -> None:
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"bench-lat-{uuid.uuid4().hex[:8]}",
                      "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                      "enable.auto.commit": False, "fetch.wait.max.ms": 10, "fetch.min.bytes": 1})
        parts = list(c.list_topics(self.out_topic, timeout=15).topics[self.out_topic].partitions)
        c.assign([TopicPartition(self.out_topic, p, OFFSET_BEGINNING) for p in parts])
        stateful = self.shape.name != "map"
        recv = self.recv_ns
        try:
            while not self.stop.is_set():
                msgs = c.consume(2000, 0.05)
                now = time.time_ns()
                for m in msgs:
                    if m.error() is not None:
                        continue
                    if stateful:
                        color, count = m.key().decode(), int(json.loads(m.value())["count"])
                        self.updates.append((color, count, now))
                        if count <= self.top.get(color, 0):
                            self.dupes += 1
                        else:
                            self.received += count - self.top.get(color, 0)
                            self.top[color] = count
                        continue
                    seq = int(m.key())
                    if 0 <= seq < self.total:
                        if recv[seq] >= 0:
                            self.dupes += 1
                        else:
                            recv[seq] = now
                            self.received += 1
        finally:
            c.close()

    def expected(self) -> int:
        """Records produced so far that the job keeps (outputs, or counts)."""
        return int(self.kept[:self.produced].sum())

    def wait_done(self, timeout: float) -> bool:
        self.producer_thread.join()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.received < self.expected():
            time.sleep(0.1)
        self.stop.set()
        self.stopped_ns = time.time_ns()
        self.consumer_thread.join(10)
        return self.received >= self.expected()

    def visible_ns(self) -> np.ndarray:
        """When each record became visible (-1: never), by sequence number."""
        if self.shape.name == "map":
            return self.recv_ns
        vis = np.full(self.total, -1, dtype=np.int64)
        for color in self.top:
            seqs = np.nonzero(self.color_of == color)[0]   # in produce order
            top = 0
            for c, count, at in self.updates:
                if c == color and count > top:
                    vis[seqs[top:min(count, seqs.size)]] = at
                    top = count
        return vis

    def stats(self) -> dict:
        vis = self.visible_ns()
        idx = np.arange(self.total)
        counted = self.kept & (idx >= self.first_counted) & (idx < self.produced)
        got = counted & (vis >= 0)
        lat = (vis[got] - self.sent_ns[got]) / 1e6
        lost = counted & ~got
        if lost.any():   # not visible when the wait ended: at least that long, so the percentiles are lower bounds
            lat = np.concatenate([lat, (self.stopped_ns - self.sent_ns[lost]) / 1e6])
        out = {"produced": self.produced, "expected": self.expected(), "received": self.received,
               "duplicates": self.dupes, "counted": int(got.sum()), "missing_counted": int(lost.sum()),
               "lower_bound": bool(lost.any()), "producer_max_lag_s": round(self.produce_lag_max, 3)}
        if self.shape.name != "map":
            out["updates"] = len(self.updates)
        if lat.size:
            out.update({"p50_ms": round(float(np.percentile(lat, 50)), 1),
                        "p90_ms": round(float(np.percentile(lat, 90)), 1),
                        "p99_ms": round(float(np.percentile(lat, 99)), 1),
                        "max_ms": round(float(lat.max()), 1), "mean_ms": round(float(lat.mean()), 1)})
        return out


def latency_run(bench, shape, producer: str, sink: str, rate: int) -> dict:
    a = bench.args
    tag = f"{shape.name}-{rate}-{sink}-{bench.run_id}"
    in_topic, out_topic = f"bench-lat-in-{tag}", f"bench-lat-out-{tag}"
    bench.topics.create({in_topic: INPUT_PARTITIONS, out_topic: a.parallelism})
    config = bench.config(shape, producer, in_topic, out_topic)
    probe = LatencyProbe(bench.bootstrap, shape, in_topic, out_topic, rate, a.seconds, a.latency_warmup)
    probe.consumer_thread.start()
    writer = None
    if sink == "builtin":
        dsw = bench.builtin_writer(config, producer).trigger(processingTime=f"{a.trigger_ms} milliseconds")
    else:
        dsw, writer = bench.ours_writer(config)  # build_query as is: processingTime trigger of the spec
    from eos_job import runtime
    before = bench.tee.snapshot()
    c0 = bench.cpu.snapshot()
    e0 = time.time() * 1000
    q = dsw.start()
    probe.producer_thread.start()
    t0 = time.monotonic()
    while probe.producer_thread.is_alive():
        probe.producer_thread.join(10)
        if q.exception() is not None:
            probe.stop.set()
            raise RuntimeError(f"latency {shape.name} {sink}: the query failed: {q.exception()}")
        say(f"    latency {shape.name} {sink} at {rate:,}/s: {time.monotonic() - t0:4.0f}s, produced "
            f"{probe.produced:,}, visible {probe.received:,}")
    complete = probe.wait_done(60)
    cpu = CpuMeter.delta(c0, bench.cpu.snapshot())
    if writer is not None:
        runtime._stop_at_boundary(q, writer, config)
    else:
        q.stop()
    prog = [p for p in progress(q) if p["numInputRows"]]
    trig = sorted(p["durationMs"].get("triggerExecution", 0) for p in prog)
    res = probe.stats()
    time.sleep(0.2)
    after = bench.tee.snapshot()
    res.update({"stages": bench.events.profile(e0, time.time() * 1000), "complete": complete, "batches": len(trig),
                "cpu_s": cpu, "batch_ms_median": statistics.median(trig) if trig else None,
                "batch_ms_max": trig[-1] if trig else None,
                "rows_per_batch_median": statistics.median(p["numInputRows"] for p in prog) if prog else None,
                "refence_warnings": after["refence"] - before["refence"],
                "task_failures": after["lost_task"] - before["lost_task"]})
    if writer is not None:
        from benchmarks.sink_bench import slot_stats_of
        res["slot_stats"] = slot_stats_of(writer)
    res["p99_within_target"] = (res.get("p99_ms") is not None and not res["lower_bound"]
                                and res["p99_ms"] <= a.trigger_ms + 1000)
    if not a.keep_topics:
        bench.topics.delete([in_topic, out_topic, config.ledger_topic()])
    return res


def phase_latency(bench, shapes: list, producer: str) -> dict:
    """Per shape and rate, both sinks (alternating which goes first); the load average around each pair."""
    a = bench.args
    out: dict = {"producer": producer, "load_avg_before": list(os.getloadavg())}
    flip = 0
    for shape in shapes:
        out[shape.name] = {}
        for rate in a.rates:
            pair: dict = {"load_avg_before": list(os.getloadavg())}
            for sink in (SINKS if flip % 2 == 0 else SINKS[::-1]):
                say(f"latency: {shape.name}, {sink} sink, {rate:,} rec/s for {a.latency_warmup:.0f}s warm-up + "
                    f"{a.seconds:.0f}s, trigger {a.trigger_ms} ms")
                r = pair[sink] = latency_run(bench, shape, producer, sink, rate)
                say(f"  {sink}: p50 {r.get('p50_ms')} ms, p99 {r.get('p99_ms')} ms, max {r.get('max_ms')} ms, "
                    f"p99 within {a.trigger_ms} + 1000 ms: {r['p99_within_target']} ({r['counted']:,} records "
                    f"counted, {r['missing_counted']} missing, {r['duplicates']} duplicates, median batch "
                    f"{r['batch_ms_median']} ms, producer lag max {r['producer_max_lag_s']} s)")
            flip += 1
            pair["load_avg_after"] = list(os.getloadavg())
            out[shape.name][str(rate)] = pair
    out["load_avg_after"] = list(os.getloadavg())
    return out
