"""The process kubelet test harness runs Pods of the local API server as processes."""
from __future__ import annotations

import json
import textwrap
import time

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from eos_stack.cluster import holds_for, wait_until
from tests.harness.kubelet import ProcessKubelet


@pytest.fixture
def kubelet(stack_env, namespace, tmp_path):
    with ProcessKubelet(stack_env["KUBECONFIG"], namespace=namespace, log_dir=tmp_path / "pod-logs") as k:
        yield k


def pod(name: str, code: str, **extra) -> dict:
    container = {"name": "main", "image": "python:3.11", "command": ["python", "-c", textwrap.dedent(code)]}
    container.update(extra.pop("container", {}))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "containers": [container], **extra}}


def read_pod(v1, ns: str, name: str) -> dict | None:
    try:
        return json.loads(v1.read_namespaced_pod(name, ns, _preload_content=False).data)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def wait_phase(v1, ns: str, name: str, phases: tuple[str, ...], timeout: float = 60.0) -> dict:
    def check():
        p = read_pod(v1, ns, name)
        return p if p and p.get("status", {}).get("phase") in phases else None
    return wait_until(check, f"pod {ns}/{name} to reach {phases}", timeout)


def terminated(p: dict) -> dict:
    return p["status"]["containerStatuses"][0]["state"]["terminated"]


def test_pod_runs_to_success_with_env_from_secret_and_configmap(api, namespace, kubelet):
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_secret(namespace, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
                                            "stringData": {"password": "hunter2"}})
    v1.create_namespaced_config_map(namespace, {"apiVersion": "v1", "kind": "ConfigMap",
                                                "metadata": {"name": "c"}, "data": {"topic": "colors"}})
    manifest = pod("ok", """
        import os, sys
        print("hello from", os.environ["HOSTNAME"], sys.executable)
        print("env", os.environ["LITERAL"], os.environ["PASSWORD"], os.environ["TOPIC"], os.environ["MY_NS"])
        print("cwd", os.getcwd())
        """, container={"env": [
            {"name": "LITERAL", "value": "plain"},
            {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "s", "key": "password"}}},
            {"name": "TOPIC", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "topic"}}},
            {"name": "MY_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        ]})
    v1.create_namespaced_pod(namespace, manifest)
    p = wait_phase(v1, namespace, "ok", ("Succeeded", "Failed"))
    assert p["status"]["phase"] == "Succeeded", p["status"]
    assert p["spec"]["nodeName"] == kubelet.node_name
    assert p["status"]["podIP"] == "127.0.0.1"
    t = terminated(p)
    assert t["exitCode"] == 0 and t["reason"] == "Completed"
    assert t["startedAt"] and t["finishedAt"]
    out = kubelet.log_path(namespace, "ok").read_text()
    assert "hello from ok" in out
    assert f"env plain hunter2 colors {namespace}" in out


def test_failing_pod_reports_exit_code_and_termination_message(api, namespace, kubelet):
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_pod(namespace, pod("bad", """
        import os, sys
        with open(os.environ["EOS_TERMINATION_MESSAGE_PATH"], "w") as f:
            f.write("checkpoint is corrupt")
        print("failing on purpose", file=sys.stderr)
        sys.exit(3)
        """))
    p = wait_phase(v1, namespace, "bad", ("Succeeded", "Failed"))
    assert p["status"]["phase"] == "Failed"
    t = terminated(p)
    assert t["exitCode"] == 3
    assert t["reason"] == "Error"
    assert t["message"] == "checkpoint is corrupt"
    assert "failing on purpose" in kubelet.log_path(namespace, "bad").read_text()


def test_fallback_to_logs_on_error(api, namespace, kubelet):
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_pod(namespace, pod("logs", """
        raise RuntimeError("no message file, but a traceback")
        """, container={"terminationMessagePolicy": "FallbackToLogsOnError"}))
    p = wait_phase(v1, namespace, "logs", ("Succeeded", "Failed"))
    t = terminated(p)
    assert t["exitCode"] == 1
    assert "no message file, but a traceback" in t["message"]


def test_deleted_pod_gets_sigterm_and_disappears(api, namespace, kubelet, tmp_path):
    v1 = client.CoreV1Api(api)
    ready, marker = tmp_path / "ready", tmp_path / "got-sigterm"
    v1.create_namespaced_pod(namespace, pod("victim", f"""
        import signal, sys, time, pathlib
        def term(signum, frame):
            pathlib.Path({str(marker)!r}).write_text("SIGTERM")
            sys.exit(0)
        signal.signal(signal.SIGTERM, term)
        pathlib.Path({str(ready)!r}).write_text("ready")
        while True:
            time.sleep(0.1)
        """, terminationGracePeriodSeconds=20))
    wait_phase(v1, namespace, "victim", ("Running",))
    wait_until(ready.exists, "the pod's process to install its SIGTERM handler", 30)
    pid = kubelet.pid(namespace, "victim")
    assert pid
    v1.delete_namespaced_pod("victim", namespace)
    wait_until(lambda: read_pod(v1, namespace, "victim") is None, "the deleted pod to disappear", 30)
    assert marker.read_text() == "SIGTERM"
    assert kubelet.pid(namespace, "victim") is None


def test_deleted_pod_ignoring_sigterm_is_killed_after_grace(api, namespace, kubelet, tmp_path):
    v1 = client.CoreV1Api(api)
    ignoring = tmp_path / "ignoring"
    v1.create_namespaced_pod(namespace, pod("stubborn", f"""
        import pathlib, signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        pathlib.Path({str(ignoring)!r}).write_text("ignoring")
        while True:
            time.sleep(0.1)
        """, terminationGracePeriodSeconds=2))
    wait_phase(v1, namespace, "stubborn", ("Running",))
    wait_until(ignoring.exists, "the pod's process to ignore SIGTERM", 30)
    t0 = time.monotonic()
    v1.delete_namespaced_pod("stubborn", namespace)
    wait_until(lambda: read_pod(v1, namespace, "stubborn") is None, "the stubborn pod to disappear", 30)
    assert time.monotonic() - t0 >= 1.5


def test_kill9_ends_failed_137(api, namespace, kubelet):
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_pod(namespace, pod("chaos", """
        import time
        while True:
            time.sleep(0.1)
        """))
    wait_phase(v1, namespace, "chaos", ("Running",))
    assert kubelet.kill9(namespace, "chaos")
    p = wait_phase(v1, namespace, "chaos", ("Succeeded", "Failed"), timeout=30)
    assert p["status"]["phase"] == "Failed"
    t = terminated(p)
    assert t["exitCode"] == 137
    # The pod stays (restartPolicy is treated as Never): the operator decides what comes next.
    holds_for(lambda: read_pod(v1, namespace, "chaos")["status"]["phase"] == "Failed", "the pod staying Failed", 2)


def test_pods_of_other_nodes_and_schedulers_are_left_alone(api, namespace, kubelet):
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_pod(namespace, pod("elsewhere", "print('x')", nodeName="some-other-node"))
    v1.create_namespaced_pod(namespace, pod("custom", "print('x')", schedulerName="my-scheduler"))
    v1.create_namespaced_pod(namespace, pod("mine", "print('x')"))
    wait_phase(v1, namespace, "mine", ("Succeeded",))
    for name in ("elsewhere", "custom"):
        assert read_pod(v1, namespace, name).get("status", {}).get("phase") == "Pending"
        assert kubelet.pid(namespace, name) is None
    # No kubelet will ever confirm the deletion of a pod bound to another node: force it.
    v1.delete_namespaced_pod("elsewhere", namespace, grace_period_seconds=0)
