#!/usr/bin/env python3
"""A/B: ledger readers left assigned between reads (before issue 29) against unassigned after each read.

A slot task's ledger reader (``eos_job.ledger.ledger_consumer``: read_committed, ``fetch.wait.max.ms`` 10) is
kept in its Python worker across batches. While it stays assigned to the partition it read, librdkafka keeps
fetching it in the background, an empty fetch every ~10 ms, between batches too. This benchmark runs
``--consumers`` such readers on the stack's broker, each reading its partition's newest record with
``eos_job.ledger.read_latest`` every ``--gap-ms`` (a batch's cadence), for ``--seconds``, once with the readers
left assigned (``assigned``) and once unassigned after each read (``unassigned``, what ``eos_job.sink`` does
now), alternating over ``--repeats``. It counts the Fetch requests the clients sent (librdkafka statistics,
``stats_cb``: each broker's ``req.Fetch``; the broker's own request metrics are JMX, not exposed here) and
the CPU of this process (the readers' librdkafka threads) and of the broker (from /proc), per read.

Run: ``.venv/bin/python benchmarks/ledger_idle.py --out benchmarks/results/<date>-ledger-idle.md``.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import statistics
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for _p in (REPO / "stack", REPO / "jobs", REPO):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from benchmarks import procstat  # noqa: E402
from benchmarks.report import machine_info, say, write_results  # noqa: E402

VARIANTS = ("assigned", "unassigned")
# Between the two, the same window with no reader at all: the broker's CPU from everyone else's traffic.


class Reader:
    """One ledger reader with its newest librdkafka statistics."""

    def __init__(self, bootstrap: str):
        from eos_job.ledger import ledger_consumer
        self.stats: dict = {}
        self.consumer = ledger_consumer(bootstrap, {"statistics.interval.ms": 1000,
                                                    "stats_cb": lambda s: self.stats.update(json.loads(s))})

    def fetches(self) -> tuple[int, float]:
        """(Fetch requests sent so far, the statistics' time in s)."""
        brokers = self.stats.get("brokers", {})
        return sum((b.get("req") or {}).get("Fetch", 0) for b in brokers.values()), self.stats.get("ts", 0) / 1e6

    def fresh_stats(self) -> None:
        """Statistics newer than now (they are emitted once a second and delivered by poll)."""
        before = self.stats.get("ts")
        deadline = time.monotonic() + 5
        while self.stats.get("ts") == before and time.monotonic() < deadline:
            self.consumer.poll(0.1)


def broker_cpu() -> float:
    from eos_stack.common import Stack
    pid = Stack().running_pid("kafka")
    ps = procstat.procs()
    return sum(ps[p][2] for p in procstat.tree(procstat.children(ps), pid)) if pid in ps else float("nan")


def self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def setup_topic(bootstrap: str, partitions: int) -> str:
    """A ledger-like topic: a few transactional records per partition (commit markers included)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    topic = f"bench-ledger-idle-{uuid.uuid4().hex[:6]}"
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    time.sleep(1)   # leaders elected
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-w"})
    p.init_transactions(30)
    for n in range(3):
        p.begin_transaction()
        for part in range(partitions):
            p.produce(topic, value=b"batch %d" % n, key=b"slot-%d" % part, partition=part)
        p.commit_transaction(30)
    return topic


def baseline(a) -> dict:
    b0, t0 = broker_cpu(), time.monotonic()
    time.sleep(a.seconds)
    wall = time.monotonic() - t0
    return {"variant": "none", "wall_s": round(wall, 2), "broker_cpu_pct": round((broker_cpu() - b0) / wall * 100, 1)}


def run(bootstrap: str, topic: str, variant: str, a) -> dict:
    from eos_job.ledger import read_latest
    readers = [Reader(bootstrap) for _ in range(a.consumers)]
    try:
        for i, r in enumerate(readers):   # connected, metadata known, statistics flowing
            read_latest(r.consumer, topic, i, f"slot-{i}")
            r.consumer.unassign()
            r.fresh_stats()
        f0 = [r.fetches() for r in readers]
        c0, b0, t0 = self_cpu(), broker_cpu(), time.monotonic()
        reads, nxt = 0, t0
        while time.monotonic() - t0 < a.seconds:
            for i, r in enumerate(readers):
                assert read_latest(r.consumer, topic, i, f"slot-{i}") is not None
                if variant == "unassigned":
                    r.consumer.unassign()
                reads += 1
            nxt += a.gap_ms / 1000
            time.sleep(max(0.0, nxt - time.monotonic()))
        for r in readers:
            r.fresh_stats()
        c1, b1, wall = self_cpu(), broker_cpu(), time.monotonic() - t0
        f1 = [r.fetches() for r in readers]
    finally:
        for r in readers:
            r.consumer.close()
    fetches = sum(b[0] - x[0] for x, b in zip(f0, f1))
    span = statistics.mean(b[1] - x[1] for x, b in zip(f0, f1))
    return {"variant": variant, "reads": reads, "wall_s": round(wall, 2), "fetches": fetches,
            "fetches_per_s_per_reader": round(fetches / span / a.consumers, 1),
            "fetches_per_read": round(fetches / reads, 1),
            "client_cpu_ms_per_read": round((c1 - c0) / reads * 1000, 3),
            "broker_cpu_ms_per_read": round((b1 - b0) / reads * 1000, 3),
            "client_cpu_pct": round((c1 - c0) / wall * 100, 1), "broker_cpu_pct": round((b1 - b0) / wall * 100, 1)}


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):,.3g} ({min(xs):,.3g}–{max(xs):,.3g})"


def markdown(res: dict) -> str:
    a = res["settings"]
    rows = [("Fetch requests per second per reader", "fetches_per_s_per_reader"),
            ("Fetch requests per read", "fetches_per_read"),
            ("client CPU ms per read (this process: the readers' librdkafka threads and the reads)",
             "client_cpu_ms_per_read"),
            ("broker CPU ms per read", "broker_cpu_ms_per_read"),
            ("client CPU, % of one core", "client_cpu_pct"), ("broker CPU, % of one core", "broker_cpu_pct")]
    by = {v: [r for r in res["runs"] if r["variant"] == v] for v in VARIANTS}
    out = [f"# Ledger readers between reads: assigned against unassigned, {res['date']}", "",
           f"`benchmarks/ledger_idle.py`: {a['consumers']} ledger readers (`eos_job.ledger.ledger_consumer`, "
           f"read_committed, fetch.wait.max.ms 10), each reading its partition's newest record every "
           f"{a['gap_ms']} ms for {a['seconds']} s, left assigned between reads (before issue 29) or unassigned "
           f"after each read (now); {a['repeats']} alternating repeats each. Fetch requests from the clients' "
           "librdkafka statistics; CPU from /proc and getrusage. Machine: "
           f"{res['machine']['cores']} cores, shared with two other engineers' Spark runs and the same broker "
           f"(load average {res['load_start'][0]:.1f} at start, {res['load_end'][0]:.1f} at end): the broker CPU "
           "includes their traffic, the Fetch counts do not.", "",
           "| median (min–max) | assigned (before) | unassigned (now) | unassigned / assigned |",
           "| --- | ---: | ---: | ---: |"]
    for title, k in rows:
        x, y = [r[k] for r in by["assigned"]], [r[k] for r in by["unassigned"]]
        ratio = statistics.median(y) / statistics.median(x) if statistics.median(x) else float("nan")
        out.append(f"| {title} | {med(x)} | {med(y)} | {ratio:.2f} |")
    none = [r["broker_cpu_pct"] for r in res["runs"] if r["variant"] == "none"]
    out.append(f"| broker CPU with no reader (everyone else's traffic), % of one core | {med(none)} | | |")
    out += ["", "## Raw results", "", "```json", json.dumps(res, indent=1), "```", ""]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--consumers", type=int, default=8, help="ledger readers (slots held in Python workers)")
    ap.add_argument("--gap-ms", type=int, default=500, help="time from one read of a reader to its next")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", help="results file (default benchmarks/results/<date>-ledger-idle.md)")
    a = ap.parse_args(argv)
    from benchmarks.sink_bench import stack_env
    bootstrap, _ = stack_env()
    res = {"date": dt.date.today().isoformat(), "settings": vars(a), "machine": machine_info(),
           "load_start": list(os.getloadavg()), "runs": []}
    topic = setup_topic(bootstrap, a.consumers)
    try:
        for rep in range(a.repeats):
            first, second = VARIANTS if rep % 2 == 0 else VARIANTS[::-1]
            for variant in (first, "none", second):
                r = baseline(a) if variant == "none" else run(bootstrap, topic, variant, a)
                say(f"repeat {rep + 1} {variant}: {r}")
                res["runs"].append(r)
    finally:
        from confluent_kafka.admin import AdminClient
        with AdminClient({"bootstrap.servers": bootstrap}) as admin:
            admin.delete_topics([topic])[topic].result(30)
    res["load_end"] = list(os.getloadavg())
    write_results(res, "ledger-idle", markdown, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
