"""Planted violations for the sink audit's negative controls (``kubectl eos verify``): a record written again
with its audit headers (a duplicate) and the first records of a partition deleted (a loss), both on the real
sink, as a broken producer or a retention mistake would leave them."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from eos_job import audit
from eos_job.verify import read_committed


def kubectl_eos(kubectl, namespace: str):
    """``kubectl eos ...`` as users run it: kubectl finds the installed ``kubectl-eos`` on PATH."""
    bindir = Path(sys.executable).parent
    kubectl.env["PATH"] = f"{bindir}{os.pathsep}{kubectl.env.get('PATH', '')}"

    def eos(*args: str):
        return kubectl.run("eos", "-n", namespace, *args, check=False, timeout=300)
    return eos


def plant_duplicate(bootstrap: str, topic: str) -> audit.Group:
    """The topic's last labelled record written once more, headers and all; returns its (run, slot, batch)."""
    last = [m for m in read_committed(bootstrap, topic) if audit.group_of(m.headers())][-1]
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    p.produce(topic, last.value(), last.key(), partition=last.partition(), headers=last.headers())
    assert p.flush(30) == 0
    return audit.group_of(last.headers())


def plant_loss(bootstrap: str, topic: str) -> audit.Group:
    """The first labelled record of the topic's first partition deleted (with any before it); returns its group."""
    first = next(m for m in read_committed(bootstrap, topic) if audit.group_of(m.headers()))
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        for fut in admin.delete_records([TopicPartition(topic, first.partition(), first.offset() + 1)]).values():
            fut.result(30)
    return audit.group_of(first.headers())
