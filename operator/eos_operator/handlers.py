"""Thin kopf registrations: every trigger calls the same level-based reconcile.

create, update (spec changes), resume (operator start), a change to one of the
stream's Pods (seen by the operator's Pod watch, informer.py) and a timer all run
:func:`eos_operator.reconciler.reconcile`; the timer is what notices restart
delays and deadlines running out (and catches anything a watch missed). A per-stream lock keeps the timer and
the event handlers from planning on top of each other (loop.serialized, which
also measures each reconcile for op_metrics). Deletion stops the
driver gracefully behind a finalizer and retries with ``TemporaryError`` until
every driver Pod is gone.

ExactlyOnceSnapshot resources get the same treatment through
:func:`eos_operator.snapshot_reconciler.reconcile_snapshot`: create, update,
resume, a timer while a snapshot is Pending or InProgress, and a deletion
handler behind the same finalizer that waits until the snapshot's files are
disposed (or left, with an event saying where).
"""
from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from typing import Any, Callable

import kopf

from eos_job.spec import API_GROUP, API_VERSION, PLURAL
from eos_job.snapshot_resource import SNAPSHOT_PLURAL

from .adapters import JobResolver, KubernetesApi, StoreReader, SystemClock
from .progress import LedgerProgress
from .informer import WatchedKube
from .loop import serialized
from .metrics import StreamMetrics
from .op_metrics import OperatorMetrics
from .pools import Pools
from .reconciler import Deps, StatusUnreadable, reconcile
from .snapshot_reconciler import reconcile_snapshot
from .snapshots import TERMINAL_STATES, SnapshotStatusUnreadable

log = logging.getLogger(__name__)
POKE_DELAY_S = 0.2   # a burst of one stream's Pod events makes one reconcile

RESOURCE = {"group": API_GROUP, "version": API_VERSION, "plural": PLURAL}
SNAPSHOT_RESOURCE = {"group": API_GROUP, "version": API_VERSION, "plural": SNAPSHOT_PLURAL}


def snapshot_unfinished(status: Any, **_: Any) -> bool:
    """The timer runs only while a snapshot can still change by itself (Pending or InProgress)."""
    return (status or {}).get("state") not in TERMINAL_STATES


@dataclass(frozen=True)
class OperatorConfig:
    interval: float = 5.0             # seconds between periodic reconciles of each stream
    resolution_timeout: float = 60.0
    progress_interval: float = 15.0   # seconds between reads of a stream's last committed batch
    horizon_interval: float = 30.0    # seconds between replay-horizon checks of a stream
    metrics_port: int | None = None   # serve Prometheus metrics on this port (None: not at all)
    metrics_address: str = "0.0.0.0"
    kubeconfig: str | None = None
    exact_namespaces: bool = False    # every watched namespace named exactly: no cluster-wide scanning
    namespaces: tuple[str, ...] = ()  # --namespace patterns (empty: every namespace)
    informers: bool = True            # reads from watches (informer.py); False: a LIST/GET per pass


def default_deps(config: OperatorConfig) -> Deps:
    metrics = op = None
    if config.metrics_port is not None:
        metrics = StreamMetrics()
        op = OperatorMetrics(metrics.registry)   # one registry, one endpoint
        metrics.serve(config.metrics_port, config.metrics_address)
    pools = Pools()   # blocking I/O: bounded threads per Kafka cluster and purpose (pools.py)
    if config.informers:
        kube = WatchedKube.from_kubeconfig(config.kubeconfig, metrics=op, namespaces=config.namespaces,
                                           exact=config.exact_namespaces).start()
    else:
        kube = KubernetesApi.from_kubeconfig(config.kubeconfig, metrics=op)
    return Deps(kube=kube,
                resolver=JobResolver(timeout_s=config.resolution_timeout, metrics=op, pools=pools),
                clock=SystemClock(),
                progress=LedgerProgress(min_interval=config.progress_interval,
                                        horizon_interval=config.horizon_interval, metrics=op, pools=pools),
                store=StoreReader(pools=pools), metrics=metrics, operator_metrics=op)


