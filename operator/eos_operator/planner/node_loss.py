"""A driver whose node is lost: its kubelet stopped posting (the Node's Ready condition Unknown or False). A Node
the API does not have is not lost here (``observed.node_view``: a cluster's Pod garbage collector deletes its
Pods). The Pod of a lost node stays as it was (Running, or Terminating forever once deleted: no kubelet confirms a
deletion), and its container may still run and write.
See docs/operations.md#node-loss and amendment A4 in docs/protocol-amendments.md.

The operator waits ``NODE_LOSS_GRACE_SECONDS`` from the Ready condition's transition (a kubelet restart or a
short network cut heals in that time), saying so (event ``DriverNodeNotReady``, Ready False). Then it deletes the
old Pod (it stays Terminating until the kubelet returns and stops it) and starts a replacement through the
restart strategy (a failure, event ``DriverNodeLost``) without waiting for the old Pod to go: the resolution
before it fences the stream's driver id and every slot id, and the new driver stamps its epoch on every slot, so
the old driver, if it still runs, fails at its next write (a batch record or a slot's) and stops itself
(``Superseded``). The new Pod lands on another node: the lost one is tainted unreachable (NoSchedule).
"""
from __future__ import annotations

from eos_job.spec import ExactlyOnceStreamSpec

from ..actions import Plan
from ..conditions import READY, get_condition
from ..observed import NodeView, Observed, PodView
from ..timeutil import parse, seconds_between
from .restarts import driver_failed
from .step import StreamStep, degraded, stop_pods

# Seconds a driver's node stays NotReady before the driver is replaced on another node. On top of the node
# lifecycle controller's own grace (a cluster's --node-monitor-grace-period, 50 s by default; 20 s in the local
# stack): a kubelet restart is over by then.
NODE_LOSS_GRACE_SECONDS = 30.0
NOT_READY = "DriverNodeNotReady"
LOST = "DriverNodeLost"


def lost_node(obs: Observed, pod: PodView | None) -> NodeView | None:
    """The lost Node of a Pod that has not ended, or None (its node is Ready, or was not read)."""
    if pod is None or pod.terminal:
        return None
    node = obs.node(pod.node)
    return node if node is not None and node.lost else None


def seconds_lost(obs: Observed, node: NodeView) -> float:
    """How long the Node has been lost: since its Ready condition left True; one whose condition has no time
    counts as lost for good."""
    since = parse(node.since) if node.since else None
    return seconds_between(since, obs.now) if since is not None else float("inf")


def replaceable(obs: Observed, pod: PodView) -> bool:
    """A Pod on a node lost for the whole grace: a new driver may start while it still exists."""
    node = lost_node(obs, pod)
    return node is not None and seconds_lost(obs, node) >= NODE_LOSS_GRACE_SECONDS


def describe(node: NodeView) -> str:
    return (f"node {node.name} is not Ready (Ready {node.ready}" + (f", {node.reason}" if node.reason else "")
            + (f", since {node.since}" if node.since else "") + ")")


def driver_node_lost(step: StreamStep, spec: ExactlyOnceStreamSpec) -> Plan:
    st, obs = step.st, step.obs
    pod = obs.pod(st.driver_pod)
    node = lost_node(obs, pod)
    waited = seconds_lost(obs, node)
    text = f"driver Pod {pod.name}'s {describe(node)}"
    if waited < NODE_LOSS_GRACE_SECONDS:
        left = NODE_LOSS_GRACE_SECONDS - waited
        message = (f"{text}: if it is still so in {left:.0f}s a new driver starts on another node (the old one, "
                   "if it still runs, is fenced by the new driver's epoch)")
        ready = get_condition(st.conditions, READY)
        if ready is None or ready.reason != NOT_READY:
            step.event("Warning", NOT_READY, message)
        step.conditions(("False", NOT_READY, message), ("True", NOT_READY, message), degraded(st))
        return step.done(requeue_after=max(left, 0.1))
    # Deleted first: the Pod stays Terminating until the node's kubelet returns and stops its containers.
    stop_pods(step, [pod])
    return driver_failed(step, spec, f"{text} for {waited:.0f}s: the driver may still run there; replaced on "
                                     "another node without waiting for the Pod to go (resolution fences the "
                                     "old driver's transactional ids: it stops Superseded at its next write)",
                         failed_reason=LOST)
