"""Kafka clients for short reads: fresh each time (a one-off command), or shared per cluster (the operator).

The operator reads every running stream's ledger tip every few seconds and its replay horizon every half
minute. A new client per read costs connections, threads and a metadata round trip each time: for 500
streams, thousands of short-lived connections a minute. ``SharedClients`` keeps long-lived clients per
cluster and configuration instead (the configuration carries the credentials, so streams with other
credentials never share a client): one admin client, and consumers handed out one reader at a time (a
consumer is not for concurrent use) and taken back unassigned. Clients unused for ``idle_seconds`` are
closed. The key is a digest of the configuration: credentials are never logged or kept in clear twice.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
import uuid
from typing import Iterator

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

LEDGER = {"isolation.level": "read_committed", "enable.partition.eof": True, "fetch.wait.max.ms": 10}
SOURCE = {"isolation.level": "read_uncommitted", "enable.partition.eof": False}


def consumer_conf(conf: dict[str, str], kind: dict) -> dict:
    # Never commits offsets: the group id only satisfies the client.
    return {**conf, **kind, "group.id": f"eos-reader-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
            "auto.offset.reset": "earliest"}


@contextlib.contextmanager
def closed_admin(conf: dict) -> Iterator[AdminClient]:
    """An AdminClient closed when the block ends. Never leave one to the garbage collector: an admin client
    resolves its futures on librdkafka's own background thread, the collector may run there, and a client
    destroyed from its own thread aborts the whole process (librdkafka: "rd_kafka_destroy() called from
    librdkafka owned thread is prohibited"). A client kept alive by a stored exception's traceback is
    collected exactly that way."""
    with AdminClient(conf) as admin:
        yield admin


class FreshClients:
    """A new client for every use, closed after it: for commands that read once."""

    @contextlib.contextmanager
    def consumer(self, conf: dict[str, str], kind: dict) -> Iterator[Consumer]:
        c = Consumer(consumer_conf(conf, kind))
        try:
            yield c
        finally:
            c.close()

    @contextlib.contextmanager
    def admin(self, conf: dict[str, str]) -> Iterator[AdminClient]:
        with closed_admin(conf) as admin:
            yield admin


def settings_key(conf: dict[str, str], kind: dict | None) -> str:
    return hashlib.sha256(json.dumps([sorted(conf.items()), sorted((kind or {}).items())]).encode()).hexdigest()


class SharedClients:
    def __init__(self, idle_seconds: float = 300.0, clock=time.monotonic):
        self.idle_seconds, self.clock = idle_seconds, clock
        self._lock = threading.Lock()
        self._idle: dict[str, list[tuple[Consumer, float]]] = {}
        self._admins: dict[str, tuple[AdminClient, float]] = {}
        self._admin_users: dict[int, int] = {}   # id(admin) -> readers using it now (closed only at 0)
        self._retired: list[AdminClient] = []    # dropped while in use: closed when their last reader ends
        self.created = 0            # consumers and admin clients made so far (the tests and the benchmark)

    @contextlib.contextmanager
    def consumer(self, conf: dict[str, str], kind: dict) -> Iterator[Consumer]:
        key = settings_key(conf, kind)
        with self._lock:
            idle = self._idle.get(key) or []
            c = idle.pop()[0] if idle else None
        if c is None:
            c = Consumer(consumer_conf(conf, kind))
            self.created += 1
        ok = False
        try:
            yield c
            ok = True
        finally:
            if ok:
                try:
                    # A borrower's pause() outlives unassign() in librdkafka: resume first, or the next reader
                    # of that partition waits out its whole timeout for records that never come.
                    assigned = c.assignment()
                    if assigned:
                        c.resume(assigned)
                    c.unassign()
                except Exception:  # noqa: BLE001 - a broken client is not given back
                    ok = False
            if ok:
                with self._lock:
                    self._idle.setdefault(key, []).append((c, self.clock()))
            else:
                _close(c)
            self.reap()

    @contextlib.contextmanager
    def admin(self, conf: dict[str, str]) -> Iterator[AdminClient]:
        key = settings_key(conf, None)
        with self._lock:
            held = self._admins.get(key)
            if held is None:
                held = (AdminClient(conf), 0.0)
                self.created += 1
            self._admins[key] = (held[0], self.clock())
            self._admin_users[id(held[0])] = self._admin_users.get(id(held[0]), 0) + 1
        try:
            yield held[0]
        finally:
            with self._lock:
                self._admin_users[id(held[0])] -= 1
            self.reap()

    def held(self) -> int:
        """Clients kept open now (each holds its connections to the cluster)."""
        with self._lock:
            return sum(len(v) for v in self._idle.values()) + len(self._admins) + len(self._retired)

    def reap(self) -> None:
        now = self.clock()
        closing: list = []
        with self._lock:
            for key, idle in list(self._idle.items()):
                keep = [(c, t) for c, t in idle if now - t <= self.idle_seconds]
                closing += [c for c, t in idle if now - t > self.idle_seconds]
                if keep:
                    self._idle[key] = keep
                else:
                    del self._idle[key]
            for key, (a, t) in list(self._admins.items()):
                if now - t > self.idle_seconds:
                    del self._admins[key]
                    self._retired.append(a)
            closing_admins = self._unused_retired()
        for c in closing:
            _close(c)
        for a in closing_admins:
            _close_admin(a)

    def _unused_retired(self) -> list[AdminClient]:
        """The dropped admin clients no reader uses any more (under the lock), taken off the books."""
        done = [a for a in self._retired if not self._admin_users.get(id(a))]
        self._retired = [a for a in self._retired if self._admin_users.get(id(a))]
        for a in done:
            self._admin_users.pop(id(a), None)
        return done

    def close(self) -> None:
        with self._lock:
            consumers = [c for idle in self._idle.values() for c, _ in idle]
            self._idle.clear()
            self._retired += [a for a, _ in self._admins.values()]
            self._admins.clear()
            admins = self._unused_retired()
        for c in consumers:
            _close(c)
        for a in admins:
            _close_admin(a)


def _close(c: Consumer) -> None:
    try:
        c.close()
    except Exception:  # noqa: BLE001 - closing what we give up on
        pass


FRESH = FreshClients()


def _close_admin(admin: AdminClient) -> None:
    # Closed here, on a thread of ours (``closed_admin`` says why it must not be left to the collector).
    try:
        admin.__exit__(None, None, None)
    except Exception:  # noqa: BLE001 - closing what we give up on
        pass
