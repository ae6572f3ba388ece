"""The operator's throttled Kafka reads (progress, replay horizon): at most one per interval per
stream, and a failure keeps the last answer."""
from __future__ import annotations

import asyncio

from eos_job.spec import RunConfig, StreamIdentity
from eos_operator.adapters import _ThrottledRead

from .test_planner import spec


def config(name: str) -> RunConfig:
    return RunConfig(stream=StreamIdentity(name=name, namespace="default", uid=f"uid-{name}"),
                     spec=spec(), checkpoint_dir="/tmp/ckpt")


def test_reads_are_throttled_per_stream_and_failures_keep_the_last_answer():
    answers = iter([1, 2, RuntimeError("broker down"), 4])

    def read():
        a = next(answers)
        if isinstance(a, Exception):
            raise a
        return a

    async def settled(t, cfg, fn):
        """One reconcile's read, then the background read it started runs to its end."""
        got = await t(cfg, fn, "k")
        while t._reading:
            await asyncio.sleep(0.01)
        return got

    async def scenario():
        t = _ThrottledRead("thing", interval=0.0, timeout=5)
        slow = _ThrottledRead("thing", interval=3600, timeout=5)
        a, b = config("a"), config("b")
        # The first read is awaited; each later call answers at once with the last value and reads the next in
        # the background (at most one read behind); a failed read keeps the last answer.
        got = [await settled(t, a, read) for _ in range(5)]
        cached = [await slow(a, lambda: "x", "k"), await slow(a, lambda: "y", "k"), await slow(b, lambda: "z", "k")]
        return got, cached

    got, cached = asyncio.run(scenario())
    assert got == [1, 1, 2, 2, 4]
    assert cached == ["x", "x", "z"]


def test_a_slow_read_never_holds_a_reconcile_after_the_first_answer():
    import threading
    import time

    release = threading.Event()

    def slow_read():
        release.wait(5)
        return "late"

    async def scenario():
        t = _ThrottledRead("thing", interval=0.0, timeout=10)
        a = config("a")
        first = await t(a, lambda: "first", "k")
        t0 = time.monotonic()
        second = await t(a, slow_read, "k")          # starts the slow read, answers at once
        third = await t(a, lambda: "never", "k")     # that read still runs: no second one piles up
        waited = time.monotonic() - t0
        release.set()
        while t._reading:
            await asyncio.sleep(0.01)
        return first, second, third, waited, await t(a, lambda: "next", "k")

    first, second, third, waited, fourth = asyncio.run(scenario())
    assert (first, second, third, fourth) == ("first", "first", "first", "late")
    assert waited < 1.0, waited


def test_forgetting_a_stream_drops_its_read_in_flight():
    import threading

    release = threading.Event()

    async def scenario():
        t = _ThrottledRead("thing", interval=0.0, timeout=10)
        a = config("a")
        await t(a, lambda: 1, "k")
        await t(a, lambda: release.wait(5) or 2, "k")
        t.forget("default", "a")
        release.set()
        await asyncio.sleep(0.2)
        return dict(t._cache), dict(t._reading)

    assert asyncio.run(scenario()) == ({}, {})


def test_the_first_read_is_awaited_only_briefly():
    import threading
    import time

    release = threading.Event()

    async def scenario():
        t = _ThrottledRead("thing", interval=0.0, timeout=10, first_wait=0.2)
        a = config("a")
        t0 = time.monotonic()
        first = await t(a, lambda: (release.wait(5), "slow")[1], "k")   # a queue of first reads at a start
        waited = time.monotonic() - t0
        release.set()
        while t._reading:
            await asyncio.sleep(0.01)
        return first, waited, await t(a, lambda: "next", "k")

    first, waited, later = asyncio.run(scenario())
    assert first is None and waited < 1.0 and later == "slow"
