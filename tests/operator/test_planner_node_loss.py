"""A driver whose node is lost (planner/node_loss.py): the operator waits NODE_LOSS_GRACE_SECONDS, saying so, then
replaces the driver on another node without waiting for the old Pod to go (the epoch fence makes that safe); a
Pod whose node is Ready, or whose node could not be read, is waited for as before (the negative controls)."""
from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta
from types import SimpleNamespace

import pytest

from eos_operator.actions import DeletePod, Resolve
from eos_operator.children import TERMINATION_GRACE_SECONDS
from eos_operator.kube_errors import KubeError
from eos_operator.observed import NodeView, node_view, pod_view
from eos_operator.planner import plan
from eos_operator.planner.node_loss import LOST, NODE_LOSS_GRACE_SECONDS, NOT_READY
from eos_operator.reconciler import _unwell_pods_nodes
from eos_operator.timeutil import fmt, parse

from .fakes import T0, FakeKube
from .test_planner import cond, observed, pod, reasons, running_status, spec

pytestmark = pytest.mark.unit

LOST_AT = fmt(T0 + timedelta(seconds=10))      # the Node's Ready condition turned Unknown then


def unknown(name: str = "node-a", since: str = LOST_AT) -> NodeView:
    return NodeView(name, ready="Unknown", since=since, reason="NodeStatusUnknown")


def on_node(name: str = "colors-driver-0", node: str = "node-a", **kw):
    return pod(name, "Running", node=node, not_ready=True, **kw)


def seen(*pods, nodes=(), at: float = 0.0):
    return replace(observed(*pods, at=at), nodes=tuple(nodes))


def test_pod_and_node_views_read_what_the_node_lifecycle_controller_writes():
    raw = {"metadata": {"name": "d-0"}, "spec": {"nodeName": "node-a"},
           "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}}
    assert pod_view(raw).not_ready and pod_view(raw).node == "node-a"
    raw["status"]["conditions"][0]["status"] = "True"
    assert not pod_view(raw).not_ready
    node = {"status": {"conditions": [{"type": "MemoryPressure", "status": "Unknown"},
                                      {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
                                       "lastTransitionTime": LOST_AT}]}}
    assert node_view("node-a", node) == unknown()
    assert node_view("node-a", None) is None      # no Node object: not read as lost
    node["status"]["conditions"][1].update(status="True")
    assert not node_view("node-a", node).lost


def test_within_the_grace_the_operator_says_so_once_and_waits():
    s = spec()
    st = running_status(s)
    first = plan(s, st, seen(on_node(), nodes=[unknown()], at=20))
    assert first.actions == [] and first.status.pending_launch is None and first.status.restart_count == 0
    assert reasons(first) == [NOT_READY] and "node-a" in first.events[0].message
    assert cond(first, "Ready").reason == NOT_READY and cond(first, "Ready").status == "False"
    assert first.requeue_after == pytest.approx(NODE_LOSS_GRACE_SECONDS - 10)
    again = plan(s, first.status, seen(on_node(), nodes=[unknown()], at=25))
    assert reasons(again) == [] and again.actions == []
    # Back before the grace ran out: running again, nothing replaced.
    back = plan(s, again.status, seen(pod("colors-driver-0", "Running", node="node-a"), at=30))
    assert back.status.lifecycle_state == "Running" and cond(back, "Ready").reason == "Running"
    assert back.status.pending_launch is None


def test_past_the_grace_a_replacement_starts_while_the_old_pod_is_still_there():
    s = spec()
    st = running_status(s)
    at = 10 + NODE_LOSS_GRACE_SECONDS
    lost = plan(s, st, seen(on_node(), nodes=[unknown()], at=at))
    assert lost.actions == [DeletePod("colors-driver-0", TERMINATION_GRACE_SECONDS)]
    assert LOST in reasons(lost) and "node-a" in lost.events[reasons(lost).index(LOST)].message
    assert lost.status.restart_count == 1 and lost.status.pending_launch.pod == "colors-driver-1"
    # The restart strategy's delay passes; the old Pod is Terminating for good (no kubelet confirms it): the
    # launch does not wait for it, it resolves (fencing every slot) and goes on.
    old = on_node(deleting=True, deleting_since=fmt(T0 + timedelta(seconds=at)))
    after_delay = (parse(lost.status.pending_launch.not_before) - T0).total_seconds() + 1
    launch = plan(s, lost.status, seen(old, nodes=[unknown()], at=after_delay))
    assert [type(a) for a in launch.actions] == [Resolve], launch.actions
    assert cond(launch, "Progressing").reason == "Resolving"


def test_a_node_whose_condition_has_no_time_is_lost_for_good():
    s = spec()
    p = plan(s, running_status(s), seen(on_node(deleting=True), nodes=[NodeView("node-a", ready="Unknown")], at=1))
    assert LOST in reasons(p) and p.status.pending_launch is not None


def test_negative_control_a_terminating_driver_on_a_ready_node_is_waited_for():
    s = spec()
    st = running_status(s)
    at = 10 + NODE_LOSS_GRACE_SECONDS
    lost = plan(s, st, seen(on_node(), nodes=[unknown()], at=at))
    old = on_node(deleting=True)
    # The same launch, the old Pod's node Ready again (or its node never read): the launch waits for it to go.
    for nodes in ([NodeView("node-a")], []):
        waits = plan(s, lost.status, seen(old, nodes=nodes, at=at + 500))
        assert waits.actions == [] and cond(waits, "Progressing").reason == "StoppingDriver", (nodes, waits)
    # Without the node's state the operator never replaces a Terminating driver (DRIVER_TERMINATING).
    blind = plan(s, st, seen(old, at=at + 500))
    assert blind.actions == [] and blind.status.pending_launch is None
    assert cond(blind, "Progressing").reason == "DriverTerminating"


def test_nodes_are_read_only_for_driver_pods_that_look_unwell_and_a_refusal_leaves_them_out():
    kube = FakeKube()
    kube.nodes["node-a"] = {"status": {"conditions": [{"type": "Ready", "status": "Unknown",
                                                       "lastTransitionTime": LOST_AT}]}}
    deps = SimpleNamespace(kube=kube)
    well = pod("colors-driver-0", "Running", node="node-b")
    assert asyncio.run(_unwell_pods_nodes(deps, (well,))) == () and kube.node_reads == []
    got = asyncio.run(_unwell_pods_nodes(deps, (well, on_node("colors-driver-1"))))
    assert got == (NodeView("node-a", ready="Unknown", since=LOST_AT),) and kube.node_reads == ["node-a"]

    # A node name with no Node object (a deleted Node, whose Pods a cluster's garbage collector deletes): left out,
    # so its Terminating driver is waited for as before.
    assert asyncio.run(_unwell_pods_nodes(deps, (on_node("colors-driver-2", node="deleted-node"),))) == ()
    assert kube.node_reads[-1] == "deleted-node"

    async def refused(name):
        raise KubeError(403, "nodes is forbidden")
    kube.get_node = refused
    assert asyncio.run(_unwell_pods_nodes(deps, (on_node(),))) == ()
