"""Pods for the real nodes (stack/eos_stack/node.py): ``restricted`` Pods of the project's image that ask for
the real nodes (their scheduler and the toleration of their taint, ``node_config.placement()``), the same as a
stream's ``job.podTemplate`` (``stream_template``), waiting for a Pod's state with its events in the failure
message, and a Pod's (or one container's) processes seen through its cgroup.
"""
from __future__ import annotations

import base64
import os
import signal
import threading
import time
from pathlib import Path

from eos_stack.common import Stack
from eos_stack.image_common import image_under_test
from eos_stack.registry import image_ref
from eos_stack.node_config import placement

UID = 10001
RESTRICTED = {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SC = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
RESTRICTED_LABELS = {"pod-security.kubernetes.io/enforce": "restricted",
                     "pod-security.kubernetes.io/enforce-version": "latest"}


def node_image() -> str:
    """The project's image as Pods on the real nodes name it: in the stack's registry (``EOS_NODE_IMAGE``, pushed
    and pulled into each node by ``eos_stack up node``). ``EOS_TEST_IMAGE`` names another build (pushed with
    ``make image EOS_IMAGE_TAG=...``): a stream's Pods pull it (``IfNotPresent``); ``real_pod``'s ``Never`` needs
    it in each node already."""
    return image_ref(Stack(), image_under_test())


def real_pod(name: str, command: list[str], *, memory: str | None = None, node_name: str | None = None,
             grace: int = 30, env: dict[str, str] | None = None, on_real_nodes: bool = True, **spec) -> dict:
    """A ``restricted`` Pod of the project's image (``imagePullPolicy: Never``: pulled into each node) that
    runs ``command``; ``spec`` adds Pod spec fields. ``on_real_nodes=False`` leaves out the placement."""
    container = {"name": "main", "image": node_image(), "imagePullPolicy": "Never", "command": command,
                 "securityContext": CONTAINER_SC}
    if memory:
        container["resources"] = {"limits": {"memory": memory, "cpu": "500m"}}
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    body = {"restartPolicy": "Never", "securityContext": RESTRICTED, "containers": [container],
            "terminationGracePeriodSeconds": grace, **(placement() if on_real_nodes else {}), **spec}
    if node_name:
        body["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": body}


def stream_template() -> dict:
    """``placement()`` as a stream's ``job.podTemplate`` spells it: the operator's Pods of the stream (driver,
    pre-flight, drain) go to the real nodes' scheduler and tolerate their taint."""
    p = placement()
    template = {"schedulerName": p["schedulerName"], "tolerations": p["tolerations"]}
    # The tests' JVMs compile with C1 only (tests/conftest.py: SPARK_SUBMIT_OPTS, unset outside pytest, empty to
    # opt out). A Pod's environment is its spec's, and SPARK_* is the operator's, so a driver (and its
    # executors) on the nodes gets the same flag as JAVA_TOOL_OPTIONS. The OOM test sets its own template: its
    # limit is met by the image's default JVM, as a user's.
    if os.environ.get("SPARK_SUBMIT_OPTS"):
        template["env"] = [{"name": "JAVA_TOOL_OPTIONS", "value": os.environ["SPARK_SUBMIT_OPTS"]}]
    return template


def wait_pod(v1, ns: str, name: str, check, what: str, timeout: float = 180):
    """Poll the Pod until ``check(pod)``; on timeout fail with its status and events."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = v1.read_namespaced_pod(name, ns)
        if check(last):
            return last
        time.sleep(1)
    events = v1.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
    raise AssertionError(f"{what}: timed out; pod status {last.status if last else None}\n"
                         + "\n".join(f"{e.reason}: {e.message}" for e in events))


def read_pod(v1, namespace: str, name: str):
    """The Pod, or None when it does not exist (any other API error is raised)."""
    from kubernetes import client
    try:
        return v1.read_namespaced_pod(name, namespace)
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def stream_status(crs, namespace: str, name: str) -> dict:
    """The stream's status through the API at the stream's own group and version, not kubectl's discovery
    (docs/testing.md)."""
    from eos_job.spec import API_GROUP, API_VERSION, PLURAL
    return crs.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, name).get("status") or {}


def committed_batch(status: dict) -> int:
    """``status.lastCommittedBatch``, -1 before the first (batch 0 counts)."""
    batch = status.get("lastCommittedBatch")
    return -1 if batch is None else batch


def finished(pod) -> bool:
    return pod.status.phase in ("Succeeded", "Failed")


def pod_processes(uid: str) -> dict[int, int]:
    """pid -> process group of every process on this machine whose cgroup is the Pod's (cgroupfs: ``pod<uid>``)."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if f"pod{uid}" in (proc / "cgroup").read_text():
                found[int(proc.name)] = os.getpgid(int(proc.name))
        except (OSError, ProcessLookupError):
            continue
    return found


def container_processes(container_id: str) -> dict[int, int]:
    """pid -> process group of every process of one container (``containerStatuses[].containerID``,
    ``containerd://<id>``): its cgroup is ``.../pod<uid>/<id>``, so the Pod's sandbox (pause) is not among them."""
    cid = container_id.split("://", 1)[-1]
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(line.endswith(f"/{cid}") for line in (proc / "cgroup").read_text().splitlines()):
                found[int(proc.name)] = os.getpgid(int(proc.name))
        except (OSError, ProcessLookupError):
            continue
    return found


def kill9_container(container_id: str) -> dict[int, int]:
    """SIGKILL every process of one container (``container_processes``: the JVM and PySpark's workers, whatever
    their process groups); returns those signalled (empty: the container ran nothing any more)."""
    procs = container_processes(container_id)
    for pid in procs:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return procs


def wait_gone(v1, ns: str, name: str, timeout: float = 120) -> None:
    from kubernetes.client.rest import ApiException
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            v1.read_namespaced_pod(name, ns)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        time.sleep(0.5)
    raise AssertionError(f"Pod {ns}/{name} still there {timeout:.0f} s after its deletion")


def wait_processes_gone(procs: dict[int, int], timeout: float = 120) -> float:
    """Until none of ``procs`` (``pod_processes``) runs any more (a zombie counts as gone); returns the seconds
    it took. Fails naming those still running after ``timeout``."""
    start = time.monotonic()
    while alive := [p for p in procs if _running(p)]:
        if time.monotonic() - start > timeout:
            raise AssertionError(f"processes of the deleted Pod still run {timeout:.0f} s after its deletion: {alive}")
        time.sleep(0.2)
    return time.monotonic() - start


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class LogFollower(threading.Thread):
    """A Pod's log as it is written (``kubectl logs -f``), kept after the Pod is gone; with ``path``, also
    appended to that file as it arrives (``tests.harness.node_pods``)."""

    def __init__(self, v1, namespace: str, pod: str, path: Path | None = None):
        super().__init__(daemon=True)
        self.v1, self.namespace, self.pod, self.path, self.text = v1, namespace, pod, path, ""

    def run(self) -> None:
        out = self.path.open("a", encoding="utf-8") if self.path else None
        try:
            resp = self.v1.read_namespaced_pod_log(self.pod, self.namespace, follow=True, _preload_content=False)
            for chunk in resp.stream():
                self._add(chunk.decode(errors="replace"), out)
        except Exception as exc:  # noqa: BLE001 - the log ends with its Pod
            self._add(f"\n(log follow ended: {exc})", out)
        finally:
            if out:
                out.close()

    def _add(self, text: str, out) -> None:
        self.text += text
        if out:
            out.write(text)
            out.flush()


def keys_secret(stack_env: dict[str, str], name: str = "ckpt-keys") -> dict:
    """The checkpoint bucket's keys as a Secret (keys ``id`` and ``secret``) for a stream's ``checkpoint.s3``."""
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "type": "Opaque",
            "data": {k: base64.b64encode(stack_env[v].encode()).decode()
                     for k, v in (("id", "S3_ACCESS_KEY"), ("secret", "S3_SECRET_KEY"))}}


