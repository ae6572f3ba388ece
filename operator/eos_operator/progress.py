"""The operator's progress reads: each running stream's ledger tip (``status.lastCommittedBatch``) and every
stream's replay horizon, read from Kafka off the reconcile's path and batched per cluster.

Per stream, :class:`_ThrottledRead` decides when a read is due and hands the reconcile the last answer at once.
Per cluster, :class:`_Batches` serves every stream whose read came due while the previous batch ran with one
call: ``eos_job.tips.read_tips`` (one ListOffsets for all ledgers, records only of those that moved) and
``eos_job.horizon.observe_many`` (the source topics' offsets and retention once for all streams). So the Kafka
requests grow with the number of clusters and of moved ledgers, not with the number of streams.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable

from eos_job.clients import SharedClients, settings_key
from eos_job.kafka_security import KafkaSecrets
from eos_job.spec import RunConfig
from eos_job.status import ReplayHorizon

from .adapters import LedgerTip, _KafkaErrors
from .op_metrics import OperatorMetrics
from .pools import Pools, cluster_of

log = logging.getLogger(__name__)


class _ThrottledRead:
    """A Kafka read, run at most every ``interval`` seconds per stream, off the reconcile's path.

    The first read of a stream is awaited for at most ``first_wait`` seconds (after an operator start every
    stream's first read queues behind its cluster's batch); after that a reconcile gets the last answer at once
    and, when it is due, starts the next read in the background, so a reconcile (and a spec change
    waiting for the stream's lock behind it) never waits on Kafka: answers are at most one read behind. When
    a read fails the last answer stands (None until there is one): the reads are informative, never an error of
    the reconcile. A failure is logged at WARNING the first time in a row (and when its reason changes), else at
    DEBUG, and counted by
    ``failed`` (if it is Kafka's). One read per stream at a time: none piles up behind a slow one.
    """

    def __init__(self, what: str, interval: float, timeout: float,
                 failed: Callable[[BaseException], None] | None = None, *, first_wait: float = 1.0):
        self.what, self.interval, self.timeout, self.first_wait = what, interval, timeout, first_wait
        self.failed = failed
        self._cache: dict[str, tuple[float, Any]] = {}
        self._failing: dict[str, str] = {}   # stream -> why its reads fail (logged at WARNING when it changes)
        self._reading: dict[str, asyncio.Future] = {}

    async def __call__(self, config: RunConfig, read: Callable[[], Awaitable[Any]]) -> Any:
        key = f"{config.stream.namespace}/{config.stream.name}/{config.stream.uid}"
        now = time.monotonic()
        cached = self._cache.get(key)
        if (cached is None or now - cached[0] >= self.interval) and key not in self._reading:
            task = asyncio.ensure_future(self._read(key, read, now))
            self._reading[key] = task
            if cached is None:   # the first answer, if it comes soon (an operator start reads every stream at once)
                await asyncio.wait({task}, timeout=self.first_wait)
        cached = self._cache.get(key)
        return cached[1] if cached is not None else None

    async def _read(self, key: str, read: Callable[[], Awaitable[Any]], started: float) -> None:
        previous = self._cache.get(key)
        try:
            value = await asyncio.wait_for(read(), timeout=self.timeout)
        except asyncio.CancelledError:
            raise   # forgotten meanwhile: nothing to keep
        except Exception as exc:  # noqa: BLE001 - see the class docstring
            why = str(exc) or f"{type(exc).__name__} after {self.timeout:g} s (reads of its cluster queue in its pool)"
            log.log(logging.DEBUG if self._failing.get(key) == why else logging.WARNING,
                    "cannot read the %s of %s (is Kafka reachable?): %s", self.what, key, why)
            if self.failed is not None:
                self.failed(exc)
            self._failing[key] = why
            value = previous[1] if previous is not None else None
        else:
            self._failing.pop(key, None)
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
        self._failing = {k: v for k, v in self._failing.items() if not k.startswith(prefix)}


class _Batches:
    """Coalesces one kind of read per cluster and client settings: requests made while a batch runs (or within
    ``gather_s`` of the first) are answered by the next single ``run(conf, {key: payload})`` call, in a thread of
    the cluster's own pool, which answers each key with a value or an exception."""

    def __init__(self, purpose: str, run: Callable[[dict[str, str], dict[str, Any]], dict[str, Any]],
                 timeout: float, pools: Pools, gather_s: float = 0.05):
        self.purpose, self.run, self.timeout, self.pools, self.gather_s = purpose, run, timeout, pools, gather_s
        self._pending: dict[tuple[str, str], dict[str, tuple[Any, asyncio.Future]]] = {}
        self._confs: dict[tuple[str, str], dict[str, str]] = {}
        self._draining: dict[tuple[str, str], asyncio.Task] = {}
        self.batches = 0   # calls of ``run`` so far (the tests)

    async def get(self, cluster: str, conf: dict[str, str], key: str, payload: Any = None) -> Any:
        group = (cluster, settings_key(conf, None))
        waiting = self._pending.setdefault(group, {})
        if key in waiting:
            fut = waiting[key][1]
        else:
            fut = asyncio.get_running_loop().create_future()
            waiting[key] = (payload, fut)
        self._confs[group] = conf
        if group not in self._draining:
            self._draining[group] = asyncio.ensure_future(self._drain(group))
        return await asyncio.shield(fut)

    async def _drain(self, group: tuple[str, str]) -> None:
        try:
            while self._pending.get(group):
                await asyncio.sleep(self.gather_s)
                batch = self._pending.pop(group)
                conf = self._confs.pop(group)
                wants = {key: payload for key, (payload, _) in batch.items()}
                self.batches += 1
                try:
                    answers = await self.pools.run(self.purpose, group[0], lambda: self.run(conf, wants),
                                                   timeout=self.timeout)
                except Exception as exc:  # noqa: BLE001 - every request of the batch gets it
                    answers = {key: exc for key in batch}
                for key, (_, fut) in batch.items():
                    answer = answers.get(key, LookupError(f"the {self.purpose} batch gave no answer for {key}"))
                    if not fut.done():
                        if isinstance(answer, BaseException):
                            fut.set_exception(answer)
                        else:
                            fut.set_result(answer)
        finally:
            self._draining.pop(group, None)
            for _, fut in self._pending.pop(group, {}).values():   # cancelled while requests waited
                if not fut.done():
                    fut.cancel()


class LedgerProgress:
    """What the stream's ledger and source say about its progress, read from Kafka, throttled per stream and
    batched per cluster.

    * ``ledger_tip``: the last batch-complete record, at most every ``min_interval`` seconds;
    * ``replay_horizon``: ``eos_job.horizon.observe_many`` on the stream's last batch-complete record, at most
      every ``horizon_interval`` seconds.

    Failed reads are counted (op_metrics: ``ledger-read``, ``replay-horizon``).
    """

    def __init__(self, min_interval: float = 10.0, timeout_s: float = 5.0, horizon_interval: float = 30.0,
                 metrics: OperatorMetrics | None = None, pools: Pools | None = None,
                 clients: SharedClients | None = None, first_wait: float = 1.0):
        self.timeout_s = timeout_s
        pools = pools or Pools()
        # Long-lived clients per cluster and credentials, not one per read (eos_job.clients).
        self.clients = clients or SharedClients()
        self._tip_failed = _KafkaErrors(metrics, "ledger-read")
        self._horizon_failed = _KafkaErrors(metrics, "replay-horizon")
        self._tip = _ThrottledRead("last committed batch", min_interval, timeout_s + 5.0, self._tip_failed,
                                   first_wait=first_wait)
        self._horizon = _ThrottledRead("replay horizon", horizon_interval, 4 * timeout_s + 5.0,
                                       self._horizon_failed)
        self._known: dict[tuple[str, str], Any] = {}   # (client settings, ledger topic) -> its last tip
        self._ledgers: dict[str, tuple[str, str]] = {}  # "namespace/name" -> its key in _known
        self.tips = _Batches("progress", self._read_tips, timeout_s + 5.0, pools)
        self.horizons = _Batches("horizon", self._read_horizons, 3 * timeout_s + 5.0, pools)

    def forget(self, namespace: str, name: str) -> None:
        self._tip.forget(namespace, name)
        self._horizon.forget(namespace, name)
        self._known.pop(self._ledgers.pop(f"{namespace}/{name}", ("", "")), None)

    async def ledger_tip(self, config: RunConfig, kafka: dict[str, KafkaSecrets] | None = None) -> LedgerTip | None:
        async def read() -> LedgerTip | None:
            record = await self._record(config, kafka)
            return None if record is None else LedgerTip(record.batch, record.nondeterministic_slots_total,
                                                         record.runtime_version)

        return await self._tip(config, read)

    async def replay_horizon(self, config: RunConfig,
                             kafka: dict[str, KafkaSecrets] | None = None) -> ReplayHorizon | None:
        from eos_job.ledger import base_config, source_security

        async def read() -> ReplayHorizon | None:
            record = await self._record(config, kafka)
            src = config.spec.source
            conf = base_config(src.bootstrap_servers, source_security(src, (kafka or {}).get("source")))
            return await self.horizons.get(cluster_of(src.bootstrap_servers), conf, _stream_key(config),
                                           (config, record))

        return await self._horizon(config, read)

    async def _record(self, config: RunConfig, kafka: dict[str, KafkaSecrets] | None):
        from eos_job.ledger import base_config, sink_security

        sink = config.spec.sink
        conf = base_config(sink.bootstrap_servers, sink_security(sink, (kafka or {}).get("sink")))
        topic = config.ledger_topic()
        self._ledgers[f"{config.stream.namespace}/{config.stream.name}"] = (settings_key(conf, None), topic)
        return (await self.tips.get(cluster_of(sink.bootstrap_servers), conf, topic)).record

    def _read_tips(self, conf: dict[str, str], wants: dict[str, Any]) -> dict[str, Any]:
        from eos_job.tips import Tip, read_tips

        settings = settings_key(conf, None)
        known = {t: self._known[(settings, t)] for t in wants if (settings, t) in self._known}
        answers = read_tips(conf, list(wants), known, timeout_s=self.timeout_s, clients=self.clients)
        for topic, answer in answers.items():
            if isinstance(answer, Tip):
                self._known[(settings, topic)] = answer
            else:
                self._known.pop((settings, topic), None)
        return answers

    def _read_horizons(self, conf: dict[str, str], wants: dict[str, Any]) -> dict[str, Any]:
        from eos_job.horizon import observe_many

        return observe_many(conf, wants, timeout_s=self.timeout_s, clients=self.clients)


def _stream_key(config: RunConfig) -> str:
    return f"{config.stream.namespace}/{config.stream.name}/{config.stream.uid}"
