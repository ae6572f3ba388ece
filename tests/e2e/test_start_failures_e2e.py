"""A driver that cannot start, as a real cluster reports it, reaches the stream's status with its reason,
then the restart strategy; a Pod the API server refuses is named in status and retried, not stormed.

Every Pod of the streams asks for the real nodes (stack/eos_stack/node.py) through ``job.podTemplate``
(``real_nodes.stream_template``: their scheduler and the toleration of their taint), so what reports each
failure is the real thing: an image tag the stack's own registry (``EOS_REGISTRY``) lacks waits in the real
kubelet's ErrImagePull/ImagePullBackOff (containerd asked the registry, which answered not found); a
nodeSelector no node matches, a checkpoint claim that does not exist or one that never binds leaves the Pod
unscheduled by kube-scheduler (PodScheduled=False, Unschedulable, its own message); a ``hostPath`` volume is
refused by the API server's PodSecurity admission (``restricted``); and a ResourceQuota of zero Pods makes the
API server refuse the create (403). No Spark starts until the quota is lifted. Each step prints how long it took
from the stream's creation (streams are deleted and re-created with the same name between steps)."""
from __future__ import annotations

import json
import time

import pytest

from eos_stack.cluster import wait_until
from eos_stack.common import Stack
from eos_stack.registry import image_ref
from tests.e2e.streams import NAME, Rig
from tests.harness.real_nodes import stream_template

pytestmark = pytest.mark.stack
# A tag the stack's registry does not hold (the project's image is there under its own tag).
MISSING_TAG = "spark-eos-operator:eos-missing-tag"


def _waiting(r: Rig, pod: str) -> str | None:
    """What blocks the Pod, as its status says (a waiting reason or an unscheduled condition)."""
    for p in r.kubectl.pods(r.ns):
        if p["metadata"]["name"] != pod:
            continue
        st = p.get("status") or {}
        for c in st.get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False":
                return c.get("reason")
        for c in st.get("containerStatuses") or []:
            reason = ((c.get("state") or {}).get("waiting") or {}).get("reason")
            if reason in ("ErrImagePull", "ImagePullBackOff"):
                return reason
    return None


def _ready(s: dict) -> dict:
    return next((c for c in s.get("conditions") or [] if c["type"] == "Ready"), {})


def _reported(r: Rig, pod: str, blocker: str, reason: str = "DriverStartBlocked") -> None:
    wait_until(lambda: _waiting(r, pod), f"{pod} to report why it cannot start", 60, r.diag, 0.2)
    # From the moment the Pod reports it, the stream says so (the operator watches its Pods and reacts in a
    # second or two; the generous wait is for a busy machine, not a latency claim).
    ready = r.wait_status(lambda s: _ready(s).get("reason") == reason, reason, 60)
    assert blocker in _ready(ready)["message"] and pod in _ready(ready)["message"], ready




class Steps:
    """Each step's seconds from the stream's apply to its last check (printed: the time a step takes)."""

    def __init__(self):
        self.lines: list[str] = []
        self.t0 = time.monotonic()

    def apply(self, kubectl, doc: dict, namespace: str) -> None:
        self.t0 = time.monotonic()
        kubectl.apply(doc, namespace)

    def done(self, what: str) -> None:
        self.lines.append(f"{what}: {time.monotonic() - self.t0:.1f} s after the stream's apply")


def _delete(r: Rig, steps: Steps) -> None:
    t0 = time.monotonic()
    r.kubectl.run("delete", "exactlyoncestream", NAME, "-n", r.ns, "--timeout=120s")
    steps.lines.append(f"   the stream deleted in {time.monotonic() - t0:.1f} s (its finalizer released)")


def on_real_nodes(doc: dict, **template) -> dict:
    """``doc`` with its Pods on the real nodes (their scheduler, their taint tolerated), ``template`` added."""
    doc["spec"]["job"]["podTemplate"] = {**stream_template(), **template}
    return doc


