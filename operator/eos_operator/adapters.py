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
import json
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Protocol

from eos_job.spec import ExactlyOnceStreamSpec, RunConfig
from eos_job.status import ReplayHorizon, ResolutionReport

from .kube_api import Conflict, KubeError, KubernetesApi, ObjectRef, event_kind  # noqa: F401 - one import for all adapters
from .observed import CheckpointState, SnapshotView

log = logging.getLogger(__name__)


class Kube(Protocol):
    async def get_stream(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    async def list_streams(self, namespace: str) -> list[dict[str, Any]]: ...
    async def patch_stream_status(self, namespace: str, name: str, status: dict[str, Any],
                                  resource_version: str | None) -> dict[str, Any]: ...
    async def list_driver_pods(self, namespace: str, stream: str) -> list[dict[str, Any]]: ...
    async def create_pod(self, namespace: str, body: dict[str, Any]) -> None: ...
    async def delete_pod(self, namespace: str, name: str, grace_seconds: int) -> None: ...
    async def apply_config_map(self, namespace: str, body: dict[str, Any]) -> None: ...
    async def apply_service(self, namespace: str, body: dict[str, Any]) -> None: ...
    async def delete_config_map(self, namespace: str, name: str) -> None: ...
    async def delete_service(self, namespace: str, name: str) -> None: ...
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


class Resolver(Protocol):
    async def resolve(self, config: RunConfig) -> ResolutionReport: ...


class Clock(Protocol):
    def now(self) -> datetime: ...


@dataclass(frozen=True)
class LedgerTip:
    """The stream's last batch-complete ledger record, as far as progress goes."""
    batch: int
    nondeterministic_slots_total: int = 0


class Progress(Protocol):
    async def ledger_tip(self, config: RunConfig) -> LedgerTip | None: ...
    async def replay_horizon(self, config: RunConfig) -> ReplayHorizon | None: ...


class StoreUnreadable(Exception):
    """The operator cannot read this checkpoint store (e.g. a PVC it does not mount)."""


class CheckpointStore(Protocol):
    async def read_snapshot(self, spec: ExactlyOnceStreamSpec, path: str) -> SnapshotView | None: ...
    async def checkpoint_state(self, spec: ExactlyOnceStreamSpec, path: str) -> CheckpointState: ...


# ---------------------------------------------------------------------- clock
class SystemClock:
    def now(self) -> datetime:
        return datetime.now(timezone.utc)


# ----------------------------------------------------------------- resolution
class JobResolver:
    """Runs ``eos_job.resolution.resolve`` (blocking, talks to Kafka) in a worker thread."""

    def __init__(self, timeout_s: float = 60.0):
        self.timeout_s = timeout_s

    async def resolve(self, config: RunConfig) -> ResolutionReport:
        from eos_job.resolution import resolve  # imported late: it pulls in the Kafka client

        # The thread cannot be cancelled; the outer wait_for bounds how long we wait for it.
        return await asyncio.wait_for(asyncio.to_thread(resolve, config, timeout_s=self.timeout_s),
                                      timeout=self.timeout_s + 15.0)


class _ThrottledRead:
    """A blocking Kafka read, run in a worker thread at most every ``interval`` seconds per stream.

    Between reads, and when a read fails, the last answer stands (None until there is one): the
    reads are informative, never an error of the reconcile. A failure is logged at WARNING the
    first time in a row, then at DEBUG.
    """

    def __init__(self, what: str, interval: float, timeout: float):
        self.what, self.interval, self.timeout = what, interval, timeout
        self._cache: dict[str, tuple[float, Any]] = {}
        self._failing: set[str] = set()

    async def __call__(self, config: RunConfig, read: Callable[[], Any]) -> Any:
        key = f"{config.stream.namespace}/{config.stream.name}/{config.stream.uid}"
        now = time.monotonic()
        cached = self._cache.get(key)
        if cached is not None and now - cached[0] < self.interval:
            return cached[1]
        try:
            value = await asyncio.wait_for(asyncio.to_thread(read), timeout=self.timeout)
        except Exception as exc:  # noqa: BLE001 - see the class docstring
            log.log(logging.DEBUG if key in self._failing else logging.WARNING,
                    "cannot read the %s of %s (is Kafka reachable?): %s", self.what, key, exc)
            self._failing.add(key)
            value = cached[1] if cached is not None else None
        else:
            self._failing.discard(key)
        self._cache[key] = (now, value)
        return value


class LedgerProgress:
    """What the stream's ledger and source say about its progress, read from Kafka, throttled per stream.

    * ``ledger_tip``: the last batch-complete record (one record at the end of one partition),
      at most every ``min_interval`` seconds;
    * ``replay_horizon``: ``eos_job.horizon.observe`` (a few round trips on both clusters), at
      most every ``horizon_interval`` seconds.
    """

    def __init__(self, min_interval: float = 10.0, timeout_s: float = 5.0, horizon_interval: float = 30.0):
        self.timeout_s = timeout_s
        self._tip = _ThrottledRead("last committed batch", min_interval, timeout_s + 5.0)
        self._horizon = _ThrottledRead("replay horizon", horizon_interval, 4 * timeout_s + 5.0)

    async def ledger_tip(self, config: RunConfig) -> LedgerTip | None:
        from eos_job.resolution import last_batch_record

        def read() -> LedgerTip | None:
            record = last_batch_record(config, timeout_s=self.timeout_s)
            return None if record is None else LedgerTip(record.batch, record.nondeterministic_slots_total)

        return await self._tip(config, read)

    async def replay_horizon(self, config: RunConfig) -> ReplayHorizon | None:
        from eos_job.horizon import observe

        return await self._horizon(config, lambda: observe(config, timeout_s=self.timeout_s))


# ------------------------------------------------------------ checkpoint store
class LocalCheckpointStore:
    """Reads snapshot manifests and checkpoints on the operator's own filesystem (``checkpoint.store: local``).

    A PVC is mounted by the driver, not by the operator, so for ``store: pvc`` it raises
    StoreUnreadable: the planner then says it cannot verify, instead of guessing.
    """

    async def read_snapshot(self, spec: ExactlyOnceStreamSpec, path: str) -> SnapshotView | None:
        local = self._local(spec, path)
        manifest = Path(local) / "eos-snapshot.json"
        try:
            doc = json.loads(manifest.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise StoreUnreadable(f"snapshot manifest {manifest}: {exc}") from exc
        return SnapshotView(path=path, stream_uid=(doc.get("stream") or {}).get("uid"), batch=doc.get("lastBatch"),
                            time=doc.get("time"), checkpoint_id=doc.get("checkpointId"))

    async def checkpoint_state(self, spec: ExactlyOnceStreamSpec, path: str) -> CheckpointState:
        ckpt = Path(self._local(spec, path))
        has_meta = (ckpt / "metadata").is_file()
        offsets = ckpt / "offsets"
        has_offsets = offsets.is_dir() and any(p.name.isdigit() for p in offsets.iterdir())
        if has_meta and has_offsets:
            try:
                json.loads((ckpt / "metadata").read_text().splitlines()[0])["id"]
            except (OSError, ValueError, KeyError, IndexError):
                return "damaged"
            return "intact"
        if not has_meta and not has_offsets:
            return "empty"
        return "damaged"

    @staticmethod
    def _local(spec: ExactlyOnceStreamSpec, path: str) -> str:
        if spec.checkpoint.store != "local":
            raise StoreUnreadable(f"checkpoint.store is {spec.checkpoint.store}: the operator does not mount it")
        return path.removeprefix("file://")
