"""Leader election on a ``coordination.k8s.io/v1`` Lease: of several operator replicas, one acts.

The chart runs two replicas. Each starts here: the one that holds the Lease runs the operator (kopf),
renewing the Lease every ``retry`` seconds; the other waits, answering its liveness probe, and takes the
Lease over once nobody renewed it for ``duration`` seconds. As in client-go, expiry is judged by the
waiting replica's own clock (how long the record it observed stayed unchanged), never by comparing
clocks across machines; and a leader that cannot renew within ``renew_deadline`` (< ``duration``) stops
at once, before anyone else may take over. So at most one replica acts at any time, and the stream's
driver epochs and fencing still guard against a leader stalled past that (see the protocol).

A graceful stop releases the Lease, so a rolling update hands over in about a second. A Lease held under
this replica's identity by an earlier process (the container restarted by its kubelet: the same Pod name) is
not this process's: it waits like any standby, so the replica that stood by takes over (issue 28).
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

log = logging.getLogger(__name__)

LEASE_NAME = "spark-eos-operator"


@dataclass(frozen=True)
class LeaseSettings:
    namespace: str
    name: str = LEASE_NAME
    identity: str = ""
    duration: float = 10.0        # a Lease not renewed for this long may be taken over
    renew_deadline: float = 7.0   # a leader that could not renew for this long stops
    retry: float = 1.0            # seconds between renewals, and between a standby's attempts

    def __post_init__(self) -> None:
        if not 0 < self.retry < self.renew_deadline < self.duration:
            raise ValueError(f"leader election: need 0 < retry ({self.retry}) < renew deadline "
                             f"({self.renew_deadline}) < lease duration ({self.duration})")


def default_identity() -> str:
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def _micro_time(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """``api``: a ``kubernetes.client.CoordinationV1Api`` (or a fake with the same three calls)."""

    def __init__(self, api: Any, settings: LeaseSettings, *, monotonic: Callable[[], float] = time.monotonic,
                 wall: Callable[[], datetime] = lambda: datetime.now(timezone.utc)):
        self.api, self.s, self.monotonic, self.wall = api, settings, monotonic, wall
        self.observed: tuple | None = None    # (holder, renewTime, transitions) as last read
        self.observed_at = 0.0                # when that record was first seen, by our clock
        self.last_renewed = 0.0
        self.leading = False                  # this process acquired the Lease (an earlier one's is not ours)
        self._stop = threading.Event()

    # -------------------------------------------------------------- one round
    def try_acquire_or_renew(self) -> bool:
        """One attempt: True when this replica holds the Lease afterwards."""
        from kubernetes.client.rest import ApiException
        s, now = self.s, self.wall()
        try:
            lease = self.api.read_namespaced_lease(s.name, s.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            return self._create(now)
        spec = lease.spec
        record = (spec.holder_identity, str(spec.renew_time), spec.lease_transitions)
        if record != self.observed:
            self.observed, self.observed_at = record, self.monotonic()
        # Our identity but not our acquisition: a process before us in this Pod held it (killed, restarted by
        # the kubelet). What it was doing is unknown here, so the Lease is taken like anyone's, after it stood still.
        mine = spec.holder_identity == s.identity and self.leading
        duration = float(spec.lease_duration_seconds or s.duration)
        if spec.holder_identity and not mine and self.monotonic() - self.observed_at < duration:
            return False   # held, and renewed within its duration as far as we have watched it
        if not mine:
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
            spec.acquire_time = _micro_time(now)
            spec.holder_identity = s.identity
        spec.renew_time = _micro_time(now)
        spec.lease_duration_seconds = int(s.duration)
        try:
            self.api.replace_namespaced_lease(s.name, s.namespace, lease)   # resourceVersion: no lost race
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        if not mine:
            log.info("leader election: %s took Lease %s/%s over (transition %d)", s.identity, s.namespace, s.name,
                     spec.lease_transitions)
        self.last_renewed, self.leading = self.monotonic(), True
        return True

    def _create(self, now: datetime) -> bool:
        from kubernetes import client
        from kubernetes.client.rest import ApiException
        s = self.s
        body = client.V1Lease(metadata=client.V1ObjectMeta(name=s.name, namespace=s.namespace),
                              spec=client.V1LeaseSpec(holder_identity=s.identity, lease_duration_seconds=int(s.duration),
                                                      acquire_time=_micro_time(now), renew_time=_micro_time(now),
                                                      lease_transitions=0))
        try:
            self.api.create_namespaced_lease(s.namespace, body)
        except ApiException as exc:
            if exc.status == 409:
                return False   # another replica created it first
            raise
        log.info("leader election: %s created and holds Lease %s/%s", s.identity, s.namespace, s.name)
        self.last_renewed, self.leading = self.monotonic(), True
        return True

    # -------------------------------------------------------------- the loops
    def acquire(self) -> None:
        """Block until this replica leads, saying who leads meanwhile."""
        said = None
        while not self._stop.is_set():
            try:
                if self.try_acquire_or_renew():
                    return
            except Exception as exc:  # noqa: BLE001 - the API server may be away for a moment: try again
                log.warning("leader election: reading Lease %s/%s failed (%s); retrying", self.s.namespace,
                            self.s.name, exc)
            holder = self.observed[0] if self.observed else None
            if holder != said:
                log.info("leader election: standing by, Lease %s/%s is held by %s; taking over when it is not "
                         "renewed for %.0fs", self.s.namespace, self.s.name, holder, self.s.duration)
                said = holder
            self._stop.wait(self.s.retry)
        raise SystemExit(0)

    def hold(self, on_lost: Callable[[str], None]) -> threading.Thread:
        """Renew in the background; ``on_lost(reason)`` once the Lease cannot be kept (it should exit)."""
        def renew() -> None:
            while not self._stop.wait(self.s.retry):
                try:
                    if self.try_acquire_or_renew():
                        continue
                    why = f"Lease {self.s.namespace}/{self.s.name} is now held by {self.observed and self.observed[0]}"
                except Exception as exc:  # noqa: BLE001 - retried until the renew deadline
                    why = f"renewing Lease {self.s.namespace}/{self.s.name} failed: {exc}"
                    if self.monotonic() - self.last_renewed < self.s.renew_deadline:
                        log.warning("leader election: %s; retrying", why)
                        continue
                on_lost(why)
                return
        t = threading.Thread(target=renew, name="eos-lease", daemon=True)
        t.start()
        return t

    def release(self) -> None:
        """On a graceful stop: give the Lease up so a standby takes over at once."""
        self._stop.set()
        try:
            lease = self.api.read_namespaced_lease(self.s.name, self.s.namespace)
            if lease.spec.holder_identity != self.s.identity:
                return
            lease.spec.holder_identity = None
            lease.spec.lease_duration_seconds = 1
            self.api.replace_namespaced_lease(self.s.name, self.s.namespace, lease)
            log.info("leader election: released Lease %s/%s", self.s.namespace, self.s.name)
        except Exception as exc:  # noqa: BLE001 - it expires by itself then
            log.warning("leader election: could not release Lease %s/%s (%s); it expires in %.0fs",
                        self.s.namespace, self.s.name, exc, self.s.duration)


class _StandbyHealth:
    """While standing by, answer the liveness probe kopf answers once leading (same address and path)."""

    def __init__(self, url: str | None):
        self.server = None
        if not url:
            return
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.parse import urlsplit
        u = urlsplit(url)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                ok = self.path.split("?")[0] == (u.path or "/")
                self.send_response(200 if ok else 404)
                self.end_headers()
                self.wfile.write(b"standby\n" if ok else b"")

            def log_message(self, *args) -> None:
                pass
        self.server = ThreadingHTTPServer((u.hostname or "0.0.0.0", u.port or 80), Handler)
        threading.Thread(target=self.server.serve_forever, name="eos-standby-health", daemon=True).start()

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def lead(settings: LeaseSettings, kubeconfig: str | None, liveness: str | None) -> LeaderElector:
    """Wait until this replica holds the Lease, then keep renewing it; exit the process if it is lost."""
    from kubernetes import client, config
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config(config_file=kubeconfig)
    elector = LeaderElector(client.CoordinationV1Api(), settings)
    health = _StandbyHealth(liveness)
    try:
        elector.acquire()
    finally:
        health.close()

    def lost(why: str) -> None:
        log.error("leader election: leadership lost (%s); exiting now so that only one replica acts "
                  "(the Deployment restarts this one as a standby)", why)
        logging.shutdown()
        os._exit(1)
    elector.hold(lost)
    return elector