def test_start_failures_are_named_and_the_restart_strategy_applies(stack_env, nodes, kubectl, namespace, tmp_path):
    r = Rig(stack_env, kubectl, namespace, tmp_path, None)
    r.start_operator()
    steps = Steps()
    try:
        # 1. An image that cannot be pulled (a tag the stack's registry lacks): named at once, then after
        # job.driver.startTimeoutSeconds a failed start, and the restart strategy launches the next attempt.
        missing_image = image_ref(Stack(), MISSING_TAG)
        doc = on_real_nodes(r.stream())
        doc["spec"]["job"].update(image=missing_image, driver={"startTimeoutSeconds": 20})
        steps.apply(kubectl, doc, namespace)
        _reported(r, "colors-driver-0", "ImagePull")
        steps.done("1. ImagePull reported")
        pulled = kubectl.json("get", "pod", "colors-driver-0", "-n", namespace)
        assert pulled["spec"]["nodeName"] in {n.name for n in nodes}, pulled["spec"]
        # The real kubelet's own event: containerd asked the stack's registry, which has no such tag.
        pull_failed = wait_until(lambda: [e["message"] for e in kubectl.event_objects(namespace, "colors-driver-0")
                                          if e["reason"] == "Failed" and missing_image in e["message"]
                                          and "not found" in e["message"]],
                                 "the kubelet's pull failure event", 60, r.diag, 1)
        assert kubectl.events(namespace, NAME).count("DriverStartBlocked") >= 1
        wait_until(lambda: kubectl.event_messages(namespace, NAME, "DriverFailed"), "the start to time out",
                   60, r.diag, 1)
        failed = kubectl.event_messages(namespace, NAME, "DriverFailed")[0]
        assert "did not start within 20s" in failed and "ImagePull" in failed, failed
        wait_until(lambda: any(p["metadata"]["name"] == "colors-driver-1" for p in kubectl.pods(namespace)),
                   "the restart strategy's next attempt", 60, r.diag, 1)
        steps.done("1. the next attempt after the start timeout")
        steps.lines.append(f"1. the kubelet: {pull_failed[0][:200]}")
        _delete(r, steps)

        # 2. A nodeSelector no node matches: the scheduler's reason, then after the start timeout the
        # restart strategy. Deleting the stream leaves an object of one of its children's names that it
        # does not own (a drain ConfigMap someone else made) untouched.
        foreign = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "colors-drain"},
                   "data": {"owner": "someone else"}}
        kubectl.apply(foreign, namespace)
        foreign_uid = kubectl.json("get", "configmap", "colors-drain", "-n", namespace)["metadata"]["uid"]
        doc = on_real_nodes(r.stream(), nodeSelector={"pool": "gpu"})
        doc["spec"]["job"]["driver"] = {"startTimeoutSeconds": 10}
        steps.apply(kubectl, doc, namespace)
        _reported(r, "colors-driver-0", "Unschedulable")
        steps.done("2. Unschedulable reported")
        wait_until(lambda: [m for m in kubectl.event_messages(namespace, NAME, "DriverFailed")
                            if "did not start within 10s" in m and "Unschedulable" in m],
                   "the unscheduled start to time out", 60, r.diag, 1)
        uid = kubectl.json("get", "exactlyoncestream", NAME, "-n", namespace)["metadata"]["uid"]
        wait_until(lambda: any(p["metadata"]["name"] == "colors-driver-1"
                               and uid in [o["uid"] for o in p["metadata"].get("ownerReferences") or []]
                               for p in kubectl.pods(namespace)),
                   "the restart strategy's next attempt after the start timeout", 60, r.diag, 1)
        steps.done("2. the next attempt after the start timeout")
        _delete(r, steps)
        kept = kubectl.json("get", "configmap", "colors-drain", "-n", namespace)
        assert kept["metadata"]["uid"] == foreign_uid and kept["data"] == {"owner": "someone else"}, kept

        # 2b. A checkpoint claim that does not exist: the scheduler's reason names it. The first Pod that
        # mounts the claim is the probe that reads the checkpoint before resolution.
        doc = on_real_nodes(r.stream(checkpoint={"store": "pvc", "claimName": "missing-claim",
                                                 "path": str(tmp_path / "ckpt")}))
        steps.apply(kubectl, doc, namespace)
        missing = 'persistentvolumeclaim "missing-claim" not found'
        _reported(r, "colors-probe-0", missing, "ProbeStartBlocked")
        steps.done("2b. the missing claim reported")
        assert any(missing in m for m in kubectl.event_messages(namespace, NAME, "ProbeStartBlocked"))
        _delete(r, steps)

        # 2b'. A claim that exists but never binds (a storage class nothing provisions).
        kubectl.apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "never-binds"},
                       "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "none",
                                "resources": {"requests": {"storage": "1Gi"}}}}, namespace)
        doc = on_real_nodes(r.stream(checkpoint={"store": "pvc", "claimName": "never-binds",
                                                 "path": str(tmp_path / "ckpt")}))
        steps.apply(kubectl, doc, namespace)
        _reported(r, "colors-probe-0", "pod has unbound immediate PersistentVolumeClaims", "ProbeStartBlocked")
        steps.done("2b'. the unbound claim reported")
        _delete(r, steps)

        # 2c. A Pod template the namespace's Pod Security level (restricted) forbids: the API server's
        # PodSecurity admission refuses the driver Pod, and its reason is in status.
        doc = on_real_nodes(r.stream(), volumes=[{"name": "host", "hostPath": {"path": "/var/log"}}],
                            volumeMounts=[{"name": "host", "mountPath": "/host-logs"}])
        steps.apply(kubectl, doc, namespace)
        refused = r.wait_status(lambda s: _ready(s).get("reason") == "Refused", "the PodSecurity refusal", 30)
        steps.done("2c. the PodSecurity refusal reported")
        assert 'violates PodSecurity "restricted' in _ready(refused)["message"] \
            and "hostPath" in _ready(refused)["message"], refused
        _delete(r, steps)

        # 3. The API server refuses the Pod (a quota of zero Pods): the reason in status, one event,
        # retried after a pause; once the quota is lifted the same launch creates its Pod.
        quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-pods"},
                 "spec": {"hard": {"pods": "0"}}}
        kubectl.apply(quota, namespace)
        # No quota controller runs here: the status it would write, so admission counts against it.
        kubectl.run("patch", "resourcequota", "no-pods", "-n", namespace, "--subresource=status",
                    "--type=merge", "-p", json.dumps({"status": {"hard": {"pods": "0"}, "used": {"pods": "0"}}}))
        earlier = kubectl.events(namespace, NAME).count("Refused")   # case 2c's, same stream name
        steps.apply(kubectl, on_real_nodes(r.stream()), namespace)
        refused = r.wait_status(lambda s: _ready(s).get("reason") == "Refused", "the refusal in status", 60)
        steps.done("3. the quota refusal reported")
        assert "exceeded quota" in _ready(refused)["message"], refused
        assert kubectl.events(namespace, NAME).count("Refused") == earlier + 1
        kubectl.run("delete", "resourcequota", "no-pods", "-n", namespace)
        t0 = time.monotonic()
        wait_until(lambda: any(p["metadata"]["name"] == "colors-driver-0" for p in kubectl.pods(namespace)),
                   "the launch to create its Pod once the quota is gone", 90, r.diag, 1)
        print(f"Pod created {time.monotonic() - t0:.0f}s after the quota was lifted (retry every 30 s)")
        assert kubectl.events(namespace, NAME).count("Refused") == earlier + 1, "one event per distinct refusal"
    finally:
        print("\n".join(steps.lines))
        kubectl.run("delete", "exactlyoncestream", "--all", "-n", namespace, "--timeout=120s", check=False)
        r.operator.stop()
