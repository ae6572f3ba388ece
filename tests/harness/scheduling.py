"""What kube-scheduler (and a kubelet's admission) decide for the process kubelet's one node.

The node has the labels a kubelet registers (``kubernetes.io/hostname``, ``kubernetes.io/os``,
``kubernetes.io/arch``) plus those the harness is given, and no taints (so tolerations never matter). A Pod
*fits* it when its ``spec.nodeSelector`` matches those labels and its required node affinity
(``requiredDuringSchedulingIgnoredDuringExecution``: terms ORed, each term's ``matchExpressions`` and
``matchFields`` ANDed, operators ``In``/``NotIn``/``Exists``/``DoesNotExist``/``Gt``/``Lt``) selects the node.
Preferred affinity, Pod (anti-)affinity, topology spread and resources are not considered: there is one node.

A Pod that does not fit is not bound; it gets what kube-scheduler writes: phase ``Pending`` and the condition
``PodScheduled`` False, reason ``Unschedulable``, message ``0/1 nodes are available: 1 node(s) didn't match
Pod's node affinity/selector. preemption: ...``. A Pod created with this node's name that does not fit is
rejected as a kubelet's admission does: ``Failed``, reason ``NodeAffinity``.
"""
from __future__ import annotations

import platform

UNSCHEDULABLE = "Unschedulable"
UNSCHEDULABLE_MESSAGE = ("0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector. "
                         "preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling.")
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


def unschedulable_condition(now: str) -> dict:
    return {"type": "PodScheduled", "status": "False", "reason": UNSCHEDULABLE, "message": UNSCHEDULABLE_MESSAGE,
            "lastProbeTime": None, "lastTransitionTime": now}


def marked_unschedulable(pod: dict) -> bool:
    """The Pod already shows what this module would write (its selector cannot change: it stays so)."""
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == UNSCHEDULABLE
               and c.get("message") == UNSCHEDULABLE_MESSAGE
               for c in (pod.get("status") or {}).get("conditions") or [])
