"""Narrow interfaces to the outside world, and their real implementations.

The reconciler sees Kubernetes, resolution (which talks to Kafka) and the clock
only through these protocols, so unit tests drive it with in-memory fakes that
can inject faults (tests/operator/fakes.py).

The Kubernetes implementation is kube_api.KubernetesApi; here are the protocols
and the implementations that read Kafka (resolution, progress, the replay horizon)
and the checkpoint store.
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Protocol

from eos_job import checkpoint
from eos_job.clients import SharedClients
from eos_job.kafka_security import KafkaSecretMissing, KafkaSecrets, secret_refs
from eos_job.spec import ExactlyOnceStreamSpec, RunConfig
from eos_job.status import CheckpointFacts, ReplayHorizon, ResolutionReport
from eos_job.storage import Loc, S3Options

# One import for all adapters (F401: re-exported).
from .kube_api import Conflict, KubeError, KubernetesApi, NameTaken, ObjectRef, event_kind  # noqa: F401
from .observed import CheckpointState, SnapshotView
from .op_metrics import OperatorMetrics
from .pools import Pools, cluster_of

log = logging.getLogger(__name__)


class Kube(Protocol):
    async def get_stream(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    async def list_streams(self, namespace: str) -> list[dict[str, Any]]: ...
    async def patch_stream_status(self, namespace: str, name: str, status: dict[str, Any],
                                  resource_version: str | None) -> dict[str, Any]: ...
    async def list_driver_pods(self, namespace: str, stream: str) -> list[dict[str, Any]]: ...
    async def create_pod(self, namespace: str, body: dict[str, Any]) -> None: ...
    async def delete_pod(self, namespace: str, name: str, grace_seconds: int,
                         owner_uid: str | None = None) -> None: ...
    # Never replace or delete an object the stream does not own: a 409 create/apply over someone else's
    # object raises NameTaken; a delete of one that owner_uid does not own leaves it.
    async def apply_config_map(self, namespace: str, body: dict[str, Any]) -> None: ...
    async def apply_service(self, namespace: str, body: dict[str, Any]) -> None: ...
    async def delete_config_map(self, namespace: str, name: str, owner_uid: str) -> None: ...
    async def delete_service(self, namespace: str, name: str, owner_uid: str) -> None: ...
    async def post_event(self, ref: ObjectRef, type_: str, reason: str, message: str, *,
                         kind: str | None = None) -> None: ...
    # -- ExactlyOnceSnapshot resources and their Pods ---------------------------
    async def list_snapshots(self, namespace: str, stream: str) -> list[dict[str, Any]]: ...
    async def get_snapshot(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    async def create_snapshot(self, namespace: str, body: dict[str, Any]) -> None: ...
    async def delete_snapshot(self, namespace: str, name: str) -> None: ...
    async def patch_snapshot_status(self, namespace: str, name: str, status: dict[str, Any],
                                    resource_version: str | None) -> dict[str, Any]: ...
    async def list_pods(self, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]: ...
    # -- the Secrets a stream references (checkpoint.s3 keys), by name in its namespace ----------
    async def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None: ...


class Resolver(Protocol):
    async def resolve(self, config: RunConfig, s3: S3Options | None = None,
                      kafka: dict[str, KafkaSecrets] | None = None,
                      facts: CheckpointFacts | None = None) -> ResolutionReport: ...


class Clock(Protocol):
    def now(self) -> datetime: ...


@dataclass(frozen=True)
class LedgerTip:
    """The stream's last batch-complete ledger record, as far as progress goes."""
    batch: int
    nondeterministic_slots_total: int = 0


class Progress(Protocol):
    async def ledger_tip(self, config: RunConfig, kafka: dict[str, KafkaSecrets] | None = None) -> LedgerTip | None: ...
    async def replay_horizon(self, config: RunConfig,
                             kafka: dict[str, KafkaSecrets] | None = None) -> ReplayHorizon | None: ...

    def forget(self, namespace: str, name: str) -> None: ...


class StoreUnreadable(Exception):
    """The operator cannot read this checkpoint store (e.g. a PVC it does not mount)."""


class CheckpointStore(Protocol):
    async def read_snapshot(self, spec: ExactlyOnceStreamSpec, path: str,
                            s3: S3Options | None = None) -> SnapshotView | None: ...
    async def checkpoint_state(self, spec: ExactlyOnceStreamSpec, path: str,
                               s3: S3Options | None = None) -> CheckpointState: ...


