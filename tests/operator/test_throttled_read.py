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

    async def scenario():
        t = _ThrottledRead("thing", interval=0.0, timeout=5)
        slow = _ThrottledRead("thing", interval=3600, timeout=5)
        a, b = config("a"), config("b")
        got = [await t(a, read, "k"), await t(a, read, "k"), await t(a, read, "k"), await t(a, read, "k")]
        cached = [await slow(a, lambda: "x", "k"), await slow(a, lambda: "y", "k"), await slow(b, lambda: "z", "k")]
        return got, cached

    got, cached = asyncio.run(scenario())
    assert got == [1, 2, 2, 4]
    assert cached == ["x", "x", "z"]
