"""The unique-id stream exactly once under the operator, its driver Pods on the real nodes.

The operator runs as a process on this machine (as the other operator e2e tests do) against the stack's API
server; it creates the driver Pods, and the stream's ``job.podTemplate`` puts them on the real nodes
(stack/eos_stack/node.py): the real nodes' scheduler profile and the toleration of their taint
(``tests.harness.real_nodes.stream_template``). The Pods run the project's image as each node's containerd holds
it (``imagePullPolicy`` IfNotPresent, the default for its tag) in a namespace enforcing ``restricted``, and reach
Kafka and the checkpoint bucket (MinIO, ``checkpoint.store: s3``) through the stack's services address
(node_services.py), which the operator on the host reaches too: it resolves every start itself, reading the
checkpoint straight from the bucket.

Mid-stream, with a slot transaction open, the driver Pod is deleted with grace 0. The object goes at once; the
kubelet then stops the container with its minimum grace of 2 s (kubelet 1.35 ``minimumGracePeriodInSeconds``:
SIGTERM, SIGKILL 2 s later), and every process of it goes (the JVM and PySpark's workers, whatever their process
groups; checked in the Pod's cgroup). Whether the driver logged the SIGTERM (its stop at a batch boundary
begun) is reported; batches of ``BATCH`` records take longer than those 2 s. The operator sees its driver
disappear, resolves (fencing every slot) and starts the next driver Pod on a real node. The output, read_committed, is every id sent, none twice (``assert_ids_exactly_once``: the
ledger only grew, no open transaction, every committed slot against the ledger); what the kill hit is read from
status, as resolution reported it per slot. Before the kill, ``kubectl eos ui``'s port-forward reaches the first
driver's Spark UI (``job.metrics`` on) and its REST API shows the query's jobs.

Then a drain: the second driver's node is cordoned and the driver evicted through the Eviction API (what
``kubectl drain`` does for each Pod). The eviction is a planned stop (docs/operations.md#drain-and-eviction): the
driver stops at a batch boundary on the kubelet's SIGTERM, the restart strategy counts nothing (restartCount stays
1), the events say DriverEvicting and DriverEvicted, and the third driver runs on the other node. The unique-id
audit at the end covers all three drivers.

The stream has ``job.metrics.uiService`` on: the operator makes the ClusterIP Service ``<name>-ui``, owned by the
stream, one port ``spark-ui`` to the UI. ``kubectl eos ui`` (the plugin's own process, as a user runs it) forwards
through it and keeps running across the kill: its URL answers with the first driver's application before and, after
the restart, with the second's (the application id, compared with a forward straight to each driver Pod: the
check that tells the two apart). Turned off at the end, the Service is deleted and the driver is not restarted.
The Service's ClusterIP itself is not dialled: this stack runs no kube-proxy and no endpoints controller, so
kubectl's resolution of the Service (its selector and named target port) is what is tested.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from confluent_kafka.admin import AdminClient
from kubernetes import client, config

from eos_job.resolution import open_transaction_partitions
from eos_job.spec import API_GROUP, API_VERSION, PLURAL
from eos_operator.children import LABEL_DRIVER_METRICS, stream_selector
from eos_operator.kubectl_ui import port_forward, ui_target
from eos_stack.cluster import wait_until
from eos_stack.node_config import SCHEDULER_NAME
from examples.colors.manifest import colors_manifest
from tests.e2e.streams import (IDS, NAME, ColorsTopics, Diagnostics, IdFeed, OperatorProcess,
                               assert_ids_exactly_once, wait_ids)
from tests.harness.real_nodes import (LogFollower, committed_batch, keys_secret, node_image, pod_processes,
                                      stream_status, stream_template,
                                      wait_processes_gone, what_the_kill_hit)

pytestmark = pytest.mark.timeout(1200)
# Records a batch reads at most: batches long enough (seconds) that the kubelet's SIGKILL, which follows its
# SIGTERM by at least 2 s even for a grace-0 deletion, can land inside one.
BATCH = 8000
GRACEFUL = "received SIGTERM: stopping at the next clean batch boundary"


def real_node_stream(topics: ColorsTopics, pod_env: dict[str, str], bucket: str, prefix: str) -> dict:
    """The unique-id stream as Pods on the real nodes reach the stack (Kafka's PODS listener, the bucket through
    the services address, its keys in Secret ``ckpt-keys``), its driver on the real nodes."""
    doc = colors_manifest(NAME, pod_env["POD_KAFKA_BOOTSTRAP"], topics.events, topics.counts, "/unused",
                          dlq=topics.dlq, max_offsets_per_trigger=BATCH, trigger_interval_ms=500,
                          job={"module": IDS, "image": node_image(), "driver": {"cpu": "1", "memory": "2Gi"},
                               "podTemplate": stream_template(), "metrics": {"enabled": True, "uiService": True}},
                          restartStrategy={"type": "fixed-delay", "fixedDelay": {"attempts": 5, "delaySeconds": 1}})
    doc["spec"]["checkpoint"] = {"store": "s3", "path": prefix, "s3": {
        "bucket": bucket, "endpoint": pod_env["POD_S3_ENDPOINT"], "pathStyleAccess": True,
        "accessKeyId": {"name": "ckpt-keys", "key": "id"}, "secretAccessKey": {"name": "ckpt-keys", "key": "secret"}}}
    return doc


def on_a_real_node(pod: dict, nodes) -> str:
    """The Pod's node, after checking the Pod is the real nodes' and runs the image as the node holds it."""
    spec = pod["spec"]
    assert spec.get("schedulerName") == SCHEDULER_NAME, spec.get("schedulerName")
    assert spec.get("nodeName") in {n.name for n in nodes}, spec.get("nodeName")
    container = spec["containers"][0]
    assert container["image"] == node_image() and container["imagePullPolicy"] in ("IfNotPresent", "Never"), container
    return spec["nodeName"]


def gone_or(read) -> bool:
    """``read()`` succeeds (True), or the object is gone (False)."""
    try:
        read()
        return True
    except client.ApiException as exc:
        if exc.status == 404:
            return False
        raise


def spark_ui_through_port_forward(crs, namespace: str, kubeconfig: str) -> tuple[str, str]:
    """``kubectl eos ui``'s forward (kubectl port-forward through the API server to the node's kubelet and
    containerd, which dials the Pod's loopback) to the running driver Pod's UI (no Service given: the Pod):
    Spark's REST API lists the driver's application and the streaming query's batch jobs. The application id too."""
    stream = crs.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, NAME)
    pod, port = ui_target(stream)
    proc, url = port_forward(argparse.Namespace(port=0, kubeconfig=kubeconfig, context=None), namespace, pod, port)
    try:
        def get(path: str):
            with urllib.request.urlopen(f"{url}/api/v1{path}", timeout=20) as resp:
                return json.loads(resp.read())
        (app,) = [a for a in get("/applications") if a["name"] == f"eos-{NAME}"]
        jobs = wait_until(lambda: [j for j in get(f"/applications/{app['id']}/jobs")
                                   if f"eos-{namespace}-{NAME}" in j.get("description", "")] or None,
                          "the streaming query's jobs in the driver's UI", 60, lambda: "", 1)
        # The cgroup's CPU limit as the JVM sees it: a driver of job.driver.cpu 1 runs local[*] on one core (the
        # retired process kubelet, without cgroups, gave it every core of the machine).
        cores = {e["id"]: e["totalCores"] for e in get(f"/applications/{app['id']}/executors")}
        assert cores == {"driver": 1}, f"local[*] in a 1-CPU driver container: {cores}"
        return (f"Spark UI of {pod} through kubectl port-forward ({url}): {app['id']}, {len(jobs)} query jobs, "
                f"local[*] on {cores['driver']} core"), app["id"]
    finally:
        proc.terminate()
        proc.wait(20)


