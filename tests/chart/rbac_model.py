"""What the operator asks of the Kubernetes API, as RBAC sees it.

``OPERATOR_CALLS`` is the list the chart's rules (templates/_rbac.tpl) must grant,
and nothing more. The part made by ``eos_operator.adapters.KubernetesApi`` is
checked against the adapter's real requests (test_rbac.py records them); the part
made by kopf comes from kopf's code as handlers.py configures it (standalone, no
peering, progress and diff-base in annotations, its own event posting off).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

GROUP = "streaming.eos.dev"
PLURAL = "exactlyoncestreams"
SNAPSHOTS = "exactlyoncesnapshots"


@dataclass(frozen=True)
class Call:
    verb: str
    group: str
    resource: str
    subresource: str = ""
    cluster_scoped: bool = False

    @property
    def kubectl_resource(self) -> str:
        """The resource as `kubectl auth can-i` spells it."""
        return f"{self.resource}.{self.group}" if self.group else self.resource

    def __str__(self) -> str:
        sub = f"/{self.subresource}" if self.subresource else ""
        return f"{self.verb} {self.kubectl_resource}{sub}"


# (call, who makes it). Namespaced unless cluster_scoped.
ADAPTER_CALLS: dict[Call, str] = {
    Call("get", GROUP, PLURAL): "informer.get_stream: a stream the watch has not shown yet, or after a stale patch",
    Call("list", GROUP, PLURAL): "informer: the streams' watch starts with a list (retention, every pass)",
    Call("watch", GROUP, PLURAL): "informer: every pass reads its stream from the operator's own watch",
    Call("patch", GROUP, PLURAL, "status"): "adapters.patch_stream_status: the status is the write-ahead log",
    Call("list", "", "pods"): "informer: the operator's Pods' watch starts with a list (and a Pod by name on 409)",
    Call("watch", "", "pods"): "informer: the operator's Pods (label managed-by), watched instead of listed per pass",
    Call("create", "", "pods"): "adapters.create_pod: start a driver",
    Call("delete", "", "pods"): "adapters.delete_pod: stop a driver (graceful)",
    Call("create", "", "configmaps"): "adapters.apply_config_map: the run ConfigMap",
    Call("get", "", "configmaps"): "adapters.apply_config_map: on 409 read the current one",
    Call("update", "", "configmaps"): "adapters.apply_config_map: on 409 replace it",
    Call("delete", "", "configmaps"): "adapters.delete_config_map",
    Call("create", "", "services"): "adapters.apply_service: headless driver Service (cluster deploy mode), the "
                                   "Spark UI Service (job.metrics.uiService)",
    Call("get", "", "services"): "adapters.apply_service: on 409 read the current one; adapters.get_service: the "
                                 "Spark UI Service, read by name each pass while the option is on (no list, no watch)",
    Call("update", "", "services"): "adapters.apply_service: on 409 replace it",
    Call("delete", "", "services"): "adapters.delete_service",
    Call("create", "", "events"): "adapters.post_event",
    Call("patch", "", "events"): "adapters.post_event: the same event again counts on the first (events.py)",
    Call("list", GROUP, SNAPSHOTS): "informer: the snapshots' watch starts with a list (a stream's, by label)",
    Call("watch", GROUP, SNAPSHOTS): "informer: snapshots read from the operator's own watch",
    Call("get", GROUP, SNAPSHOTS): "informer.get_snapshot: one the watch has not shown yet, or after a stale patch",
    Call("create", GROUP, SNAPSHOTS): "adapters.create_snapshot: periodic, nonce and upgrade snapshots",
    Call("delete", GROUP, SNAPSHOTS): "adapters.delete_snapshot: retention (maxCount, maxAgeSeconds)",
    Call("patch", GROUP, SNAPSHOTS, "status"): "adapters.patch_snapshot_status: the snapshot's write-ahead log",
    Call("get", "", "secrets"): "adapters.secret_value: the S3 keys and Kafka credentials a stream names, by name "
                                "in its namespace (rbac.secretNamespaces in a cluster-wide install)",
    Call("get", "", "nodes", cluster_scoped=True): "kube_api.get_node: the Node of a driver Pod that looks unwell "
                                                   "(node loss; cluster-wide installs only, by name)",
}
KOPF_CALLS: dict[Call, str] = {
    Call("list", GROUP, PLURAL): "kopf: the watch stream starts with a list",
    Call("watch", GROUP, PLURAL): "kopf: the watch stream",
    Call("patch", GROUP, PLURAL): "kopf: finalizer and annotation-stored progress/diff-base",
    # Owner references with blockOwnerDeletion on every child: required by clusters with
    # the OwnerReferencesPermissionEnforcement admission plugin (not enabled locally).
    Call("update", GROUP, PLURAL, "finalizers"): "children: ownerReferences.blockOwnerDeletion",
    Call("list", GROUP, SNAPSHOTS): "kopf: the snapshots' watch stream starts with a list",
    Call("watch", GROUP, SNAPSHOTS): "kopf: the snapshots' watch stream",
    Call("patch", GROUP, SNAPSHOTS): "kopf: the snapshots' finalizer (disposal) and annotation-stored progress",
}
# Cluster-wide installs only: kopf's resource observer watches CRDs (read-only).
KOPF_CLUSTER_CALLS: dict[Call, str] = {
    Call("list", "apiextensions.k8s.io", "customresourcedefinitions", cluster_scoped=True):
        "kopf: resource observer (initial list)",
    Call("watch", "apiextensions.k8s.io", "customresourcedefinitions", cluster_scoped=True):
        "kopf: resource observer (CRD changes)",
}

# Leader election (leader.LeaderElector), in the operator's own namespace only (a Role there).
LEASE_CALLS: dict[Call, str] = {
    Call("get", "coordination.k8s.io", "leases"): "leader: every replica reads the Lease every second",
    Call("create", "coordination.k8s.io", "leases"): "leader: the first replica ever creates it",
    Call("update", "coordination.k8s.io", "leases"): "leader: renew, release, or take an expired Lease over",
}

NAMESPACED_CALLS = sorted({c for c in (*ADAPTER_CALLS, *KOPF_CALLS) if not c.cluster_scoped}, key=str)
CLUSTER_CALLS = sorted({*KOPF_CLUSTER_CALLS, *(c for c in ADAPTER_CALLS if c.cluster_scoped)}, key=str)
ALL_CALLS = NAMESPACED_CALLS + CLUSTER_CALLS
# Granted per namespace (watched, or listed in rbac.secretNamespaces), cluster-wide only as an opt-in.
SECRET_CALLS = [Call("get", "", "secrets")]

# Things the operator never does: its identity must be refused each of them.
FORBIDDEN = [
    Call("list", "", "secrets"), Call("watch", "", "secrets"), Call("create", "", "secrets"),
    Call("get", "", "pods"), Call("patch", "", "pods"), Call("update", "", "pods"),
    Call("create", "", "pods", "exec"), Call("get", "", "pods", "log"), Call("deletecollection", "", "pods"),
    Call("list", "", "configmaps"), Call("patch", "", "configmaps"),
    Call("list", "", "services"), Call("patch", "", "services"),
    Call("update", "", "events"), Call("delete", "", "events"),
    Call("create", GROUP, PLURAL), Call("update", GROUP, PLURAL), Call("delete", GROUP, PLURAL),
    Call("update", GROUP, PLURAL, "status"),
    # Snapshot Pods' owner references say blockOwnerDeletion: false (snapshots.SnapshotRef), so no
    # permission on the snapshots' finalizers subresource; a snapshot is never changed but by its status.
    Call("update", GROUP, SNAPSHOTS), Call("update", GROUP, SNAPSHOTS, "status"),
    Call("update", GROUP, SNAPSHOTS, "finalizers"), Call("deletecollection", GROUP, SNAPSHOTS),
    Call("create", "", "serviceaccounts", "token"), Call("create", "", "persistentvolumeclaims"),
    Call("create", "apps", "deployments"), Call("create", "rbac.authorization.k8s.io", "rolebindings"),
    Call("list", "", "namespaces", cluster_scoped=True),
    Call("create", "apiextensions.k8s.io", "customresourcedefinitions", cluster_scoped=True),
    Call("get", "apiextensions.k8s.io", "customresourcedefinitions", cluster_scoped=True),
    Call("list", "kopf.dev", "clusterkopfpeerings", cluster_scoped=True),
    Call("list", "", "nodes", cluster_scoped=True),
    Call("list", "coordination.k8s.io", "leases"), Call("watch", "coordination.k8s.io", "leases"),
    Call("delete", "coordination.k8s.io", "leases"), Call("patch", "coordination.k8s.io", "leases"),
]

_PATH = re.compile(r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
                   r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<resource>[^/]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?$")


def call_of_request(method: str, url: str) -> Call:
    """The RBAC verb and resource of one REST request (the API server's own mapping); cluster-scoped without
    a namespace in its path."""
    parts = urlsplit(url)
    m = _PATH.match(parts.path)
    if not m:
        raise ValueError(f"not a resource path: {url}")
    named = m["name"] is not None
    watch = parse_qs(parts.query).get("watch", ["false"])[0] in ("true", "1")
    verb = {"GET": ("get" if named else ("watch" if watch else "list")),
            "POST": "create", "PUT": "update", "PATCH": "patch",
            "DELETE": ("delete" if named else "deletecollection")}[method.upper()]
    return Call(verb, m["group"] or "", m["resource"], m["sub"] or "", cluster_scoped=m["ns"] is None)


# ------------------------------------------------------- refusals in an operator's log
# The operator runs --namespace NS, so the chart grants nothing cluster-wide. kopf still
# tries to list/watch namespaces (to expand globs) and CRDs (to notice a CRD change), retries
# each refusal for about a minute, then falls back to the exact names and the resources it
# discovered at start. Those two cluster-scoped requests are the only refusals allowed.
# (Setting kopf's settings.scanning.disabled in the operator for exact names would skip them.)
KOPF_SCANNING = ("/api/v1/namespaces", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions")
KOPF_FALLBACKS = ("Not enough permissions to list namespaces", "Not enough permissions to watch for namespaces",
                  "Not enough permissions to watch for resources")
_REQUEST = re.compile(r"\b(GET|POST|PUT|PATCH|DELETE) https?://[^/\s]+(/[^?\s]*)")
# A refusal says "forbidden" (the API's Status reason and message) or "permission", or
# carries the status code 403: as a number of its own, not the milliseconds of a log
# line's timestamp ("17:37:46,403") nor a duration ("in 403 ms").
_REFUSAL = re.compile(r"forbidden|permission|(?<![\d,.:])403(?!\d|\s*ms\b)", re.IGNORECASE)


def refused_requests(log: str) -> list[str]:
    """Log lines of refused requests, except kopf's cluster-scoped scanning and its fallbacks."""
    refused = []
    for line in log.splitlines():
        if not _REFUSAL.search(line):
            continue
        request = _REQUEST.search(line)
        if any(ok in line for ok in KOPF_FALLBACKS) or (
                request and request[1] == "GET" and request[2] in KOPF_SCANNING):
            continue
        refused.append(line)
    return refused
