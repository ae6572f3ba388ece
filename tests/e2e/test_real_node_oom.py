"""A driver that passes its memory limit on a real node: the kernel kills it, and the operator says so.

The retired process kubelet (a test stand-in node) had no cgroups, so no memory limit was ever enforced there.
Here the stream's driver runs on a real node with ``job.driver.memory: 1Gi`` (the operator splits it: 480 MiB of
JVM heap, 320 of JVM overhead, 224 for Python, ``eos_job.memory``) and the job ``examples.colors.hog``, whose
driver grows its Python memory until the container's cgroup limit is passed. What is checked:

- the kernel's OOM kill, as the kubelet reports it: the driver Pod's container terminated with reason
  ``OOMKilled``, the limit being the spec's 1Gi;
- the JVM was started with the heap the split gives (``-Xmx480m`` in the JVM's command line, read from
  ``/proc`` of the container's processes through its cgroup) rather than Spark's fixed 1g;
- the operator counts it as a failure by the restart strategy, which says whether it runs again: here
  ``fixed-delay`` with no attempts, so the stream is ``Failed`` (no second driver Pod, the container not
  restarted in place: ``restartPolicy: Never``) rather than a driver killed again and again; its
  ``status.lastError`` and the ``DriverFailed`` event say ``OOMKilled``, the split and the field to raise
  (``job.driver.memory 1Gi (...JVM heap 480 MiB...): raise job.driver.memory``).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from kubernetes import client, config

from eos_job.spec import API_GROUP, API_VERSION, PLURAL
from eos_stack.cluster import wait_until
from tests.e2e.streams import NAME, ColorsTopics, Diagnostics, OperatorProcess
from tests.e2e.test_real_node_stream import keys_secret, on_a_real_node, real_node_stream
from tests.harness.real_nodes import pod_processes, read_pod

pytestmark = pytest.mark.timeout(600)
HOG = "examples.colors.hog"


def java_heap(procs: dict[int, int]) -> str | None:
    """The ``-Xmx`` of the JVM among ``procs`` (pid -> process group), from its command line."""
    for pid in procs:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        # The driver's JVM (SparkSubmit), not the short-lived launcher JVM spark-submit runs first to work out
        # the driver's command line (``-Xmx128m ... org.apache.spark.launcher.Main
        # org.apache.spark.deploy.SparkSubmit ...``: SparkSubmit is in its arguments too).
        if (argv and argv[0].endswith(b"java") and b"org.apache.spark.deploy.SparkSubmit" in argv
                and b"org.apache.spark.launcher.Main" not in argv):
            return next((a.decode()[4:] for a in argv if a.startswith(b"-Xmx")), None)
    return None


def test_a_driver_past_its_memory_limit_is_oom_killed_and_the_operator_names_the_field(
        stack_env, nodes, kubectl, namespace, tmp_path, report_result):
    from eos_stack import node_services
    from eos_stack.common import Stack
    pod_env = node_services.pod_env(Stack())
    topics = ColorsTopics(stack_env["KAFKA_BOOTSTRAP"])
    kubectl.apply(keys_secret(stack_env), namespace)
    operator = OperatorProcess(stack_env["KUBECONFIG"], namespace, tmp_path / "operator.log").start()
    api = config.new_client_from_config(config_file=stack_env["KUBECONFIG"])
    v1, crs = client.CoreV1Api(api), client.CustomObjectsApi(api)

    def status() -> dict:
        return crs.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, NAME).get("status") or {}

    def driver(name: str):
        return read_pod(v1, namespace, name)

    diagnose = Diagnostics(kubectl, namespace, operator)
    doc = real_node_stream(topics, pod_env, stack_env["S3_BUCKET"], f"/e2e-oom/{namespace}")
    doc["spec"]["job"].update({"module": HOG, "driver": {"cpu": "1", "memory": "1Gi"},
                               "args": {"growMiB": "16", "growEverySeconds": "0.25"}})
    doc["spec"]["restartStrategy"] = {"type": "fixed-delay", "fixedDelay": {"attempts": 0, "delaySeconds": 1}}
    doc["spec"]["job"].pop("metrics", None)
    first = f"{NAME}-driver-0"
    try:
        crs.create_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, doc)
        running = wait_until(lambda: (lambda p: p if p and p.status.phase == "Running" else None)(driver(first)),
                             "the hog's driver Pod to run on a real node", 300, diagnose, 0.5)
        node = on_a_real_node(client.ApiClient().sanitize_for_serialization(running), nodes)
        heap = wait_until(lambda: java_heap(pod_processes(running.metadata.uid)), "the driver's JVM", 120,
                          diagnose, 0.5)
        assert heap == "480m", f"the driver JVM's -Xmx is {heap}, not the split's 480m for a 1Gi container"

        def oom_killed():
            pod = driver(first)
            for cs in (pod.status.container_statuses or []) if pod else []:
                term = cs.state.terminated or (cs.last_state.terminated if cs.last_state else None)
                if term is not None:
                    return term
            return None

        term = wait_until(oom_killed, "the kernel to kill the driver at its 1Gi limit", 240, diagnose, 0.5)
        # The kernel kills the largest process of the cgroup (the JVM or the hog); the container runtime saw the
        # cgroup's OOM event either way and says OOMKilled, whatever the exit code the main process then had.
        assert term.reason == "OOMKilled", f"{term.reason} (exit {term.exit_code}): {term.message}"
        after = wait_until(lambda: (lambda s: s if s.get("lifecycleState") == "Failed" else None)(status()),
                           "the operator to count the failure and stop (no restart attempts)", 120, diagnose, 0.5)
        error = after["lastError"]
        assert "OOMKilled" in error and "job.driver.memory 1Gi" in error and "JVM heap 480 MiB" in error, after
        assert "raise job.driver.memory" in error, after
        events = kubectl.json("get", "events", "-n", namespace)["items"]
        failed = [e for e in events if e.get("reason") == "DriverFailed"]
        assert len(failed) == 1 and failed[0].get("count", 1) == 1, failed
        message = failed[0]["message"]
        assert "raise job.driver.memory" in message and "JVM heap 480 MiB" in message, message
        assert [e for e in events if e.get("reason") == "RestartsExhausted"], "no RestartsExhausted event"
        # No restart in a loop: no second driver Pod, and the kernel's kill did not restart the container.
        drivers = sorted(p.metadata.name for p in v1.list_namespaced_pod(namespace).items
                         if p.metadata.name.startswith(f"{NAME}-driver-"))
        assert drivers == [first], drivers
        kept = driver(first)     # kept for its log (local deploy mode)
        assert kept is not None and [c.restart_count for c in kept.status.container_statuses] == [0], kept
        report_result(f"real node {node}: {first} (job.driver.memory 1Gi, -Xmx{heap}) OOMKilled by the kernel "
                      f"(exit {term.exit_code}); the stream Failed with no restart (attempts 0), lastError: "
                      f"{after['lastError'][:240]}")
    finally:
        try:
            crs.delete_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, NAME)
        except client.ApiException as exc:
            print(f"cleanup: {exc}")
        operator.stop()
        api.close()
