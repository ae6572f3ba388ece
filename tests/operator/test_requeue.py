"""A plan's requeue_after shorter than the timer's interval is honoured (handlers.requeue)."""
from __future__ import annotations

import asyncio
import time

import kopf
import pytest

from .test_op_metrics import handler, operator_over_fakes, reconciles


def test_a_short_requeue_reconciles_again_before_the_timer_and_only_once_at_a_time():
    kube, m, registry, call = operator_over_fakes()   # interval 5 s (OperatorConfig's default)
    uid = call["uid"]

    async def scenario():
        await handler(registry, "reconcile-on-create")(**call)     # launches: waits for the Pod (2 s polls)
        first = reconciles(m, "stream", "ok")
        assert uid in call["memo"]["requeues"], "no follow-up scheduled for a plan that asked for one"
        await handler(registry, "reconcile-on-create")(**call)     # a second request: still one follow-up
        assert len(call["memo"]["requeues"]) == 1
        # No timer runs in this harness (the handlers are called directly): a further reconcile can only be the
        # follow-up. Waited for, not slept for: a busy machine may run it late.
        await until(lambda: reconciles(m, "stream", "ok") >= first + 2)
        return first, reconciles(m, "stream", "ok")

    first, later = asyncio.run(scenario())
    assert later >= first + 2, (first, later)   # the second call, then the follow-up without any timer tick


async def until(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


def test_no_follow_up_once_the_stream_is_gone():
    kube, m, registry, call = operator_over_fakes()

    async def scenario():
        await handler(registry, "reconcile-on-create")(**call)
        assert call["uid"] in call["memo"]["requeues"]
        kube.set_pod_phase("colors-driver-0", "Running")
        kube.mark_stream_deleted("colors")
        with pytest.raises(kopf.TemporaryError):        # the driver is asked to stop; stop waits for it
            await handler(registry, "stop")(**call)
        kube.finish_deletions()
        await handler(registry, "stop")(**call)
        return dict(call["memo"]["requeues"])

    assert asyncio.run(asyncio.wait_for(scenario(), 20)) == {}


def test_a_change_to_a_streams_pod_reconciles_it_without_a_timer_tick():
    """The Pod watch (informer.WatchedKube.listen) pokes a stream from its own thread: one reconcile follows
    within the poke delay, however many pokes; a Pod of no known stream pokes nothing."""
    import threading

    import kopf

    kube, m, registry, call = operator_over_fakes()
    listeners: list = []
    kube.listen = listeners.append
    kube.stream_uid = lambda ns, name: call["uid"] if (ns, name) == ("default", "colors") else None
    configure = next(h.fn for h in registry._activities.get_all_handlers() if h.id == "configure")

    async def scenario():
        await configure(settings=kopf.OperatorSettings(), memo=call["memo"])
        assert len(listeners) == 1, "configure did not subscribe to the Pod watch"
        pokes = [threading.Thread(target=listeners[0], args=("default", "colors")) for _ in range(5)]
        pokes.append(threading.Thread(target=listeners[0], args=("default", "unknown")))
        for t in pokes:
            t.start()
        for t in pokes:
            t.join()
        # Six pokes from threads: one reconcile follows (no timer runs here); a moment past the 0.2 s poke delay
        # for a second one that must not come.
        await until(lambda: reconciles(m, "stream", "ok") >= 1)
        await asyncio.sleep(0.5)
        return reconciles(m, "stream", "ok")

    assert asyncio.run(scenario()) == 1
    assert kube.created_pods == ["colors-driver-0"]


def test_the_timer_offsets_each_stream_once(monkeypatch):
    """kopf starts all streams' timers together; each stream's first tick waits a random part of the
    interval, once, so the ticks spread out for good."""
    import time

    from eos_operator import handlers as handlers_module

    from .test_op_metrics import handler

    offsets: list[tuple[float, float]] = []
    monkeypatch.setattr(handlers_module.random, "uniform", lambda a, b: offsets.append((a, b)) or 0.4)
    kube, m, registry, call = operator_over_fakes()
    call["memo"]["phased"] = set()
    tick = handler(registry, "reconcile-periodically")

    async def scenario():
        t0 = time.monotonic()
        await tick(**call)
        first = time.monotonic() - t0
        t1 = time.monotonic()
        await tick(**call)
        return first, time.monotonic() - t1

    first, second = asyncio.run(scenario())
    assert offsets.count((0, 5.0)) == 1 and first >= 0.4 and second < 0.4
