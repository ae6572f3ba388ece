"""The process kubelet test harness runs Pods of the local API server as processes."""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import textwrap
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

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


def succeeded(v1, kubelet, ns: str, name: str) -> str:
    """Wait for the pod to end, assert it succeeded, return its log."""
    p = wait_phase(v1, ns, name, ("Succeeded", "Failed"))
    out = kubelet.log_path(ns, name).read_text()
    assert p["status"]["phase"] == "Succeeded", f"{p['status']}\n{out}"
    return out


def gone(pid: int) -> bool:
    """The process no longer runs (a zombie waiting for its reaper counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def claim(name: str, storage_class: str = "") -> dict:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": storage_class,
                     "resources": {"requests": {"storage": "1Mi"}}}}


@pytest.fixture
def host_claims(api, namespace):
    """Makes a claim of the namespace and a hostPath PersistentVolume reserved for it (``claimRef``, no
    StorageClass), for the stack's controller-manager to bind; the volumes are deleted afterwards."""
    v1, volumes = client.CoreV1Api(api), []

    def make(name: str, path: Path) -> str:
        pv = f"{namespace}-{name}"
        v1.create_persistent_volume({
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
            "spec": {"capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                     "claimRef": {"namespace": namespace, "name": name},
                     "hostPath": {"path": str(path), "type": "Directory"}}})
        volumes.append(pv)
        # Once the PV controller has seen the volume: a claim it syncs before that waits for its next
        # resync (15 s) to bind.
        wait_until(lambda: json.loads(v1.read_persistent_volume(pv, _preload_content=False).data)
                   .get("status", {}).get("phase") == "Available", f"{pv} Available", 30, interval=0.05)
        v1.create_namespaced_persistent_volume_claim(namespace, claim(name))
        return pv
    yield make
    for pv in volumes:
        try:
            v1.delete_persistent_volume(pv)   # gone once the namespace's claim is (pv-protection)
        except ApiException as exc:
            if exc.status != 404:
                raise


def pod_scheduled(v1, ns: str, name: str) -> dict | None:
    conds = (read_pod(v1, ns, name) or {}).get("status", {}).get("conditions") or []
    return next((c for c in conds if c["type"] == "PodScheduled"), None)


# A volume makes the kubelet start the Pod's process in a mount namespace (unshare, sh, then the program,
# each exec'ing the next): signals must reach it all the same.
WITH_VOLUME = {"volumes": [{"name": "scratch", "emptyDir": {}}]}
SCRATCH_MOUNT = {"volumeMounts": [{"name": "scratch", "mountPath": "/eos-kubelet-test-scratch"}]}


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
    assert p["status"]["podIP"].startswith("127.") and p["status"]["podIP"] != "127.0.0.1", "a Pod's own address"
    assert p["status"]["hostIP"] == "127.0.0.1"
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


@pytest.mark.parametrize("volume", [False, True], ids=["plain", "mount-namespace"])
def test_deleted_pod_gets_sigterm_and_disappears(api, namespace, kubelet, tmp_path, volume):
    v1 = client.CoreV1Api(api)
    ready, marker = tmp_path / "ready", tmp_path / "got-sigterm"
    v1.create_namespaced_pod(namespace, pod("victim", f"""
        import os, signal, sys, time, pathlib
        def term(signum, frame):
            pathlib.Path({str(marker)!r}).write_text("SIGTERM")
            sys.exit(0)
        signal.signal(signal.SIGTERM, term)
        pathlib.Path({str(ready)!r}).write_text(str(os.getpid()))
        while True:
            time.sleep(0.1)
        """, terminationGracePeriodSeconds=20, **(WITH_VOLUME if volume else {}),
        container=SCRATCH_MOUNT if volume else {}))
    wait_phase(v1, namespace, "victim", ("Running",))
    wait_until(ready.exists, "the pod's process to install its SIGTERM handler", 30)
    pid = kubelet.pid(namespace, "victim")
    assert pid and int(ready.read_text()) == pid   # the program itself is the process the kubelet signals
    v1.delete_namespaced_pod("victim", namespace)
    wait_until(lambda: read_pod(v1, namespace, "victim") is None, "the deleted pod to disappear", 30)
    assert marker.read_text() == "SIGTERM"
    assert kubelet.pid(namespace, "victim") is None


