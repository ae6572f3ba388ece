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
from eos_job.log_format import register_secret
from eos_job.spec import ExactlyOnceStreamSpec, RunConfig
from eos_job.spec_rules import AMBIENT_GATE
from eos_job.status import CheckpointFacts, ReplayHorizon, ResolutionReport
from eos_job.storage import Loc, S3Options

# One import for all adapters (F401: re-exported).
from .kube_api import Conflict, KubeError, KubernetesApi, NameTaken, ObjectRef, event_kind  # noqa: F401
from .observed import CheckpointState, SnapshotView
from .op_metrics import OperatorMetrics
from .pools import Pools, cluster_of
from .validation import ambient_s3_allowed

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
    async def get_service(self, namespace: str, name: str) -> dict[str, Any] | None: ...
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
    async def get_node(self, name: str) -> dict[str, Any] | None: ...
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
    runtime_version: str | None = None   # of the driver that wrote it (None: a runtime before amendment A3)


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
    memory only. Raises LookupError naming the field, the Secret and the key (never a value), and the grant
    to add when the operator may not read Secrets in that namespace."""
    try:
        secret = await kube.read_secret(namespace, ref.name)
    except KubeError as exc:
        if exc.status != 403:
            raise
        raise LookupError(
            f"{field}: the operator may not read Secret {namespace}/{ref.name} (403). A cluster-wide install "
            f"reads Secrets only where it is granted: add {namespace} to the chart's rbac.secretNamespaces (or "
            "install with watchNamespaces including it); rbac.secretsClusterWide: true grants every "
            "namespace") from None
    return key_value(secret, namespace, ref, field)


def key_value(secret: dict | None, namespace: str, ref, field: str) -> str:
    """The decoded value of ``ref``'s key in ``secret`` (as read, None if there is none); LookupError
    naming the field, the Secret and the key (never a value) when it is not there."""
    data = (secret or {}).get("data") or {}
    if ref.key not in data:
        raise LookupError(f"{field}: Secret {namespace}/{ref.name} "
                          + ("does not exist" if secret is None else f"has no key {ref.key!r}")
                          + "; create it (the stream's Pods read the same key)")
    value = base64.b64decode(data[ref.key]).decode()
    register_secret(value)   # never written to a log, whatever prints it (eos_job.log_format)
    return value


async def s3_options(kube: Kube, namespace: str, spec: ExactlyOnceStreamSpec) -> S3Options | None:
    """How the operator reaches a stream's checkpoint bucket (``store: s3``): the endpoint settings of its
    spec and the keys of the Secrets it names. None for other stores. Raises StoreUnreadable."""
    ck = spec.checkpoint
    if ck.store != "s3" or ck.s3 is None:
        return None
    if ck.s3.access_key_id is None or ck.s3.secret_access_key is None:
        # Never the operator's own identity by omission (validation refuses such a spec first).
        if ck.s3.credentials != "ambient" or not ambient_s3_allowed():
            raise StoreUnreadable("checkpoint.s3: no keys, and ambient credentials are not both chosen "
                                  "(checkpoint.s3.credentials: ambient) and allowed by the operator "
                                  f"({AMBIENT_GATE}): the operator does not read the bucket with its own identity")
        return S3Options(endpoint=ck.s3.endpoint, region=ck.s3.region, path_style=ck.s3.path_style_access)
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