async def secret_value(kube: Kube, namespace: str, ref, field: str) -> str:
    """The value of one Secret key a stream references, read by name in its own namespace and kept in
    memory only. Raises LookupError naming the field, the Secret and the key (never a value)."""
    return key_value(await kube.read_secret(namespace, ref.name), namespace, ref, field)


def key_value(secret: dict | None, namespace: str, ref, field: str) -> str:
    """The decoded value of ``ref``'s key in ``secret`` (as read, None if there is none); LookupError
    naming the field, the Secret and the key (never a value) when it is not there."""
    data = (secret or {}).get("data") or {}
    if ref.key not in data:
        raise LookupError(f"{field}: Secret {namespace}/{ref.name} "
                          + ("does not exist" if secret is None else f"has no key {ref.key!r}")
                          + "; create it (the stream's Pods read the same key)")
    return base64.b64decode(data[ref.key]).decode()


async def s3_options(kube: Kube, namespace: str, spec: ExactlyOnceStreamSpec) -> S3Options | None:
    """How the operator reaches a stream's checkpoint bucket (``store: s3``): the endpoint settings of its
    spec and the keys of the Secrets it names. None for other stores. Raises StoreUnreadable."""
    ck = spec.checkpoint
    if ck.store != "s3" or ck.s3 is None:
        return None
    keys: dict[str, str] = {}
    for field_name, ref in (("access_key", ck.s3.access_key_id), ("secret_key", ck.s3.secret_access_key)):
        if ref is not None:
            try:
                keys[field_name] = await secret_value(kube, namespace, ref, "checkpoint.s3")
            except LookupError as exc:
                raise StoreUnreadable(str(exc)) from None
    return S3Options(endpoint=ck.s3.endpoint, region=ck.s3.region, path_style=ck.s3.path_style_access, **keys)


async def kafka_secrets(kube: Kube, namespace: str, spec: ExactlyOnceStreamSpec) -> dict[str, KafkaSecrets]:
    """The Secret values of both Kafka ends' credentials and TLS (what the stream's Pods get as
    environment), for the operator's own Kafka clients. Raises KafkaSecretMissing naming the Secret."""
    out: dict[str, KafkaSecrets] = {}
    for end, side in (("source", spec.source), ("sink", spec.sink)):
        values = {}
        for value, ref in secret_refs(side.credentials, side.tls).items():
            try:
                values[value] = await secret_value(kube, namespace, ref, f"{end} ({value})")
            except LookupError as exc:
                raise KafkaSecretMissing(str(exc)) from None
        out[end] = KafkaSecrets(values)
    return out


# ---------------------------------------------------------------------- clock
class SystemClock:
    def now(self) -> datetime:
        return datetime.now(timezone.utc)