@pytest.mark.parametrize("volume", [False, True], ids=["plain", "mount-namespace"])
def test_deleted_pod_ignoring_sigterm_is_killed_after_grace(api, namespace, kubelet, tmp_path, volume):
    v1 = client.CoreV1Api(api)
    ignoring = tmp_path / "ignoring"
    v1.create_namespaced_pod(namespace, pod("stubborn", f"""
        import pathlib, signal, subprocess, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen(["sleep", "300"])   # in the pod's process group
        pathlib.Path({str(ignoring)!r}).write_text(str(child.pid))
        while True:
            time.sleep(0.1)
        """, terminationGracePeriodSeconds=2, **(WITH_VOLUME if volume else {}),
        container=SCRATCH_MOUNT if volume else {}))
    wait_phase(v1, namespace, "stubborn", ("Running",))
    wait_until(ignoring.exists, "the pod's process to ignore SIGTERM", 30)
    child = int(ignoring.read_text())
    t0 = time.monotonic()
    v1.delete_namespaced_pod("stubborn", namespace)
    wait_until(lambda: read_pod(v1, namespace, "stubborn") is None, "the stubborn pod to disappear", 30)
    assert time.monotonic() - t0 >= 1.5
    wait_until(lambda: gone(child), "the pod's child process to be killed with its group", 10)


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


# -- what a node gives a Pod: the image's entrypoint, fieldRefs, volumes, the ServiceAccount token ----------
def pyspark_home() -> str:
    return list(importlib.util.find_spec("pyspark").submodule_search_locations)[0]


def test_container_without_command_runs_the_image_entrypoint(api, namespace, kubelet):
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_pod(namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "entry"},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "main", "image": "spark-eos-operator:dev",
            "args": ["sh", "-c", "echo SPARK_HOME=$SPARK_HOME; ls $SPARK_HOME/jars | head -1; "
                                 "echo PYSPARK_PYTHON=$PYSPARK_PYTHON; echo MINE=$MINE"],
            "env": [{"name": "MINE", "value": "$(SPARK_HOME)/x"}]}]}})
    out = succeeded(v1, kubelet, namespace, "entry")
    assert f"SPARK_HOME={pyspark_home()}\n" in out
    assert any(line.endswith(".jar") for line in out.splitlines()), out
    assert f"PYSPARK_PYTHON={sys.executable}\n" in out, out
    assert f"MINE={pyspark_home()}/x" in out   # the image's ENV is there for the Pod's $(VAR) references


def test_field_refs_service_env_and_no_test_credentials(api, namespace, kubelet, stack_env):
    v1 = client.CoreV1Api(api)
    paths = {"POD_IP": "status.podIP", "HOST_IP": "status.hostIP", "NAME": "metadata.name",
             "NS": "metadata.namespace", "UID": "metadata.uid", "NODE": "spec.nodeName",
             "SA": "spec.serviceAccountName"}
    v1.create_namespaced_pod(namespace, pod("refs", f"""
        import os
        for k in {sorted(paths)!r} + ["KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT",
                                      "KUBERNETES_SERVICE_PORT_HTTPS"]:
            print(k, os.environ[k])
        for k in ("KUBECONFIG", "KUBECTL", "KUBE_APISERVER"):
            print(k, os.environ.get(k, "absent"))
        print("token", os.path.exists("/var/run/secrets/kubernetes.io/serviceaccount/token"))
        """, container={"env": [{"name": k, "valueFrom": {"fieldRef": {"fieldPath": v}}}
                                for k, v in paths.items()]}))
    out = succeeded(v1, kubelet, namespace, "refs")
    uid = read_pod(v1, namespace, "refs")["metadata"]["uid"]
    server = urlsplit(api.configuration.host)
    lines = set(out.splitlines())
    pod_ip = read_pod(v1, namespace, "refs")["status"]["podIP"]
    expected = {f"POD_IP {pod_ip}", "HOST_IP 127.0.0.1", "NAME refs", f"NS {namespace}", f"UID {uid}",
                f"NODE {kubelet.node_name}", "SA default", f"KUBERNETES_SERVICE_HOST {server.hostname}",
                f"KUBERNETES_SERVICE_PORT {server.port}", f"KUBERNETES_SERVICE_PORT_HTTPS {server.port}",
                "KUBECONFIG absent", "KUBECTL absent", "KUBE_APISERVER absent", "token False"}
    assert expected <= lines, out
    assert os.environ.get("KUBECONFIG")   # the test process has it; the Pod did not inherit it
    # No "default" ServiceAccount here (no controller makes one): nothing mounted, the log says why.
    assert out.splitlines()[0].endswith(f"ServiceAccount {namespace}/default does not exist; no token mounted "
                                        "at /var/run/secrets/kubernetes.io/serviceaccount"), out


