"""Bounded worker threads for the operator's blocking I/O, kept apart per Kafka cluster and purpose.

The Kafka client and S3 reads block, so the operator runs them in threads. In asyncio's one default pool
(a handful of threads on a small node) a single unreachable Kafka cluster would hold every thread until
its timeouts expire, and every other stream's progress reads and resolutions would queue behind it:
resolutions time out and count against healthy streams' restart strategies. Here each (purpose, cluster)
has its own small pool, created on first use and shut down once idle, so a bad cluster delays only the
streams that use it. A thread cannot be cancelled: the calls it runs carry their own timeouts (the
Kafka client's), and ``run`` stops waiting at ``timeout`` while the thread ends by itself.
"""
from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

IDLE_SECONDS = 300.0   # a pool unused this long is shut down (its cluster's streams are gone)


class Pools:
    def __init__(self, workers: dict[str, int] | None = None, default_workers: int = 2):
        self.workers = {"resolve": 2, "progress": 2, "horizon": 1, "store": 4, **(workers or {})}
        self.default_workers = default_workers
        self._pools: dict[tuple[str, str], tuple[ThreadPoolExecutor, float]] = {}
        self._lock = threading.Lock()

    def pool(self, purpose: str, cluster: str) -> ThreadPoolExecutor:
        now = time.monotonic()
        with self._lock:
            key = (purpose, cluster)
            held = self._pools.get(key)
            if held is None:
                n = self.workers.get(purpose, self.default_workers)
                pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix=f"eos-{purpose}")
            else:
                pool = held[0]
            self._pools[key] = (pool, now)
            self._reap(now)
            return pool

    def _reap(self, now: float) -> None:
        for key, (pool, used) in list(self._pools.items()):
            if now - used > IDLE_SECONDS:
                del self._pools[key]
                pool.shutdown(wait=False)

    async def run(self, purpose: str, cluster: str, fn: Callable[[], Any], timeout: float) -> Any:
        loop = asyncio.get_running_loop()
        # The caller's context goes with the call (as asyncio.to_thread does): what the thread logs names the
        # stream the caller works on (eos_job.log_format).
        ctx = contextvars.copy_context()
        return await asyncio.wait_for(loop.run_in_executor(self.pool(purpose, cluster), ctx.run, fn),
                                      timeout=timeout)

    def close(self, wait: bool = False) -> None:
        with self._lock:
            pools = [pool for pool, _ in self._pools.values()]
            self._pools.clear()
        for pool in pools:
            pool.shutdown(wait=wait, cancel_futures=True)


def cluster_of(*bootstraps: str) -> str:
    """A cluster's key: its bootstrap servers as the spec names them (one pool per distinct set)."""
    return "|".join(",".join(sorted(b.split(","))) for b in bootstraps)