def drain_driver(v1, kubectl, namespace: str, pod_name: str, node: str) -> str:
    """Cordon ``node`` and evict the driver Pod through the Eviction API (what ``kubectl drain`` does per Pod); the
    Pod is gone when this returns. The caller uncordons."""
    kubectl.run("cordon", node)
    uid = v1.read_namespaced_pod(pod_name, namespace).metadata.uid
    procs = pod_processes(uid)
    v1.create_namespaced_pod_eviction(pod_name, namespace, client.V1Eviction(
        metadata=client.V1ObjectMeta(name=pod_name, namespace=namespace)))
    gone_s = wait_processes_gone(procs)
    return f"{pod_name} evicted from cordoned {node} ({len(procs)} processes gone {gone_s:.1f} s after the eviction)"


class UiCommand:
    """``kubectl eos ui NAME`` in a process of its own, as a user runs it, left running; its URL and output."""

    def __init__(self, namespace: str, kubeconfig: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "eos_operator.kubectl_eos", "--kubeconfig", kubeconfig,
                                      "-n", namespace, "ui", NAME], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.err = ""
        threading.Thread(target=lambda: [self.lines.put(x) for x in self.proc.stdout], daemon=True).start()
        threading.Thread(target=self._drain_err, daemon=True).start()
        try:
            self.first = self.lines.get(timeout=90)
        except queue.Empty:
            self.first = ""
        found = re.search(r"(http://127\.0\.0\.1:\d+)/", self.first)
        assert found, f"kubectl eos ui printed no URL: {self.first!r} {self.err[-2000:]}"
        self.url = found.group(1)

    def _drain_err(self) -> None:
        for line in self.proc.stderr:
            self.err += line

    def app(self) -> dict | None:
        """The stream's application as the URL answers now; None while it answers nothing (a forward again)."""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/applications", timeout=10) as resp:
                apps = json.loads(resp.read())
        except OSError:
            return None
        (app,) = [a for a in apps if a["name"] == f"eos-{NAME}"]
        return app

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)    # Ctrl-C: it ends its kubectl port-forward
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def the_ui_service(v1, namespace: str, stream_uid: str) -> str:
    """The Service the operator made for job.metrics.uiService, as it must be: owned by the stream, ClusterIP,
    one port named spark-ui to the driver's UI port (by its name), selecting the stream's UI-serving drivers."""
    svc = v1.read_namespaced_service(f"{NAME}-ui", namespace)
    (owner,) = svc.metadata.owner_references
    assert (owner.kind, owner.uid, owner.controller) == ("ExactlyOnceStream", stream_uid, True), owner
    assert svc.spec.type == "ClusterIP" and svc.spec.cluster_ip not in (None, "", "None"), svc.spec
    assert [(p.name, p.port, p.target_port) for p in svc.spec.ports] == [("spark-ui", 4040, "metrics")], svc.spec.ports
    assert svc.spec.selector == {**stream_selector(NAME), LABEL_DRIVER_METRICS: "true"}, svc.spec.selector
    return f"Service {NAME}-ui ({svc.spec.cluster_ip}, port spark-ui)"