def test_empty_dir_and_config_map_volumes_at_their_mount_paths(api, namespace, kubelet, tmp_path, host_claims):
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_config_map(namespace, {"apiVersion": "v1", "kind": "ConfigMap",
                                                "metadata": {"name": "conf"},
                                                "data": {"a.properties": "a=1\n", "b.properties": "b=2\n"}})
    scratch, conf, conf_all = tmp_path / "scratch", tmp_path / "no" / "such" / "conf", tmp_path / "conf-all"
    ckpt = tmp_path / "ckpt"   # a claim on a hostPath volume of this folder, mounted where it is
    scratch.mkdir()
    ckpt.mkdir()
    host_claims("ckpt", ckpt)
    (scratch / "on-the-host").write_text("host")   # hidden by the emptyDir, untouched by the Pods
    code = f"""
        import os, pathlib, sys, time
        me, other = sys.argv[1], sys.argv[2]
        scratch = pathlib.Path({str(scratch)!r})
        (scratch / me).write_text(me)
        pathlib.Path({str(ckpt)!r}, me).write_text(me)
        pathlib.Path({str(tmp_path)!r}, "ready-" + me).write_text("")
        while not pathlib.Path({str(tmp_path)!r}, "ready-" + other).exists():
            time.sleep(0.05)
        print("scratch", sorted(p.name for p in scratch.iterdir()))
        conf = pathlib.Path({str(conf)!r})
        print("conf", sorted(str(p.relative_to(conf)) for p in conf.rglob("*") if p.is_file()),
              (conf / "renamed" / "a.txt").read_text().strip())
        print("conf-all", sorted(os.listdir({str(conf_all)!r})))
        try:
            (conf / "x").write_text("x")
            print("conf writable")
        except OSError as exc:
            print("conf read-only", exc.errno)
        """
    for me, other in (("one", "two"), ("two", "one")):
        manifest = pod(me, code, volumes=[
            {"name": "scratch", "emptyDir": {}},
            {"name": "conf", "configMap": {"name": "conf", "items": [{"key": "a.properties",
                                                                      "path": "renamed/a.txt"}]}},
            {"name": "conf-all", "configMap": {"name": "conf"}},
            {"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt"}}],
            container={"volumeMounts": [{"name": "ckpt", "mountPath": str(ckpt)},
                                        {"name": "scratch", "mountPath": str(scratch)},
                                        {"name": "conf", "mountPath": str(conf)},
                                        {"name": "conf-all", "mountPath": str(conf_all)}]})
        manifest["spec"]["containers"][0]["command"] += [me, other]
        v1.create_namespaced_pod(namespace, manifest)
    for me in ("one", "two"):
        out = succeeded(v1, kubelet, namespace, me)
        assert f"scratch [{me!r}]" in out, out   # its own emptyDir only: not the other Pod's, not the host's
        assert "conf ['renamed/a.txt'] a=1" in out, out   # items: only the key named, at its path
        assert "conf-all ['a.properties', 'b.properties']" in out, out
        assert "conf read-only 30" in out, out   # EROFS
    assert sorted(p.name for p in scratch.iterdir()) == ["on-the-host"]
    assert sorted(p.name for p in ckpt.iterdir()) == ["one", "two"]
    # The mount points the kubelet made on this machine are gone with the Pods.
    wait_until(lambda: not (tmp_path / "no").exists() and not conf_all.exists(), "the mount points removed", 10)


