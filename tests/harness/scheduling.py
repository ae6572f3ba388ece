"""What kube-scheduler (and a kubelet's admission) decide for the process kubelet's one node.

The node has the labels a kubelet registers (``kubernetes.io/hostname``, ``kubernetes.io/os``,
``kubernetes.io/arch``) plus those the harness is given, and no taints (so tolerations never matter). A Pod
*fits* it when its ``spec.nodeSelector`` matches those labels and its required node affinity
(``requiredDuringSchedulingIgnoredDuringExecution``: terms ORed, each term's ``matchExpressions`` and
``matchFields`` ANDed, operators ``In``/``NotIn``/``Exists``/``DoesNotExist``/``Gt``/``Lt``) selects the node.
Preferred affinity, Pod (anti-)affinity, topology spread and resources are not considered: there is one node.

Its ``persistentVolumeClaim`` volumes are checked as the VolumeBinding plugin does (``unschedulable``): first
(PreFilter) each claim of the Pod's namespace must exist, not be ``Lost`` nor being deleted, and be bound
(``spec.volumeName`` and the ``pv.kubernetes.io/bind-completed`` annotation the PV controller writes); then,
after the node affinity (Filter), each bound claim's PersistentVolume must exist and its ``nodeAffinity``
select the node. Every unbound claim counts as one of Immediate binding (a StorageClass's
``WaitForFirstConsumer`` is not modelled); ``ephemeral`` volumes are not either.

A Pod that does not fit is not bound; it gets what kube-scheduler writes: phase ``Pending`` and the condition
``PodScheduled`` False, reason ``Unschedulable``, message ``0/1 nodes are available: REASON. preemption: 0/1
nodes are available: 1 Preemption is not helpful for scheduling.`` with REASON ``1 node(s) didn't match Pod's
node affinity/selector``, ``persistentvolumeclaim "NAME" not found``, ``pod has unbound immediate
PersistentVolumeClaims``... (kube-scheduler v1.35's words). A claim can change: the kubelet checks such Pods
again, as kube-scheduler retries on claim events. A Pod created with this node's name that does not fit is
rejected as a kubelet's admission does: ``Failed``, reason ``NodeAffinity`` (claims are the kubelet's volume
manager's business then: see ``pod_setup``).
"""
from __future__ import annotations

import platform
from typing import Callable

UNSCHEDULABLE = "Unschedulable"
# Every reason here is UnschedulableAndUnresolvable: preemption cannot help.
NOT_HELPFUL = "preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."


def unschedulable_message(reason: str) -> str:
    """kube-scheduler's FitError for the one node, with its PostFilter (preemption) message."""
    return f"0/1 nodes are available: {reason}. {NOT_HELPFUL}"


UNSCHEDULABLE_MESSAGE = unschedulable_message("1 node(s) didn't match Pod's node affinity/selector")
UNBOUND_MESSAGE = unschedulable_message("pod has unbound immediate PersistentVolumeClaims")
BIND_COMPLETED = "pv.kubernetes.io/bind-completed"
REJECTED_REASON = "NodeAffinity"
REJECTED_MESSAGE = "Pod was rejected: Predicate NodeAffinity failed"
ARCHES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def node_labels(node_name: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The labels a kubelet gives its Node, with ``extra`` merged in (later wins)."""
    labels = {"kubernetes.io/hostname": node_name, "kubernetes.io/os": "linux",
              "kubernetes.io/arch": ARCHES.get(platform.machine().lower(), "amd64")}
    labels.update(extra or {})
    return labels


def fits(pod: dict, labels: dict[str, str], node_name: str) -> bool:
    """Does the Pod's nodeSelector and required node affinity select this node?"""
    spec = pod.get("spec") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if not required:
        return True
    fields = {"metadata.name": node_name}
    return any(_term(t, labels, fields) for t in required.get("nodeSelectorTerms") or [])


def claim_names(pod: dict) -> list[str]:
    return [v["persistentVolumeClaim"].get("claimName", "") for v in (pod.get("spec") or {}).get("volumes") or []
            if "persistentVolumeClaim" in v]


def unschedulable(pod: dict, labels: dict[str, str], node_name: str, read_claim: Callable[[str, str], dict | None],
                  read_volume: Callable[[str], dict | None]) -> str | None:
    """The message kube-scheduler writes for a Pod it cannot bind to this node, or None: the Pod fits.
    ``read_claim(namespace, name)`` and ``read_volume(name)`` return the object, None if it does not exist."""
    ns = pod["metadata"]["namespace"]
    claims = []
    for name in claim_names(pod):   # PreFilter, VolumeBinding's podHasPVCs
        pvc = read_claim(ns, name)
        if pvc is None:
            return unschedulable_message(f'persistentvolumeclaim "{name}" not found')
        if (pvc.get("status") or {}).get("phase") == "Lost":
            return unschedulable_message(f'persistentvolumeclaim "{name}" bound to non-existent persistentvolume '
                                         f'"{(pvc.get("spec") or {}).get("volumeName", "")}"')
        if pvc["metadata"].get("deletionTimestamp"):
            return unschedulable_message(f'persistentvolumeclaim "{name}" is being deleted')
        claims.append(pvc)
    if any(not (pvc.get("spec") or {}).get("volumeName") or BIND_COMPLETED not in
           (pvc["metadata"].get("annotations") or {}) for pvc in claims):
        return UNBOUND_MESSAGE
    if not fits(pod, labels, node_name):   # Filter: NodeAffinity comes before VolumeBinding
        return UNSCHEDULABLE_MESSAGE
    for pvc in claims:   # Filter, VolumeBinding's checkBoundClaims
        pv = read_volume(pvc["spec"]["volumeName"])
        if pv is None:
            return unschedulable_message("1 node(s) unavailable due to one or more pvc(s) bound to non-existent "
                                         "pv(s)")
        required = (((pv.get("spec") or {}).get("nodeAffinity") or {}).get("required") or {})
        # A volume's node affinity is matched against the node's labels only (no matchFields).
        if required and not any(_term(t, labels, {}) for t in required.get("nodeSelectorTerms") or []):
            return unschedulable_message("1 node(s) didn't match PersistentVolume's node affinity")
    return None


def _term(term: dict, labels: dict[str, str], fields: dict[str, str]) -> bool:
    exprs, field_exprs = term.get("matchExpressions") or [], term.get("matchFields") or []
    if not exprs and not field_exprs:
        return False   # an empty term selects no node
    return all(_expr(e, labels) for e in exprs) and all(_expr(e, fields) for e in field_exprs)


def _expr(expr: dict, values: dict[str, str]) -> bool:
    op, key, wanted = expr.get("operator"), expr.get("key", ""), expr.get("values") or []
    have = values.get(key)
    if op == "In":
        return have is not None and have in wanted
    if op == "NotIn":
        return have is None or have not in wanted
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    if op in ("Gt", "Lt"):
        try:
            a, b = int(have), int(wanted[0])
        except (TypeError, ValueError, IndexError):
            return False
        return a > b if op == "Gt" else a < b
    return False


def unschedulable_condition(now: str, message: str = UNSCHEDULABLE_MESSAGE) -> dict:
    return {"type": "PodScheduled", "status": "False", "reason": UNSCHEDULABLE, "message": message,
            "lastProbeTime": None, "lastTransitionTime": now}


def marked_unschedulable(pod: dict, message: str = UNSCHEDULABLE_MESSAGE) -> bool:
    """The Pod already shows what this module would write (written once per distinct message)."""
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == UNSCHEDULABLE
               and c.get("message") == message
               for c in (pod.get("status") or {}).get("conditions") or [])
