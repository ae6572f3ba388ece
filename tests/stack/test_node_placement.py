"""The real nodes and the process kubelet share the API server and keep out of each other's way, both
directions (stack/eos_stack/node.py, node_config.placement): so the real-node tests run beside the others.

- A Pod of the default scheduler (what the operator creates, what the process kubelet binds) is never taken by
  the real kube-scheduler, whose one profile has a name of its own.
- A Pod that names the real scheduler is never bound by the process kubelet, even one whose node selector
  only the process kubelet's node matches (the real scheduler then reports it unschedulable).
- A Pod that names the real scheduler but does not tolerate the real nodes' taint is not placed on them.

No test waits for something not to happen: each uses a later Pod as the barrier. The process kubelet handles
its watch's events in order, so a Pod created after another and bound by it means it saw the earlier one; the
scheduler takes Pods of one priority oldest first, so a Pod it bound means it has tried the older ones.
"""
from __future__ import annotations

import pytest
from kubernetes import client

from eos_stack.node_config import SCHEDULER_NAME, TAINT
from tests.harness.kubelet import ProcessKubelet
from tests.harness.real_nodes import finished, real_pod, wait_pod

pytestmark = pytest.mark.timeout(600)

STANDIN_LABEL = {"eos.test/standin-only": "yes"}


def scheduled(pod) -> bool:
    return bool(pod.spec.node_name)


def unschedulable(pod) -> bool:
    return any(c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
               for c in pod.status.conditions or [])


def test_a_default_scheduler_pod_is_not_taken_by_the_real_scheduler(api, nodes, restricted_ns, stack_env, tmp_path):
    v1 = client.CoreV1Api(api)
    ns = restricted_ns
    standin_pod = real_pod("for-standin", ["python", "-c", "print('ran')"], on_real_nodes=False)
    assert "schedulerName" not in standin_pod["spec"]      # the default scheduler's, as the operator's Pods
    v1.create_namespaced_pod(ns, standin_pod)
    v1.create_namespaced_pod(ns, real_pod("barrier", ["true"]))
    barrier = wait_pod(v1, ns, "barrier", finished, "the real-node barrier Pod to finish")
    assert barrier.spec.node_name in {n.name for n in nodes} and barrier.status.phase == "Succeeded", barrier.status
    left = v1.read_namespaced_pod("for-standin", ns)
    assert left.spec.node_name is None, f"the real scheduler took a default-scheduler Pod: {left.spec.node_name}"
    assert not [c for c in left.status.conditions or [] if c.type == "PodScheduled"], left.status.conditions
    # And it is the process kubelet's: one started now binds and runs it.
    with ProcessKubelet(stack_env["KUBECONFIG"], namespace=ns, log_dir=tmp_path / "pods"):
        ran = wait_pod(v1, ns, "for-standin", finished, "the process kubelet to run the default-scheduler Pod")
    assert ran.status.phase == "Succeeded" and ran.spec.node_name not in {n.name for n in nodes}, ran.status


def test_a_real_node_pod_is_not_bound_by_the_process_kubelet(api, nodes, restricted_ns, stack_env, tmp_path):
    v1 = client.CoreV1Api(api)
    ns = restricted_ns
    with ProcessKubelet(stack_env["KUBECONFIG"], namespace=ns, log_dir=tmp_path / "pods",
                        node_labels=STANDIN_LABEL):
        # Only the process kubelet's node matches the selector: if it bound Pods of other schedulers, it would
        # bind this one.
        v1.create_namespaced_pod(ns, real_pod("real-only", ["true"], nodeSelector=STANDIN_LABEL))
        real = real_pod("real", ["python", "-c", "print('on a real node')"])
        v1.create_namespaced_pod(ns, real)
        v1.create_namespaced_pod(ns, real_pod("standin-barrier", ["true"], on_real_nodes=False))
        wait_pod(v1, ns, "standin-barrier", scheduled, "the process kubelet to bind its barrier Pod")
        done = wait_pod(v1, ns, "real", finished, "the real-node Pod to finish")
        stuck = wait_pod(v1, ns, "real-only", unschedulable, "the real scheduler to find no node for real-only")
    assert done.spec.scheduler_name == SCHEDULER_NAME
    assert done.spec.node_name in {n.name for n in nodes} and done.status.phase == "Succeeded", done.status
    assert stuck.spec.node_name is None, stuck.spec.node_name
    message = next(c.message for c in stuck.status.conditions if c.type == "PodScheduled")
    assert f"0/{len(nodes)} nodes are available: {len(nodes)} node(s) didn't match Pod's node affinity/selector" \
        in message, message


def test_a_pod_without_the_toleration_stays_off_the_real_nodes(api, nodes, restricted_ns):
    v1 = client.CoreV1Api(api)
    ns = restricted_ns
    bare = real_pod("untolerated", ["true"], schedulerName=SCHEDULER_NAME)
    bare["spec"]["tolerations"] = []
    v1.create_namespaced_pod(ns, bare)
    stuck = wait_pod(v1, ns, "untolerated", unschedulable, "the real scheduler to refuse the untolerated Pod")
    message = next(c.message for c in stuck.status.conditions if c.type == "PodScheduled")
    assert stuck.spec.node_name is None
    assert f"0/{len(nodes)} nodes are available: {len(nodes)} node(s) had untolerated taint(s)" in message, message
    # The taint is what kept it off: the nodes carry it (and the same Pod with the toleration runs, test above).
    tainted = [n.metadata.name for n in v1.list_node().items
               if any(t.key == TAINT["key"] and t.effect == "NoSchedule" for t in n.spec.taints or [])]
    assert sorted(tainted) >= sorted(n.name for n in nodes), tainted
