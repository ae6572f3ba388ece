"""Cluster deploy mode: the driver waits for its first executor, and says why when none comes.

Spark's Kubernetes scheduler creates executor Pods and, when the API server refuses (the driver's
ServiceAccount may not create Pods) or the Pods never start, retries for ever while the query waits for
resources: a stream that never commits and says nothing. So before its query starts, a cluster-mode driver
waits up to ``job.executor.startTimeoutSeconds`` for an executor to register and otherwise fails with the
reason: it asks the API server, with its own token, whether it may create Pods (a SelfSubjectAccessReview,
which every authenticated identity may make), so a missing RBAC rule is named as such. The operator puts
the message in the stream's status and applies its restart strategy.
"""
from __future__ import annotations

import json
import logging
import os
import ssl
import time
import urllib.request
from pathlib import Path

from .contract import JobFailed

log = logging.getLogger(__name__)

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def registered_executors(spark) -> int:
    """Executors registered with the driver (the block manager list holds the driver too)."""
    return max(0, spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1)


def wait_for_executors(spark, timeout_s: float, *, poll_s: float = 1.0) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        n = registered_executors(spark)
        if n > 0:
            log.info("%d executor(s) registered", n)
            return n
        if time.monotonic() > deadline:
            raise JobFailed(_why_no_executor(timeout_s))
        time.sleep(poll_s)


def may_create_pods(sa_dir: Path = SA_DIR, env=os.environ) -> tuple[bool | None, str]:
    """(allowed, identity) by a SelfSubjectAccessReview for ``create pods`` in the Pod's namespace; allowed is
    None when the question cannot be asked (no token mounted, API server unreachable)."""
    try:
        token = (sa_dir / "token").read_text().strip()
        namespace = (sa_dir / "namespace").read_text().strip()
        host, port = env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]
    except (OSError, KeyError) as exc:
        return None, f"(no ServiceAccount token: {exc})"
    body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"namespace": namespace, "verb": "create", "resource": "pods"}}}
    req = urllib.request.Request(f"https://{host}:{port}/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                                 data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    ctx = ssl.create_default_context(cafile=str(sa_dir / "ca.crt"))
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
            status = json.loads(resp.read()).get("status") or {}
    except (OSError, ValueError) as exc:
        return None, f"(the API server did not answer: {exc})"
    sa = env.get("EOS_SERVICE_ACCOUNT") or "the driver's ServiceAccount"
    return bool(status.get("allowed")), f"{namespace}/{sa}"


def start_failure(exc: BaseException) -> JobFailed:
    """Spark's session did not start in cluster mode (its first executor request may fail it): the reason."""
    allowed, who = may_create_pods()
    if allowed is False:
        return JobFailed(_forbidden("deployMode cluster: Spark could not start its executors", who))
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    return JobFailed(f"deployMode cluster: Spark could not start: {first[:500]}")


def _forbidden(head: str, who: str) -> str:
    return (f"{head}: {who} may not create pods (RBAC forbids it), so Spark cannot start executors. Bind it "
            "the rules of the chart's jobRbac (pods, configmaps, services, persistentvolumeclaims) and set "
            "job.serviceAccountName to it")


def _why_no_executor(timeout_s: float) -> str:
    allowed, who = may_create_pods()
    head = f"deployMode cluster: no executor registered within {timeout_s:.0f}s"
    if allowed is False:
        return _forbidden(head, who)
    return (f"{head} although the driver may create pods {who if allowed is None else ''}. Look at the executor "
            "Pods (label spark-role=executor and the stream's label): their events say why they do not start "
            "(image, resources, scheduling)")