# ---------------------------------------------------------------------- Kafka
def kafka_failure(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is Kafka failing: a client error, a sink the job runtime calls
    unavailable, or a read that timed out. A missing Secret or an unreadable checkpoint is not."""
    from confluent_kafka import KafkaException  # imported late, as the Kafka calls themselves
    from eos_job.ledger import SinkUnavailable

    chain: list[BaseException] = []
    while exc is not None and exc not in chain and len(chain) < 8:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return (not any(isinstance(e, (KafkaSecretMissing, StoreUnreadable)) for e in chain)
            and any(isinstance(e, (KafkaException, SinkUnavailable, TimeoutError)) for e in chain))


class _KafkaErrors:
    """Counts the operator's failed Kafka calls of one operation (op_metrics); nothing without metrics."""

    def __init__(self, metrics: OperatorMetrics | None, operation: str):
        self.metrics, self.operation = metrics, operation

    def __call__(self, exc: BaseException) -> None:
        if self.metrics is not None and kafka_failure(exc):
            self.metrics.kafka_error(self.operation)


# ----------------------------------------------------------------- resolution
class JobResolver:
    """Runs ``eos_job.resolution.resolve`` (blocking, talks to Kafka) in a worker thread of the stream's
    clusters' own pool (pools.py): an unreachable cluster delays only its own streams' resolutions."""

    def __init__(self, timeout_s: float = 60.0, metrics: OperatorMetrics | None = None,
                 pools: Pools | None = None):
        self.timeout_s = timeout_s
        self._failed = _KafkaErrors(metrics, "resolve")
        self.pools = pools or Pools()

    async def resolve(self, config: RunConfig, s3: S3Options | None = None,
                      kafka: dict[str, KafkaSecrets] | None = None,
                      facts: CheckpointFacts | None = None) -> ResolutionReport:
        from eos_job.resolution import resolve  # imported late: it pulls in the Kafka client

        # The thread cannot be cancelled; the outer wait_for bounds how long we wait for it.
        cluster = cluster_of(config.spec.sink.bootstrap_servers, config.spec.source.bootstrap_servers)
        try:
            return await self.pools.run("resolve", cluster, lambda: resolve(config, timeout_s=self.timeout_s, s3=s3,
                                                                            kafka=kafka, facts=facts),
                                        timeout=self.timeout_s + 15.0)
        except Exception as exc:
            self._failed(exc)
            raise


class _ThrottledRead:
    """A blocking Kafka read, run in a worker thread at most every ``interval`` seconds per stream, off the
    reconcile's path.

    The first read of a stream is awaited for at most ``first_wait`` seconds (after an operator start every
    stream's first read queues in the cluster's pool); after that a reconcile gets the last answer at once and,
    when it is due, starts the next read in the background, so a reconcile (and a spec change
    waiting for the stream's lock behind it) never waits on Kafka: answers are at most one read behind. When
    a read fails the last answer stands (None until there is one): the reads are informative, never an error of
    the reconcile. A failure is logged at WARNING the first time in a row, then at DEBUG, and counted by
    ``failed`` (if it is Kafka's). One read per stream at a time: none piles up behind a slow one.
    """

    def __init__(self, what: str, interval: float, timeout: float,
                 failed: Callable[[BaseException], None] | None = None, *, pools: Pools | None = None,
                 purpose: str = "progress", first_wait: float = 1.0):
        self.what, self.interval, self.timeout, self.first_wait = what, interval, timeout, first_wait
        self.failed = failed
        self.pools, self.purpose = pools or Pools(), purpose
        self._cache: dict[str, tuple[float, Any]] = {}
        self._failing: set[str] = set()
        self._reading: dict[str, asyncio.Future] = {}

    async def __call__(self, config: RunConfig, read: Callable[[], Any], cluster: str) -> Any:
        key = f"{config.stream.namespace}/{config.stream.name}/{config.stream.uid}"
        now = time.monotonic()
        cached = self._cache.get(key)
        if (cached is None or now - cached[0] >= self.interval) and key not in self._reading:
            task = asyncio.ensure_future(self._read(key, read, cluster, now))
            self._reading[key] = task
            if cached is None:   # the first answer, if it comes soon (an operator start reads every stream at once)
                await asyncio.wait({task}, timeout=self.first_wait)
        cached = self._cache.get(key)
        return cached[1] if cached is not None else None

    async def _read(self, key: str, read: Callable[[], Any], cluster: str, started: float) -> None:
        previous = self._cache.get(key)
        try:
            value = await self.pools.run(self.purpose, cluster, read, timeout=self.timeout)
        except asyncio.CancelledError:
            raise   # forgotten meanwhile: nothing to keep
        except Exception as exc:  # noqa: BLE001 - see the class docstring
            why = str(exc) or f"{type(exc).__name__} after {self.timeout:g} s (reads of its cluster queue in its pool)"
            log.log(logging.DEBUG if key in self._failing else logging.WARNING,
                    "cannot read the %s of %s (is Kafka reachable?): %s", self.what, key, why)
            if self.failed is not None:
                self.failed(exc)
            self._failing.add(key)
            value = previous[1] if previous is not None else None
        else:
            self._failing.discard(key)
        finally:
            self._reading.pop(key, None)
        self._cache[key] = (started, value)

    def forget(self, namespace: str, name: str) -> None:
        """A deleted stream's cached answers go (any incarnation), and a read still running is dropped."""
        prefix = f"{namespace}/{name}/"
        for key in [k for k in self._cache if k.startswith(prefix)]:
            del self._cache[key]
        for key in [k for k in self._reading if k.startswith(prefix)]:
            self._reading.pop(key).cancel()
        self._failing = {k for k in self._failing if not k.startswith(prefix)}


class LedgerProgress:
    """What the stream's ledger and source say about its progress, read from Kafka, throttled per stream.

    * ``ledger_tip``: the last batch-complete record (one record at the end of one partition),
      at most every ``min_interval`` seconds;
    * ``replay_horizon``: ``eos_job.horizon.observe`` (a few round trips on both clusters), at
      most every ``horizon_interval`` seconds.

    Failed reads are counted (op_metrics: ``ledger-read``, ``replay-horizon``), also those the ledger
    read answers with None (``on_error``).
    """

    def __init__(self, min_interval: float = 10.0, timeout_s: float = 5.0, horizon_interval: float = 30.0,
                 metrics: OperatorMetrics | None = None, pools: Pools | None = None,
                 clients: SharedClients | None = None):
        self.timeout_s = timeout_s
        pools = pools or Pools()
        # Long-lived clients per cluster and credentials, not one per read (eos_job.clients).
        self.clients = clients or SharedClients()
        self._tip_failed = _KafkaErrors(metrics, "ledger-read")
        self._horizon_failed = _KafkaErrors(metrics, "replay-horizon")
        self._tip = _ThrottledRead("last committed batch", min_interval, timeout_s + 5.0, self._tip_failed,
                                   pools=pools, purpose="progress")
        self._horizon = _ThrottledRead("replay horizon", horizon_interval, 4 * timeout_s + 5.0,
                                       self._horizon_failed, pools=pools, purpose="horizon")

    def forget(self, namespace: str, name: str) -> None:
        self._tip.forget(namespace, name)
        self._horizon.forget(namespace, name)

    async def ledger_tip(self, config: RunConfig, kafka: dict[str, KafkaSecrets] | None = None) -> LedgerTip | None:
        from eos_job.resolution import last_batch_record

        def read() -> LedgerTip | None:
            record = last_batch_record(config, timeout_s=self.timeout_s, kafka=kafka, on_error=self._tip_failed,
                                       clients=self.clients)
            return None if record is None else LedgerTip(record.batch, record.nondeterministic_slots_total)

        return await self._tip(config, read, cluster_of(config.spec.sink.bootstrap_servers))

    async def replay_horizon(self, config: RunConfig,
                             kafka: dict[str, KafkaSecrets] | None = None) -> ReplayHorizon | None:
        from eos_job.horizon import observe

        return await self._horizon(config, lambda: observe(config, timeout_s=self.timeout_s, kafka=kafka,
                                                           on_error=self._horizon_failed, clients=self.clients),
                                   cluster_of(config.spec.sink.bootstrap_servers, config.spec.source.bootstrap_servers))


# ------------------------------------------------------------ checkpoint store
class StoreReader:
    """Reads snapshot manifests and checkpoints through eos_job.storage: on the operator's own filesystem
    (``checkpoint.store: local``) or straight from the bucket (``s3``, with the keys ``s3_options`` read).

    A PVC is mounted by the driver, not by the operator, so for ``store: pvc`` it raises
    StoreUnreadable: the planner then says it cannot verify, instead of guessing. Reads run in a worker
    thread (S3 is network I/O) bounded by ``timeout_s``.
    """

    def __init__(self, timeout_s: float = 30.0, pools: Pools | None = None):
        self.timeout_s = timeout_s
        self.pools = pools or Pools()

    async def read_snapshot(self, spec: ExactlyOnceStreamSpec, path: str,
                            s3: S3Options | None = None) -> SnapshotView | None:
        manifest = self._loc(spec, path, s3) / "eos-snapshot.json"

        def read() -> dict | None:
            try:
                return json.loads(manifest.read_text())
            except FileNotFoundError:
                return None
            except (OSError, ValueError) as exc:
                raise StoreUnreadable(f"snapshot manifest {manifest}: {exc}") from exc

        doc = await self._run(spec, read)
        if doc is None:
            return None
        return SnapshotView(path=path, stream_uid=(doc.get("stream") or {}).get("uid"), batch=doc.get("lastBatch"),
                            time=doc.get("time"), checkpoint_id=doc.get("checkpointId"))

    async def checkpoint_state(self, spec: ExactlyOnceStreamSpec, path: str,
                               s3: S3Options | None = None) -> CheckpointState:
        ckpt = self._loc(spec, path, s3)
        return await self._run(spec, lambda: checkpoint.state(ckpt))

    async def _run(self, spec: ExactlyOnceStreamSpec, fn: Callable[[], Any]) -> Any:
        s3 = spec.checkpoint.s3 if spec.checkpoint.store == "s3" else None
        store = f"s3:{s3.endpoint or 'aws'}" if s3 is not None else spec.checkpoint.store
        try:
            return await self.pools.run("store", store, fn, timeout=self.timeout_s)
        except (OSError, asyncio.TimeoutError) as exc:
            raise StoreUnreadable(f"checkpoint store not readable: {exc or 'timed out'}") from exc

    @staticmethod
    def _loc(spec: ExactlyOnceStreamSpec, path: str, s3: S3Options | None) -> Loc:
        if spec.checkpoint.store == "pvc":
            raise StoreUnreadable("checkpoint.store is pvc: the operator does not mount it")
        return Loc.of(path, s3)