def build_registry(config: OperatorConfig,
                   deps_factory: Callable[[OperatorConfig], Deps] = default_deps) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.login(id="login", registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # Through the kubernetes client: in-cluster, else $KUBECONFIG (set by --kubeconfig).
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(id="configure", registry=registry)
    async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        # Keep kopf's bookkeeping in annotations under our group: the status is ours alone.
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=API_GROUP, key="last-handled-configuration")
        settings.persistence.finalizer = f"{API_GROUP}/finalizer"
        # Our own events say what happened; kopf's per-handler events would only add noise.
        settings.posting.enabled = False
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        if config.exact_namespaces:
            # Without this kopf lists namespaces and CRDs cluster-wide, which a namespaced install
            # (Roles only) may not do: it would retry on 403 for about a minute before working.
            settings.scanning.disabled = True
        memo.deps = deps_factory(config)
        memo.locks = {}
        listen = getattr(memo.deps.kube, "listen", None)
        if listen is not None:   # a stream's Pod changed: reconcile it now, not at the next tick
            loop = asyncio.get_running_loop()
            listen(lambda ns, name: loop.call_soon_threadsafe(poke, memo, ns, name))

    def poke(memo: kopf.Memo, namespace: str, name: str) -> None:
        uid = memo.deps.kube.stream_uid(namespace, name)
        if uid is not None:
            schedule(namespace, name, uid, memo, log, POKE_DELAY_S)

    def offer(memo: kopf.Memo, body: Any) -> None:
        """kopf's latest body of the object, for watch-driven reads (informer.WatchedKube.offer)."""
        take = getattr(memo.deps.kube, "offer", None)
        if take is not None and body is not None:
            take(dict(body))

    async def run(namespace: str, name: str, uid: str, memo: kopf.Memo, logger: Any, body: Any = None):
        offer(memo, body)
        outcome = await serialized(memo.locks.setdefault(uid, asyncio.Lock()), "stream",
                                   lambda: reconcile(namespace, name, memo.deps), memo.deps.operator_metrics)
        requeue(namespace, name, uid, memo, logger, outcome)
        return outcome

    def requeue(namespace: str, name: str, uid: str, memo: kopf.Memo, logger: Any, outcome: Any) -> None:
        """Honour a plan's requeue_after shorter than the timer's interval (waiting for a Pod to come or go:
        look again in 2 s, not 5): one follow-up per stream at a time, with a little jitter."""
        delay = getattr(outcome, "requeue_after", None)
        if delay and delay < config.interval and getattr(outcome, "exists", True):
            schedule(namespace, name, uid, memo, logger, delay)

    def schedule(namespace: str, name: str, uid: str, memo: kopf.Memo, logger: Any, delay: float) -> None:
        """One follow-up reconcile per stream at a time, ``delay`` seconds from now with a little jitter."""
        pending = memo.setdefault("requeues", {})
        if uid in pending:
            return

        async def follow_up() -> None:
            pending.pop(uid, None)
            try:
                await run(namespace, name, uid, memo, logger)
            except Exception as exc:  # noqa: BLE001 - the timer tries again
                logger.warning("requeued reconcile failed: %s", exc)
        pending[uid] = asyncio.get_running_loop().call_later(
            delay * random.uniform(1.0, 1.1), lambda: asyncio.ensure_future(follow_up()))

    @kopf.on.create(**RESOURCE, id="reconcile-on-create", registry=registry)
    @kopf.on.update(**RESOURCE, id="reconcile-on-update", field="spec", registry=registry)
    @kopf.on.resume(**RESOURCE, id="reconcile-on-resume", registry=registry)
    async def reconcile_stream(namespace: str, name: str, uid: str, memo: kopf.Memo, logger: Any,
                               body: Any = None, **_: Any) -> None:
        try:
            await run(namespace, name, uid, memo, logger, body)
        except StatusUnreadable as exc:
            raise kopf.PermanentError(str(exc)) from exc
        except Exception as exc:  # noqa: BLE001 - the timer or a retry picks it up again
            logger.warning("reconcile failed, retrying: %s", exc)
            raise kopf.TemporaryError(str(exc), delay=5) from exc

    @kopf.timer(**RESOURCE, id="reconcile-periodically", interval=config.interval,
                initial_delay=config.interval, registry=registry)
    async def reconcile_periodically(namespace: str, name: str, uid: str, memo: kopf.Memo, logger: Any,
                                     body: Any = None, **_: Any) -> None:
        phased = memo.setdefault("phased", set())
        if uid not in phased:
            # kopf starts every stream's timer when it first sees it (at an operator start: all at once) and
            # counts the interval from the end of the previous run: a one-off random offset spreads the
            # streams' ticks over the interval for good.
            phased.add(uid)
            await asyncio.sleep(random.uniform(0, config.interval))
        try:
            await run(namespace, name, uid, memo, logger, body)
        except Exception as exc:  # noqa: BLE001 - next tick tries again
            logger.warning("periodic reconcile failed: %s", exc)

    @kopf.on.delete(**RESOURCE, id="stop", registry=registry)
    async def stop_stream(namespace: str, name: str, uid: str, memo: kopf.Memo, logger: Any, body: Any = None,
                          **_: Any) -> None:
        outcome = await run(namespace, name, uid, memo, logger, body)
        if outcome.exists and not outcome.finished:
            raise kopf.TemporaryError(f"{namespace}/{name} is being deleted: waiting for its driver to stop "
                                      "at a clean batch boundary (not an error)", delay=2)
        memo.locks.pop(uid, None)
        memo.setdefault("phased", set()).discard(uid)
        handle = memo.setdefault("requeues", {}).pop(uid, None)
        if handle is not None:
            handle.cancel()

    # ------------------------------------------------------------ snapshots
    async def run_snapshot(namespace: str, name: str, uid: str, memo: kopf.Memo, body: Any = None):
        offer(memo, body)   # kopf may know of a deletion before the operator's own watch does
        return await serialized(memo.locks.setdefault(uid, asyncio.Lock()), "snapshot",
                                lambda: reconcile_snapshot(namespace, name, memo.deps), memo.deps.operator_metrics)

    @kopf.on.create(**SNAPSHOT_RESOURCE, id="snapshot-on-create", registry=registry)
    @kopf.on.update(**SNAPSHOT_RESOURCE, id="snapshot-on-update", field="spec", registry=registry)
    @kopf.on.resume(**SNAPSHOT_RESOURCE, id="snapshot-on-resume", registry=registry)
    async def reconcile_snapshot_now(namespace: str, name: str, uid: str, memo: kopf.Memo, logger: Any,
                                     body: Any = None, **_: Any) -> None:
        try:
            await run_snapshot(namespace, name, uid, memo, body)
        except SnapshotStatusUnreadable as exc:
            raise kopf.PermanentError(str(exc)) from exc
        except Exception as exc:  # noqa: BLE001 - the timer or a retry picks it up again
            logger.warning("snapshot reconcile failed, retrying: %s", exc)
            raise kopf.TemporaryError(str(exc), delay=5) from exc

    @kopf.timer(**SNAPSHOT_RESOURCE, id="snapshot-periodically", interval=config.interval,
                initial_delay=config.interval, when=snapshot_unfinished, registry=registry)
    async def reconcile_snapshot_periodically(namespace: str, name: str, uid: str, memo: kopf.Memo, logger: Any,
                                              body: Any = None, **_: Any) -> None:
        try:
            await run_snapshot(namespace, name, uid, memo, body)
        except Exception as exc:  # noqa: BLE001 - next tick tries again
            logger.warning("periodic snapshot reconcile failed: %s", exc)

    @kopf.on.delete(**SNAPSHOT_RESOURCE, id="dispose", registry=registry)
    async def dispose_snapshot(namespace: str, name: str, uid: str, memo: kopf.Memo, logger: Any,
                               body: Any = None, **_: Any) -> None:
        try:
            outcome = await run_snapshot(namespace, name, uid, memo, body)
        except SnapshotStatusUnreadable as exc:
            # Never guess which files to remove: keep them and let the resource go.
            logger.warning("snapshot %s/%s: %s; its files are kept", namespace, name, exc)
            memo.locks.pop(uid, None)
            return
        if outcome.exists and not outcome.finished:
            raise kopf.TemporaryError(f"{namespace}/{name} is being deleted: waiting for its attempt to stop and "
                                      "its files to be disposed (not an error)",
                                      delay=min(max(outcome.requeue_after or 2.0, 1.0), 60.0))
        memo.locks.pop(uid, None)

    return registry
