"""Fencing: ``init_transactions`` on every transactional id of a stream, before a driver starts.

Resolution fences every slot id of every generation that wrote (2 x P ids and
more for P slots). Each fence is its own producer (a transactional id per
producer) and a few round trips to the transaction coordinator, so the ids are
fenced by a bounded pool of threads (``pool_size``, default
``min(DEFAULT_POOL, ids)``) under one deadline for all of them, not one timeout
per id. The protocol is unchanged: ``fence_all`` returns only when every id is
fenced; otherwise it raises ``FenceFailed``, which lists every id that was not
fenced with its reason, in the order of ``txids`` (generation, then slot),
after every producer it created is closed.

Most of a fence's time on a small cluster is not the coordinator's: librdkafka
drops its bootstrap connection once it knows the brokers and, with sparse
connections (its default), connects to a known broker for the coordinator
lookup only on a 500 ms retry timer, so a fence takes 50 to 500 ms where the
round trips take a few. ``dense=True`` (``enable.sparse.connections=false``)
connects every known broker at once: a fence then takes milliseconds, for one
connection per broker per fence (resolution uses it up to ``DENSE_MAX_BROKERS``
brokers). See benchmarks/results/2026-11-25-fencing.md.
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Callable

from confluent_kafka import KafkaException, Producer

from .ledger import SinkUnavailable, base_config

log = logging.getLogger(__name__)

# Fences at once. Each is a producer: about 5 librdkafka threads, 3 connections and 8 file descriptors while it
# runs. With sparse connections a fence mostly waits on librdkafka's timer, so the width is the speed-up; with
# dense ones a 2-core machine is CPU-bound already at 16 (benchmarks/results/2026-11-25-fencing.md).
DEFAULT_POOL = 64
# How long past the deadline to wait for fences still running (librdkafka returns from init_transactions at
# its timeout, which is the time left to the deadline; a producer's close takes a millisecond).
GRACE_S = 5.0
# Up to how many brokers resolution fences with dense connections (one connection per broker per fence: on a
# larger cluster, with TLS and SASL handshakes, that costs more than the timer it saves).
DENSE_MAX_BROKERS = 3
# Ids named in the message of a FenceFailed (all of them are in ``failures``).
NAMED = 5


@dataclass(frozen=True)
class FenceFailure:
    txid: str
    reason: str
    error: BaseException | None = field(default=None, compare=False, repr=False)   # the Kafka error, if any


class FenceFailed(SinkUnavailable):
    """Some transactional ids were not fenced: ``failures``, in the order they were asked for. The message
    names the first as resolution always has ("resolution could not fence <id>: <reason>; ...")."""

    def __init__(self, failures: list[FenceFailure]):
        self.failures = failures
        first = failures[0]
        msg = (f"resolution could not fence {first.txid}: {first.reason}; the sink cluster must be reachable "
               "before the stream restarts")
        if len(failures) > 1:
            more = ", ".join(f.txid for f in failures[1:NAMED + 1])
            msg += (f" ({len(failures) - 1} more ids not fenced: {more}"
                    f"{', ...' if len(failures) > NAMED + 1 else ''})")
        super().__init__(msg)


def fence_config(bootstrap: str, txid: str, sec: dict[str, str], dense: bool = False) -> dict:
    conf = {**base_config(bootstrap, sec), "transactional.id": txid, "enable.idempotence": True, "acks": "all"}
    if dense:
        conf["enable.sparse.connections"] = False
    return conf


def release(producer) -> None:
    """Close ``producer`` now: ``close()`` (confluent_kafka >= 2.13) destroys the librdkafka handle and joins
    its threads before it returns; without it, flush and leave the handle to the last reference."""
    try:
        close = getattr(producer, "close", None)
        if close is not None:
            close()
        else:
            producer.flush(0)
    except Exception as exc:  # noqa: BLE001  (closing must not hide the fence's own outcome)
        log.debug("closing a fencing producer failed: %s", exc)


def fence(bootstrap: str, txid: str, timeout_s: float, sec: dict[str, str],
          producer_factory: Callable[[dict], Producer] = Producer, dense: bool = False) -> None:
    """init_transactions on ``txid``: aborts its unfinished transaction, if any, and fences its producers."""
    p = producer_factory(fence_config(bootstrap, txid, sec, dense))
    try:
        p.init_transactions(timeout_s)
    finally:
        release(p)


def fence_all(bootstrap: str, txids: list[str], timeout_s: float, sec: dict[str, str], *,
              pool_size: int | None = None, dense: bool = False,
              producer_factory: Callable[[dict], Producer] = Producer, grace_s: float = GRACE_S) -> int:
    """Fence every id in ``txids``, ``pool_size`` at a time, all within ``timeout_s``; return how many.

    Raises ``FenceFailed`` (a ``SinkUnavailable``) naming every id not fenced (a Kafka error, the deadline)
    and any other error of a fence as it is, once every started fence returned and closed its producer."""
    if not txids:
        return 0
    workers = max(1, min(pool_size or DEFAULT_POOL, len(txids)))
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    late = f"not fenced within the {timeout_s:g} s deadline of resolution's fencing"

    def one(txid: str) -> FenceFailure | None:
        """None: fenced; else why not."""
        left = deadline - time.monotonic()
        if left <= 0:
            return FenceFailure(txid, late)
        try:
            fence(bootstrap, txid, left, sec, producer_factory, dense)
        except KafkaException as exc:
            return FenceFailure(txid, str(exc.args[0]), exc)
        return None

    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="eos-fence")
    futures: list[Future] = []
    stuck: list[Future] = []
    try:
        futures = [pool.submit(one, txid) for txid in txids]
        _, pending = wait(futures, timeout=max(0.0, deadline - time.monotonic()), return_when=FIRST_EXCEPTION)
        if pending:
            for f in pending:
                f.cancel()   # not started yet: never will be
            running = [f for f in pending if not f.cancelled()]
            _, still = wait(running, timeout=max(0.0, deadline - time.monotonic()) + grace_s)
            stuck = list(still)
    finally:
        # Normally every fence has returned (and closed its producer) by now, and this joins the threads. A
        # fence still running past the grace is left to finish on its own: it closes its producer when
        # init_transactions returns; resolution fails meanwhile.
        pool.shutdown(wait=not stuck, cancel_futures=True)
    failures: list[FenceFailure] = []
    for txid, f in zip(txids, futures):
        if f.cancelled():
            failures.append(FenceFailure(txid, late))
        elif not f.done():
            failures.append(FenceFailure(txid, f"{late}: init_transactions still had not returned "
                                               f"{grace_s:g} s after it"))
        elif f.exception() is not None:
            raise f.exception()   # not a Kafka error: a bug, as it is
        elif f.result() is not None:
            failures.append(f.result())
    elapsed_ms = (time.monotonic() - t0) * 1000
    if failures:
        log.warning("fencing: %d of %d transactional ids not fenced in %.0f ms (pool %d%s); first %s: %s",
                    len(failures), len(txids), elapsed_ms, workers, ", dense" if dense else "", failures[0].txid,
                    failures[0].reason)
        raise FenceFailed(failures) from failures[0].error
    log.info("fenced %d transactional ids in %.0f ms (pool %d%s)", len(txids), elapsed_ms, workers,
             ", dense" if dense else "")
    return len(txids)