def test_executor_pod_runs_through_the_entrypoint(api, namespace, kubelet, tmp_path):
    """A Pod shaped like Spark's executor Pods (KubernetesExecutorBuilder): no command, args ["executor"],
    fieldRefs for its IP and name, an emptyDir for SPARK_LOCAL_DIRS and the executor ConfigMap at
    /opt/spark/conf, owned by the driver Pod. A stand-in java (JAVA_HOME) prints what it was given.
    Spark creates that ConfigMap after its first executor Pods: the Pod waits for it, as on a node."""
    v1 = client.CoreV1Api(api)
    driver = v1.create_namespaced_pod(namespace, pod("drv", "print('never run')", schedulerName="nobody"))
    jdk = tmp_path / "jdk"
    (jdk / "bin").mkdir(parents=True)
    (jdk / "bin" / "java").write_text(textwrap.dedent("""\
        #!/bin/sh
        echo "java $*"
        echo "conf: $(cat "$SPARK_CONF_DIR/log4j2.properties")"
        touch "$SPARK_LOCAL_DIRS/block" && echo "local dir: $(ls "$SPARK_LOCAL_DIRS")"
        """))
    (jdk / "bin" / "java").chmod(0o755)
    local_dir = f"/var/data/spark-{uuid.uuid4()}"
    name = "colors-driver-0-exec-1"
    env = {"SPARK_USER": "root", "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@10.0.0.9:7078",
           "SPARK_EXECUTOR_CORES": "1", "SPARK_EXECUTOR_MEMORY": "512m", "SPARK_APPLICATION_ID": "spark-app-1",
           "SPARK_CONF_DIR": "/opt/spark/conf", "SPARK_EXECUTOR_ID": "1", "SPARK_RESOURCE_PROFILE_ID": "0",
           "SPARK_JAVA_OPT_0": "-Dspark.driver.port=7078", "SPARK_LOCAL_DIRS": local_dir, "JAVA_HOME": str(jdk)}
    v1.create_namespaced_pod(namespace, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"spark-role": "executor", "spark-exec-id": "1"},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "drv",
                                          "uid": driver.metadata.uid, "controller": True}]},
        "spec": {"restartPolicy": "Never", "hostname": name, "containers": [{
            "name": "spark-kubernetes-executor", "image": "spark-eos-operator:dev", "args": ["executor"],
            "env": [{"name": k, "value": v} for k, v in env.items()] + [
                {"name": "SPARK_EXECUTOR_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "SPARK_EXECUTOR_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            "volumeMounts": [{"name": "spark-local-dir-1", "mountPath": local_dir},
                             {"name": "spark-conf-volume-exec", "mountPath": "/opt/spark/conf"}]}],
            "volumes": [{"name": "spark-local-dir-1", "emptyDir": {}},
                        {"name": "spark-conf-volume-exec", "configMap": {
                            "name": "spark-exec-1-conf-map",
                            "items": [{"key": "log4j2.properties", "path": "log4j2.properties"}]}}]}})
    log = kubelet.log_path(namespace, name)
    wait_until(lambda: log.exists() and "waiting: ConfigMap" in log.read_text(), "the pod to wait for its ConfigMap",
               30)
    p = read_pod(v1, namespace, name)
    assert p["status"]["phase"] == "Pending", p["status"]
    assert p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "ContainerCreating"
    v1.create_namespaced_config_map(namespace, {"apiVersion": "v1", "kind": "ConfigMap",
                                                "metadata": {"name": "spark-exec-1-conf-map"},
                                                "data": {"log4j2.properties": "rootLogger.level = info\n"}})
    out = succeeded(v1, kubelet, namespace, name)
    java = next(line for line in out.splitlines() if line.startswith("java "))
    assert java.startswith("java -Dspark.driver.port=7078 -Xms512m -Xmx512m "
                           f"-cp /opt/spark/conf:{pyspark_home()}/jars/* "
                           "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend "), java
    p = read_pod(v1, namespace, name)
    assert java.endswith("--driver-url spark://CoarseGrainedScheduler@10.0.0.9:7078 --executor-id 1 --cores 1 "
                         f"--app-id spark-app-1 --hostname {p['status']['podIP']} --resourceProfileId 0 "
                         f"--podName {name}"), java
    assert "conf: rootLogger.level = info" in out and "local dir: block" in out, out
    assert p["spec"]["nodeName"] == kubelet.node_name
    wait_until(lambda: not Path(local_dir).exists(), "the executor's local dir mount point removed", 10)