def test_operator_runs_the_unique_id_stream_on_real_nodes_through_a_grace_0_driver_deletion(
        stack_env, nodes, kubectl, namespace, tmp_path, report_result, monkeypatch):
    from eos_stack import node_services
    from eos_stack.common import Stack
    pod_env = node_services.pod_env(Stack())     # not .stack/env: test workers rewrite it concurrently
    topics = ColorsTopics(stack_env["KAFKA_BOOTSTRAP"])
    ledger = topics.ledger(namespace, NAME)
    kubectl.apply(keys_secret(stack_env), namespace)
    operator = OperatorProcess(stack_env["KUBECONFIG"], namespace, tmp_path / "operator.log").start()

    def pod(name: str) -> dict | None:
        return next((p for p in kubectl.pods(namespace) if p["metadata"]["name"] == name), None)

    api = config.new_client_from_config(config_file=stack_env["KUBECONFIG"])
    v1, crs = client.CoreV1Api(api), client.CustomObjectsApi(api)

    def status() -> dict:
        return stream_status(crs, namespace, NAME)

    def committed() -> int:
        return committed_batch(status())

    def driver_log() -> str:
        d = status().get("driverPod") or f"{NAME}-driver-0"
        return kubectl.run("logs", "-n", namespace, d, "--tail=30", check=False).stdout

    def crd_note() -> str:
        # The API server is shared: a checkout whose CRD lacks the field applies it, the server prunes the field
        # from the stored stream, and the operator sees a spec change (an upgrade whose Pods nobody schedules).
        crd = kubectl.run("get", "crd", "exactlyoncestreams.streaming.eos.dev", "-o", "json", check=False).stdout
        return "" if "schedulerName" in crd else ("\nthe API server's ExactlyOnceStream CRD has no "
                                                   "podTemplate.schedulerName: another checkout's CRD replaced it")

    diag = Diagnostics(kubectl, namespace, operator)
    diagnose = lambda: diag() + "\ndriver log:\n" + driver_log() + crd_note()   # noqa: E731
    feed = IdFeed(topics.bootstrap, topics.events, chunk=100, pause=1.0)
    with AdminClient({"bootstrap.servers": topics.bootstrap}) as admin:

        def open_now() -> set:
            md = admin.list_topics(timeout=10).topics
            return open_transaction_partitions(admin, md, [topics.counts, ledger], 10)

        ui_cmd = None
        try:
            feed.send(4 * BATCH, 7, 1_000_000)    # a backlog: four full batches at the start, then the feed's chunks
            crs.create_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, real_node_stream(
                topics, pod_env, stack_env["S3_BUCKET"], f"/e2e-real/{namespace}"))
            first = wait_until(lambda: (lambda p: p if p and p.get("status", {}).get("phase") == "Running" else None)(
                pod(f"{NAME}-driver-0")), "the first driver Pod to run on a real node", 300, diagnose, 1)
            first_node = on_a_real_node(first, nodes)
            feed.start()
            wait_until(lambda: committed() >= 0,
                       "a batch committed by the first driver", 420, diagnose, 1)
            # `kubectl eos ui` runs the kubectl on PATH: the stack's, of the API server's version.
            monkeypatch.setenv("PATH", f"{os.path.dirname(stack_env['KUBECTL'])}{os.pathsep}{os.environ['PATH']}")
            ui_seen, first_app = spark_ui_through_port_forward(crs, namespace, stack_env["KUBECONFIG"])
            t0 = time.monotonic()    # the Spark UI Service's checks: their time is reported (the test's added time)
            stream_uid = crs.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL,
                                                          NAME)["metadata"]["uid"]
            service_seen = the_ui_service(v1, namespace, stream_uid)
            assert status().get("uiService") == f"{NAME}-ui", status()
            ui_cmd = UiCommand(namespace, stack_env["KUBECONFIG"])
            assert f"svc/{NAME}-ui" in ui_cmd.first, ui_cmd.first          # through the Service, not the Pod
            assert (ui_cmd.app() or {}).get("id") == first_app, (ui_cmd.first, ui_cmd.err[-2000:])
            ui_seconds = time.monotonic() - t0
            log = LogFollower(v1, namespace, f"{NAME}-driver-0")
            log.start()
            procs = pod_processes(first["metadata"]["uid"])
            assert len(procs) >= 2, f"the driver's processes (JVM, Python) in its Pod's cgroup: {procs}"
            before = status()["lastCommittedBatch"]

            # The backlog keeps the driver inside a batch; the deletion follows the sight of an open slot transaction
            # in the sink or the ledger at once (one admin client, the Pod deleted through the API, no kubectl).
            in_flight = wait_until(lambda: open_now() or None, "an open slot transaction", 120, diagnose, 0.01)
            v1.delete_namespaced_pod(f"{NAME}-driver-0", namespace, grace_period_seconds=0)
            gone_s = wait_processes_gone(procs)
            log.join(30)
            sigterm = GRACEFUL in log.text
            assert not pod_processes(first["metadata"]["uid"]), "a process joined the deleted Pod's cgroup"

            after_kill = wait_until(lambda: (lambda s: s if s.get("driverPod") == f"{NAME}-driver-1"
                                         and s.get("lifecycleState") == "Running" else None)(
                status()), "the operator's next driver Pod to run", 300, diagnose, 1)
            second_node = on_a_real_node(pod(f"{NAME}-driver-1"), nodes)
            assert after_kill["restartCount"] == 1 and "disappeared" in after_kill["lastError"], after_kill
            reasons = kubectl.events(namespace, NAME)
            after = reasons[reasons.index("Restarting"):]
            assert "Resolved" in after and after.index("Resolved") < after.index("Submitted"), reasons
            res = after_kill["resolution"]
            # Resolved from the host through the services address: the bucket read, every slot of the stream fenced.
            assert res["checkpointReadable"] and res["slots"] == 2 and res["fencedTransactionalIds"] >= 2, res
            # ``before`` is the ledger's progress (status.lastCommittedBatch): a batch is complete in the ledger just
            # before Spark's commit log records it, so the checkpoint may trail it by the batch in flight.
            assert res["lastCompleteBatch"] >= before and res["checkpointLastCommittedBatch"] >= before - 1, \
                (before, res)
            per_slot = {int(s): b for s, b in (res.get("lastCommittedBatchPerSlot") or {}).items()}
            assert set(per_slot) == {0, 1} and min(per_slot.values()) >= before, res
            replay = res.get("replayBatch")
            if replay is not None:   # the slots the report says committed the replay batch are those its ledger has
                assert sorted(res.get("replaySlotsAlreadyCommitted") or []) == sorted(
                    s for s, b in per_slot.items() if b >= replay), res
            wait_until(lambda: committed() >= res["checkpointLastCommittedBatch"] + 3,
                       "three batches committed by the next driver", 420, diagnose, 1)
            # The same `kubectl eos ui` URL, kept running through the kill: the next driver answers through the Service.
            t0 = time.monotonic()
            second = wait_until(lambda: (lambda a: a if a and a["id"] != first_app else None)(ui_cmd.app()),
                                "kubectl eos ui's URL to answer with the next driver's application", 120,
                                lambda: diagnose() + "\nkubectl eos ui: " + ui_cmd.err[-3000:], 1)
            _, second_app = spark_ui_through_port_forward(crs, namespace, stack_env["KUBECONFIG"])
            # What the URL answers is the current driver's application (the same id as a forward straight to
            # driver-1), and the id tells the drivers apart (the first one answered with another id before).
            assert second["id"] == second_app != first_app, (second, second_app, first_app)
            assert f"forwarding svc/{NAME}-ui again on {ui_cmd.url}" in ui_cmd.err, ui_cmd.err[-3000:]
            ui_cmd.stop()
            ui_seconds += time.monotonic() - t0

            # A drain of the second driver's node, as `kubectl drain` does it for this Pod: cordon, then the Eviction
            # API (not `kubectl drain` itself: its selector cannot be held to this namespace, and other tests' Pods
            # share the nodes). The eviction is a planned stop: no restart counted, and the next driver lands on the
            # other node.
            drained = drain_driver(v1, kubectl, namespace, f"{NAME}-driver-1", second_node)
            try:
                after_drain = wait_until(lambda: (lambda s: s if s.get("driverPod") == f"{NAME}-driver-2"
                                             and s.get("lifecycleState") == "Running" else None)(
                    status()), "the driver after the drain to run", 300, diagnose, 1)
                third_node = on_a_real_node(pod(f"{NAME}-driver-2"), nodes)
            finally:
                kubectl.run("uncordon", second_node)
            assert third_node != second_node, f"the drained node {second_node} got the next driver"
            assert after_drain["restartCount"] == 1, f"the eviction was counted as a failure: {after_drain}"
            reasons = kubectl.events(namespace, NAME)
            assert "DriverEvicting" in reasons and "DriverEvicted" in reasons, reasons
            drained_at = committed()
            wait_until(lambda: committed() >= drained_at + 2, "two batches committed after the drain", 420, diagnose, 1)
            expected = feed.finish()
            wait_ids(topics.bootstrap, topics.counts, expected, diagnose, timeout=420)
            assert_ids_exactly_once(topics.bootstrap, topics.counts, ledger, expected, (topics.dlq,))
            # Turned off: the Service goes, the driver stays (an operator-only field, no restart).
            t0 = time.monotonic()
            crs.patch_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, NAME,
                                               {"spec": {"job": {"metrics": {"uiService": False}}}})
            wait_until(lambda: not gone_or(lambda: v1.read_namespaced_service(f"{NAME}-ui", namespace))
                       and not status().get("uiService"), "the Spark UI Service deleted", 60, diagnose, 1)
            after_off = status()
            assert (after_off["driverPod"], after_off["restartCount"], after_off["lifecycleState"]) == (
                f"{NAME}-driver-2", 1, "Running"), after_off
            ui_seconds += time.monotonic() - t0
            report_result(f"real nodes, under the operator: {len(expected)} ids exactly once through a grace-0 "
                          f"deletion of {NAME}-driver-0 on {first_node} after batch {before} with {len(in_flight)} "
                          f"partitions in open transactions ({len(procs)} processes in {len(set(procs.values()))} "
                          f"process groups, gone {gone_s:.1f} s after the deletion, SIGTERM "
                          f"{'logged' if sigterm else 'not logged'} by the driver); the kill hit "
                          f"{what_the_kill_hit(res)}; {NAME}-driver-1 resumed on {second_node}; {ui_seen}; "
                          f"{service_seen}: kubectl eos ui's one URL answered {first_app}, then {second_app} after the "
                          f"restart; turned off, it was deleted, no restart ({ui_seconds:.1f} s of checks); "
                          f"{drained}, {NAME}-driver-2 resumed on {third_node}, restarts still "
                          f"{after_drain['restartCount']}")
        finally:
            if ui_cmd is not None:
                ui_cmd.stop()
            feed.stop_flag.set()
            try:    # the operator stops the driver gracefully and releases the stream
                crs.delete_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, NAME)
                wait_until(lambda: not gone_or(status), "the stream deleted", 120)
            except Exception as exc:  # noqa: BLE001 - cleanup; the namespace fixture releases what is left
                print(f"cleanup: {exc}")
            operator.stop()
            api.close()
