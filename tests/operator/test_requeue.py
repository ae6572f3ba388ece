"""A plan's requeue_after shorter than the timer's interval is honoured (handlers.requeue)."""
from __future__ import annotations

import asyncio

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
        await asyncio.sleep(2.5)                                    # < the 5 s timer, > the 2 s requeue
        return first, reconciles(m, "stream", "ok")

    first, later = asyncio.run(scenario())
    assert later >= first + 2, (first, later)   # the second call, then the follow-up without any timer tick


def test_no_follow_up_once_the_stream_is_gone():
    kube, m, registry, call = operator_over_fakes()

    async def scenario():
        await handler(registry, "reconcile-on-create")(**call)
        assert call["uid"] in call["memo"]["requeues"]
        kube.set_pod_phase("colors-driver-0", "Running")
        kube.mark_stream_deleted("colors")
        try:
            await handler(registry, "stop")(**call)
        except Exception:  # noqa: BLE001 - kopf.TemporaryError: waiting for the driver
            pass
        kube.finish_deletions()
        await handler(registry, "stop")(**call)
        return dict(call["memo"]["requeues"])

    assert asyncio.run(asyncio.wait_for(scenario(), 20)) == {}
