"""Pods for the real nodes (stack/eos_stack/node.py): ``restricted`` Pods of the project's image that ask for
the real nodes (their scheduler and the toleration of their taint, ``node_config.placement()``), and waiting
for a Pod's state with its events in the failure message.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from eos_stack.image_common import image_name
from eos_stack.node_config import placement

UID = 10001
RESTRICTED = {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SC = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
RESTRICTED_LABELS = {"pod-security.kubernetes.io/enforce": "restricted",
                     "pod-security.kubernetes.io/enforce-version": "latest"}


def real_pod(name: str, command: list[str], *, memory: str | None = None, node_name: str | None = None,
             grace: int = 30, env: dict[str, str] | None = None, on_real_nodes: bool = True, **spec) -> dict:
    """A ``restricted`` Pod of the project's image (``imagePullPolicy: Never``: imported into each node) that
    runs ``command``; ``spec`` adds Pod spec fields. ``on_real_nodes=False`` leaves out the placement."""
    container = {"name": "main", "image": image_name(), "imagePullPolicy": "Never", "command": command,
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