def test_pod_waiting_for_its_config_map_can_be_deleted(api, namespace, kubelet):
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_pod(namespace, pod("waits", "print('never')", volumes=[
        {"name": "conf", "configMap": {"name": "not-yet"}}],
        container={"volumeMounts": [{"name": "conf", "mountPath": "/eos-kubelet-test-conf"}]}))
    wait_until(lambda: (read_pod(v1, namespace, "waits")["spec"].get("nodeName")), "the pod to be claimed", 30)
    v1.delete_namespaced_pod("waits", namespace)
    wait_until(lambda: read_pod(v1, namespace, "waits") is None, "the waiting pod to disappear", 30)
    assert "never" not in kubelet.log_path(namespace, "waits").read_text()


def test_service_account_token_authenticates_as_the_pod_service_account(api, namespace, kubelet):
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_service_account(namespace, {"apiVersion": "v1", "kind": "ServiceAccount",
                                                     "metadata": {"name": "runner"}})
    v1.create_namespaced_service_account(namespace, {"apiVersion": "v1", "kind": "ServiceAccount",
                                                     "metadata": {"name": "quiet"},
                                                     "automountServiceAccountToken": False})
    v1.create_namespaced_pod(namespace, pod("in-cluster", """
        import base64, json, os, ssl, urllib.error, urllib.request
        sa = "/var/run/secrets/kubernetes.io/serviceaccount"
        token, ns = open(f"{sa}/token").read(), open(f"{sa}/namespace").read()
        ctx = ssl.create_default_context(cafile=f"{sa}/ca.crt")   # verifies the API server's certificate
        base = f"https://{os.environ['KUBERNETES_SERVICE_HOST']}:{os.environ['KUBERNETES_SERVICE_PORT']}"
        def call(method, path, body=None):
            req = urllib.request.Request(base + path, method=method, data=body and json.dumps(body).encode(),
                                         headers={"Authorization": f"Bearer {token}",
                                                  "Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
                    return resp.status, json.load(resp)
            except urllib.error.HTTPError as exc:
                return exc.code, None
        status, review = call("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                              {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
        print("review", status, review["status"]["userInfo"]["username"])
        print("namespace", ns)
        print("list pods", call("GET", f"/api/v1/namespaces/{ns}/pods")[0])
        claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
        print("bound to pod", claims["kubernetes.io"]["pod"]["name"])
        try:
            open(f"{sa}/token", "w")
        except OSError as exc:
            print("token read-only", exc.errno)
        """, serviceAccountName="runner"))
    no_token = """
        import os
        print("token", os.path.exists("/var/run/secrets/kubernetes.io/serviceaccount/token"))
        """
    v1.create_namespaced_pod(namespace, pod("sa-says-no", no_token, serviceAccountName="quiet"))
    v1.create_namespaced_service_account(namespace, {"apiVersion": "v1", "kind": "ServiceAccount",
                                                     "metadata": {"name": "default"}})
    v1.create_namespaced_pod(namespace, pod("default-sa", """
        import os
        print("token", os.path.exists("/var/run/secrets/kubernetes.io/serviceaccount/token"))
        """))
    v1.create_namespaced_pod(namespace, pod("pod-says-no", no_token, serviceAccountName="runner",
                                            automountServiceAccountToken=False))
    out = succeeded(v1, kubelet, namespace, "in-cluster")
    assert f"review 201 system:serviceaccount:{namespace}:runner" in out, out
    assert f"namespace {namespace}" in out
    assert "list pods 403" in out, out   # RBAC is on and the ServiceAccount has no Role
    assert "bound to pod in-cluster" in out
    assert "token read-only 30" in out, out
    for name in ("sa-says-no", "pod-says-no"):
        assert "token False" in succeeded(v1, kubelet, namespace, name)
    # No serviceAccountName (nothing defaults it here): the "default" ServiceAccount's token, as on a cluster.
    assert "token True" in succeeded(v1, kubelet, namespace, "default-sa")


