"""Writes N color events with a known distribution; returns the expected counts."""
from __future__ import annotations

import argparse
import json
import random
from collections import Counter

from confluent_kafka import Producer

COLORS = {"red": 5, "green": 4, "blue": 3, "orange": 2, "yellow": 1}
DROPPED = ("orange",)   # what the colors job drops by default (its "drop" argument)


def event_value(i: int, color: str) -> bytes:
    """An event as the colors job reads it: a unique id and a color."""
    return json.dumps({"id": i, "color": color}).encode()


def counted(color: str, drop: tuple[str, ...] = DROPPED) -> bool:
    """Whether the job counts an event of this color."""
    return color not in drop


def events(n: int, seed: int = 7, start_id: int = 0):
    rng = random.Random(seed)
    names, weights = list(COLORS), list(COLORS.values())
    for i in range(start_id, start_id + n):
        yield i, rng.choices(names, weights)[0]


def expected_counts(n: int, seed: int = 7, drop: tuple[str, ...] = DROPPED, start_id: int = 0) -> dict[str, int]:
    c = Counter(color for _, color in events(n, seed, start_id))
    return {k: v for k, v in sorted(c.items()) if counted(k, drop)}


def expected_ids(n: int, seed: int = 7, start_id: int = 0, drop: tuple[str, ...] = DROPPED) -> set[int]:
    """The ids of the events ``produce`` writes that the job keeps (the unique-id stream's output)."""
    return {i for i, color in events(n, seed, start_id) if counted(color, drop)}


def produce(bootstrap: str, topic: str, n: int, seed: int = 7, start_id: int = 0) -> dict[str, int]:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 20})
    failures: list = []
    for i, color in events(n, seed, start_id):
        while True:
            try:
                p.produce(topic, key=str(i).encode(), value=event_value(i, color),
                          on_delivery=lambda err, _m: failures.append(err) if err else None)
                break
            except BufferError:
                p.poll(0.1)
    if p.flush(60) or failures:
        raise RuntimeError(f"could not produce all events: {failures[:3]}")
    return expected_counts(n, seed, start_id=start_id)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", default="colors-events")
    ap.add_argument("-n", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    print(json.dumps(produce(a.bootstrap, a.topic, a.n, a.seed)))
