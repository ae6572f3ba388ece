"""Where the stack's Kafka broker lives and listens: its state folder and its five loopback ports.

Apart from :mod:`eos_stack.kafka` (the broker) so that :mod:`eos_stack.kafka_security` (its SASL_SSL part, which
the broker's configuration includes) can find the broker without importing it: no import circle.
"""
from __future__ import annotations

import json
from pathlib import Path

from .common import Stack, free_port

PORT_NAMES = ("client", "controller", "sasl_ssl", "pods", "pods_sasl_ssl")


def home(st: Stack) -> Path:
    return st.dir("kafka")


def ports(st: Stack) -> dict[str, int]:
    """The broker's client, controller, SASL_SSL and Pods' two (PLAINTEXT and SASL_SSL) ports: chosen once, then
    persisted. A ports.json of an older stack (without some of them) keeps its ports and gains the missing ones."""
    pf = home(st) / "ports.json"
    chosen = {k: int(v) for k, v in json.loads(pf.read_text()).items()} if pf.exists() else {}
    missing = [k for k in PORT_NAMES if k not in chosen]
    for name in missing:
        port = free_port()
        while port in chosen.values():
            port = free_port()
        chosen[name] = port
    if missing:
        tmp = pf.with_suffix(".tmp")
        tmp.write_text(json.dumps(chosen))
        tmp.replace(pf)
    return chosen


def bootstrap(st: Stack) -> str:
    return f"127.0.0.1:{ports(st)['client']}"