# -- Pods that cannot start, as a real kubelet and kube-scheduler show them ---------------------------------
def waiting(p: dict) -> dict:
    return ((p.get("status", {}).get("containerStatuses") or [{}])[0].get("state") or {}).get("waiting") or {}


def wait_waiting(v1, ns: str, name: str, reason: str, timeout: float = 30.0) -> dict:
    def check():
        p = read_pod(v1, ns, name)
        return p if p and waiting(p).get("reason") == reason else None
    return wait_until(check, f"pod {ns}/{name} to wait with {reason}", timeout)


def test_env_of_a_missing_secret_or_key_waits_with_create_container_config_error(api, namespace, kubelet):
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_config_map(namespace, {"apiVersion": "v1", "kind": "ConfigMap",
                                                "metadata": {"name": "conf"}, "data": {"other": "x"}})
    v1.create_namespaced_pod(namespace, pod("needs-secret", """
        import os
        print("env", os.environ["PASSWORD"], os.environ["TOPIC"], os.environ.get("MAYBE", "unset"))
        """, container={"env": [
            {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "later", "key": "password"}}},
            {"name": "TOPIC", "valueFrom": {"configMapKeyRef": {"name": "conf", "key": "topic"}}},
            {"name": "MAYBE", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k", "optional": True}}}]}))
    p = wait_waiting(v1, namespace, "needs-secret", "CreateContainerConfigError")
    assert p["status"]["phase"] == "Pending", p["status"]
    assert waiting(p)["message"] == 'secret "later" not found', p["status"]
    assert p["spec"]["nodeName"] == kubelet.node_name   # scheduled: the node cannot configure the container
    # The Secret appears without the key: the message says which key, then it starts once the key is there.
    v1.create_namespaced_secret(namespace, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "later"},
                                            "stringData": {"wrong": "x"}})
    wait_until(lambda: waiting(read_pod(v1, namespace, "needs-secret")).get("message")
               == f"couldn't find key password in Secret {namespace}/later", "the missing key's message", 30)
    v1.patch_namespaced_secret("later", namespace, {"stringData": {"password": "hunter2"}})
    p = wait_waiting(v1, namespace, "needs-secret", "CreateContainerConfigError")
    wait_until(lambda: waiting(read_pod(v1, namespace, "needs-secret")).get("message")
               == f"couldn't find key topic in ConfigMap {namespace}/conf", "the missing ConfigMap key's message", 30)
    assert kubelet.pid(namespace, "needs-secret") is None
    v1.patch_namespaced_config_map("conf", namespace, {"data": {"topic": "colors"}})
    out = succeeded(v1, kubelet, namespace, "needs-secret")
    assert "env hunter2 colors unset" in out, out
    assert 'waiting: secret "later" not found' in out, out   # each distinct wait once in the Pod's log
    assert out.count("waiting: ") == 3, out


def test_unpullable_image_waits_in_image_pull_back_off_and_never_runs(api, namespace, stack_env, tmp_path):
    v1 = client.CoreV1Api(api)
    with ProcessKubelet(stack_env["KUBECONFIG"], namespace=namespace, log_dir=tmp_path / "pod-logs",
                        pullable=lambda image: not image.startswith("registry.invalid/")) as kubelet:
        v1.create_namespaced_pod(namespace, pod("no-image", "print('ran')",
                                                container={"image": "registry.invalid/eos:nope"}))
        v1.create_namespaced_pod(namespace, pod("pulls", "print('ran')"))
        p = wait_waiting(v1, namespace, "no-image", "ErrImagePull")
        assert p["status"]["phase"] == "Pending" and p["spec"]["nodeName"] == kubelet.node_name
        assert 'failed to pull and unpack image "registry.invalid/eos:nope"' in waiting(p)["message"], p["status"]
        p = wait_waiting(v1, namespace, "no-image", "ImagePullBackOff")
        assert waiting(p)["message"] == 'Back-off pulling image "registry.invalid/eos:nope"'
        assert p["status"]["phase"] == "Pending"
        assert "ran" in succeeded(v1, kubelet, namespace, "pulls")   # other images pull
        holds_for(lambda: (lambda q: q["status"]["phase"] == "Pending" and waiting(q).get("reason")
                           == "ImagePullBackOff")(read_pod(v1, namespace, "no-image")), "the pod never running", 3)
        assert kubelet.pid(namespace, "no-image") is None
        assert "ran" not in kubelet.log_path(namespace, "no-image").read_text()
        v1.delete_namespaced_pod("no-image", namespace)
        wait_until(lambda: read_pod(v1, namespace, "no-image") is None, "the waiting pod to disappear", 30)


def test_node_selector_decides_whether_the_pod_is_scheduled(api, namespace, stack_env, tmp_path):
    v1 = client.CoreV1Api(api)
    with ProcessKubelet(stack_env["KUBECONFIG"], namespace=namespace, log_dir=tmp_path / "pod-logs",
                        node_labels={"pool": "streaming"}) as kubelet:
        toleration = {"key": "dedicated", "operator": "Equal", "value": "streaming", "effect": "NoSchedule"}
        v1.create_namespaced_pod(namespace, pod("linux", "print('ran')", nodeSelector={"kubernetes.io/os": "linux"},
                                                tolerations=[toleration]))
        v1.create_namespaced_pod(namespace, pod("pool", "print('ran')", nodeSelector={
            "pool": "streaming", "kubernetes.io/hostname": kubelet.node_name}))
        v1.create_namespaced_pod(namespace, pod("gpu", "print('ran')", nodeSelector={"accelerator": "gpu"}))
        v1.create_namespaced_pod(namespace, pod("arm", "print('ran')", affinity={"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["s390x"]}]}]}}}))
        # Created for this node: no scheduler involved; a kubelet runs it, or rejects it if it does not fit.
        v1.create_namespaced_pod(namespace, pod("pinned", "print('ran')", nodeName=kubelet.node_name))
        v1.create_namespaced_pod(namespace, pod("pinned-gpu", "print('ran')", nodeName=kubelet.node_name,
                                                nodeSelector={"accelerator": "gpu"}))
        for name in ("linux", "pool", "pinned"):
            assert "ran" in succeeded(v1, kubelet, namespace, name)
        for name in ("gpu", "arm"):
            def scheduled(name=name):
                conds = read_pod(v1, namespace, name).get("status", {}).get("conditions") or []
                return next((c for c in conds if c["type"] == "PodScheduled"), None)
            cond = wait_until(scheduled, f"{name}'s PodScheduled condition", 30)
            assert cond["status"] == "False" and cond["reason"] == "Unschedulable", cond
            assert cond["message"].startswith("0/1 nodes are available: 1 node(s) didn't match Pod's node "
                                              "affinity/selector."), cond
            p = read_pod(v1, namespace, name)
            assert p["status"]["phase"] == "Pending" and not p["spec"].get("nodeName"), p
            assert kubelet.pid(namespace, name) is None
        p = wait_phase(v1, namespace, "pinned-gpu", ("Failed",))
        assert p["status"]["reason"] == "NodeAffinity", p["status"]
        assert not kubelet.log_path(namespace, "pinned-gpu").exists()
        holds_for(lambda: not read_pod(v1, namespace, "gpu")["spec"].get("nodeName"), "gpu staying unbound", 2)


def test_a_pod_is_scheduled_once_its_claim_exists_and_is_bound(api, namespace, kubelet, tmp_path, host_claims):
    """As kube-scheduler: a claim that does not exist, or is not bound, leaves the Pod unbound with the
    VolumeBinding plugin's reason; once the controller-manager binds it to a hostPath volume the Pod runs with
    the volume at its mountPath (read-only where the claim's volume says so)."""
    v1 = client.CoreV1Api(api)
    data, mount = tmp_path / "pv", tmp_path / "mnt"   # the volume's folder; the mountPath, made for the Pods
    data.mkdir()
    code = f"""
        import pathlib, sys
        try:
            pathlib.Path({str(mount)!r}, sys.argv[1]).write_text("by the pod")
            print("wrote")
        except OSError as exc:
            print("read-only", exc.errno)
        """
    for name, read_only in (("writer", False), ("reader", True)):
        manifest = pod(name, code, volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "data",
                                                                                      "readOnly": read_only}}],
                       container={"volumeMounts": [{"name": "data", "mountPath": str(mount)}]})
        manifest["spec"]["containers"][0]["command"].append(name)
        v1.create_namespaced_pod(namespace, manifest)
    not_found = ('0/1 nodes are available: persistentvolumeclaim "data" not found. preemption: 0/1 nodes are '
                 'available: 1 Preemption is not helpful for scheduling.')
    for name in ("writer", "reader"):
        cond = wait_until(lambda name=name: pod_scheduled(v1, namespace, name), f"{name}'s PodScheduled", 30)
        assert (cond["status"], cond["reason"], cond["message"]) == ("False", "Unschedulable", not_found), cond
        assert read_pod(v1, namespace, name)["status"]["phase"] == "Pending"
    t0 = time.monotonic()
    pv = host_claims("data", data)
    assert "wrote" in succeeded(v1, kubelet, namespace, "writer")
    print(f"scheduled and ran {time.monotonic() - t0:.1f}s after the claim and its volume were created")
    assert "read-only 30" in succeeded(v1, kubelet, namespace, "reader")   # EROFS
    assert (data / "writer").read_text() == "by the pod" and not (data / "reader").exists()
    pvc = json.loads(v1.read_namespaced_persistent_volume_claim("data", namespace, _preload_content=False).data)
    assert pvc["status"]["phase"] == "Bound" and pvc["spec"]["volumeName"] == pv, pvc
    wait_until(lambda: not mount.exists(), "the mount point removed", 10)


def test_a_claim_no_volume_binds_leaves_the_pod_unscheduled(api, namespace, kubelet):
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_persistent_volume_claim(namespace, claim("nowhere", storage_class="none"))
    v1.create_namespaced_pod(namespace, pod("stuck", "print('ran')", volumes=[
        {"name": "data", "persistentVolumeClaim": {"claimName": "nowhere"}}],
        container={"volumeMounts": [{"name": "data", "mountPath": "/eos-kubelet-test-claim"}]}))
    cond = wait_until(lambda: pod_scheduled(v1, namespace, "stuck"), "stuck's PodScheduled", 30)
    assert (cond["status"], cond["reason"]) == ("False", "Unschedulable"), cond
    assert cond["message"] == ("0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims. "
                               "preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."), cond
    holds_for(lambda: not read_pod(v1, namespace, "stuck")["spec"].get("nodeName"), "stuck staying unbound", 2)
    assert kubelet.pid(namespace, "stuck") is None


def test_read_only_root_filesystem_leaves_only_volumes_and_the_node_disks_writable(api, namespace, kubelet, tmp_path):
    """``readOnlyRootFilesystem``: /tmp, HOME and the image's folders refuse writes; the Pod's emptyDir and the
    node's disks (the stack's state folder, where tests keep checkpoints) take them; ``workingDir`` may be
    the mount itself (Spark's executors fetch jars into it)."""
    v1 = client.CoreV1Api(api)
    repo = str(Path(__file__).resolve().parents[2])
    v1.create_namespaced_pod(namespace, pod("ro", f"""
        import errno, os, pathlib
        def writable(path):
            try:
                pathlib.Path(path).write_text("x")
                return True
            except OSError as exc:
                assert exc.errno == errno.EROFS, exc
                return False
        print("cwd", os.getcwd())
        print("tmp", writable("/tmp/eos-ro-probe-" + os.environ["HOSTNAME"]))
        print("repo", writable({repo!r} + "/eos-ro-probe"))
        print("scratch", writable("/eos-kubelet-test-scratch/probe"))
        print("state", writable({str(tmp_path / "state-probe")!r}))
        """, **WITH_VOLUME, container={**SCRATCH_MOUNT, "workingDir": "/eos-kubelet-test-scratch",
                                       "securityContext": {"readOnlyRootFilesystem": True}}))
    p = wait_phase(v1, namespace, "ro", ("Succeeded", "Failed"))
    out = kubelet.log_path(namespace, "ro").read_text()
    assert p["status"]["phase"] == "Succeeded", out
    for line in ("cwd /eos-kubelet-test-scratch", "tmp False", "repo False", "scratch True", "state True"):
        assert line in out, out
    assert not Path(repo, "eos-ro-probe").exists()