def what_the_kill_hit(res: dict) -> str:
    """Resolution's report (status.resolution) in words: the batch the restart replays and its slots."""
    per_slot = res.get("lastCommittedBatchPerSlot") or {}
    slots = ", ".join(f"slot {s}: batch {b}" for s, b in sorted(per_slot.items()))
    replay = res.get("replayBatch")
    where = (f"inside batch {replay} (slots that had committed it: {res.get('replaySlotsAlreadyCommitted') or []})"
             if replay is not None else "between batches")
    return f"{where}; {res.get('openTransactionsAborted', 0)} open transactions aborted; ledger per slot: {slots}"


TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def root_ca_config_map(st: Stack) -> dict:
    """ConfigMap ``kube-root-ca.crt`` (the API server's CA), which a cluster's controller manager publishes in
    every namespace and the token volume of ``chart_values_on_nodes`` reads; this stack's does not publish it."""
    from eos_stack import kube
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kube-root-ca.crt"},
            "data": {"ca.crt": (kube.pki_dir(st) / "ca.crt").read_text()}}


def chart_values_on_nodes(st: Stack) -> dict:
    """The chart's values that put its operator on the real nodes and let it reach the API server from there:
    the image as the nodes hold it, their scheduler and toleration, ``hostAliases`` (``kubernetes.default.svc``
    -> the services address) with ``KUBERNETES_SERVICE_HOST``/``PORT`` (the ``kubernetes`` Service's ClusterIP
    leads nowhere here: no kube-proxy), and the ServiceAccount token the API server's ServiceAccount admission
    would mount in a cluster (off in this stack) as ``extraVolumes`` (its namespace needs ``root_ca_config_map``)."""
    from eos_stack import kube
    from eos_stack.node_config import API_HOSTNAME, SCHEDULER_NAME, host_aliases
    repository, tag = node_image().rsplit(":", 1)
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "IfNotPresent"},
        "schedulerName": SCHEDULER_NAME, "tolerations": placement()["tolerations"],
        "hostAliases": host_aliases(st.state),
        "operator": {"extraEnv": [
            {"name": "KUBERNETES_SERVICE_HOST", "value": API_HOSTNAME},
            {"name": "KUBERNETES_SERVICE_PORT", "value": str(kube.load_ports(st)["apiserver"])}]},
        "extraVolumes": [{"name": "kube-api-access", "projected": {"sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1",
                                                                          "fieldPath": "metadata.namespace"}}]}}]}}],
        "extraVolumeMounts": [{"name": "kube-api-access", "mountPath": TOKEN_DIR, "readOnly": True}],
    }

