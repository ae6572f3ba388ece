"""A test's own Kafka broker or S3 server, for tests that stop or kill the one they use.

The stack's broker and MinIO server are shared by every test of a run, two at a time (pytest-xdist). A test
that SIGKILLs, stops or restarts one of them gets its own instead: the same code and cached jars/binary
(``eos_stack.kafka.up`` / ``eos_stack.s3.up`` on a ``Stack`` whose state folder is the test's own), so it comes
up the same way the stack's does, with its own data folder, its own persisted ports (picked free) and, for the
broker, its own SASL_SSL PKI and admin user. The state lives under the stack's state folder
(``<state>/private/<test>-<id>``): the containers mode bind-mounts nothing from /tmp. Whatever the test did,
leaving the ``with`` block SIGKILLs the server (its data goes anyway) and removes the folder.
"""
from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from typing import Iterator

from eos_stack import kafka, s3
from eos_stack.cluster import wait_until
from eos_stack.common import Stack, free_port, port_open, stop_process

KAFKA_HEAP = "384m"   # the stack's broker has 512m; a private one carries one test's topics


def private_state(name: str) -> Stack:
    """A fresh ``Stack`` under ``<state>/private/``, named after ``name`` (a test's node name)."""
    main = Stack()
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", name)[:60].strip("-")
    return Stack(cache=main.cache, state=main.state / "private" / f"{slug}-{uuid.uuid4().hex[:6]}")


@dataclass
class PrivateKafka:
    stack: Stack                          # kafka.hard_kill(stack), kafka.down(stack), kafka.up(stack)
    env: dict[str, str] = field(default_factory=dict)   # KAFKA_BOOTSTRAP (PLAINTEXT), KAFKA_SECURE_BOOTSTRAP, ...

    @property
    def bootstrap(self) -> str:
        return self.env["KAFKA_BOOTSTRAP"]

    @property
    def pods_port(self) -> int:
        """Its PLAINTEXT listener for Pods: bound on loopback, advertised at the stack's services address at this
        port (``node_config.services_ip``), which a ``Forwarder(services_ip, f"127.0.0.1:{port}", port=port)``
        makes reachable."""
        return kafka.ports(self.stack)["pods"]


@dataclass
class PrivateS3:
    stack: Stack                          # s3.stop_server(stack), s3.start_server(stack)
    env: dict[str, str] = field(default_factory=dict)   # S3_ENDPOINT, S3_ACCESS_KEY, S3_SECRET_KEY, S3_BUCKET, S3_REGION


@contextlib.contextmanager
def private_kafka(name: str) -> Iterator[PrivateKafka]:
    st = private_state(f"kafka-{name}")
    try:
        yield PrivateKafka(st, kafka.up(st, heap=KAFKA_HEAP))
    finally:
        kafka.hard_kill(st, start=False)   # its data is removed next: no controlled shutdown to wait for
        shutil.rmtree(st.state, ignore_errors=True)


@contextlib.contextmanager
def private_s3(name: str) -> Iterator[PrivateS3]:
    st = private_state(f"s3-{name}")
    try:
        yield PrivateS3(st, s3.up(st))
    finally:
        s3.stop_server(st, kill=True)
        shutil.rmtree(st.state, ignore_errors=True)


class Forwarder:
    """``eos_stack.forward`` from the services address (``port``, or a free one) to a server of this test on
    loopback (a private S3 or broker), so Pods on the real nodes reach it; ``stop()`` with the test."""

    def __init__(self, services_ip: str, target: str, log, port: int | None = None):
        self.listen = f"{services_ip}:{port or free_port()}"
        self.url = f"http://{self.listen}"
        self.proc = subprocess.Popen([sys.executable, "-m", "eos_stack.forward", f"{self.listen}={target}"],
                                     stdout=log, stderr=subprocess.STDOUT)
        host, p = self.listen.rsplit(":", 1)
        wait_until(lambda: port_open(int(p), host), f"the forwarder on {self.listen}", 30, lambda: "", 0.2)

    def stop(self) -> None:
        stop_process(self.proc, grace=10)
