"""``sink.writer: jvm`` in the image: the operator runs the unique-id stream with the JVM slot writer, its driver
Pods on the real nodes (tests/e2e/on_nodes.py), the writer's jar the one the image carries
(``EOS_SLOT_WRITER_JAR``, Dockerfile stage ``slotwriter``; nothing of the test's machine reaches a Pod).

The stream keeps its dead-letter topic (the JVM writer routes poison records there; the unique-id stream makes
none) and sets ``sink.producerConfig`` in librdkafka's names, which the JVM writer maps to the Java producer's
(``queue.buffering.max.ms`` to ``linger.ms``, ``compression.codec`` lz4 to ``compression.type``). Mid-stream the driver's container is SIGKILLed (every process of it, the JVM's slot tasks included): the operator
resolves the ledger the JVM wrote and starts the next driver, which goes on with the JVM writer. The output is
audited as the other e2e tests audit it (``finish_ids``: every kept id sent, set equality, none twice,
read_committed; the ledger only grew; no open transaction; every committed slot against the ledger's count and
digest). Without the jar in the image the driver fails its first batch (``jvm_writer``: "the JVM slot writer's
jar is not on spark.jars") and no id is written, so the audit fails.
"""
from __future__ import annotations

import pytest

from eos_stack.cluster import wait_until
from tests.e2e.streams import IDS, NAME, finish_ids, rig

pytestmark = pytest.mark.stack

IMAGE_JAR = "/opt/eos-slot-writer/eos-slot-writer.jar"   # the Dockerfile's EOS_SLOT_WRITER_JAR


@pytest.mark.real_nodes
def test_the_jvm_writer_runs_in_the_image_on_real_nodes_through_a_driver_kill(
        stack_env, nodes, kubectl, namespace, on_nodes, tmp_path, report_result):
    with rig(stack_env, kubectl, namespace, tmp_path, on_nodes=on_nodes) as r:
        doc = r.stream(IDS)
        doc["spec"]["sink"]["writer"] = "jvm"
        assert doc["spec"]["sink"]["deadLetterTopic"]     # set (the unique-id stream makes no dead letter)
        # librdkafka names, which the JVM writer maps to the Java producer's (linger.ms, compression.type).
        doc["spec"]["sink"]["producerConfig"] = {"queue.buffering.max.ms": "20", "compression.codec": "lz4"}
        feed = r.run_ids(doc, seed=29)

        def committed() -> int:
            batch = r.status().get("lastCommittedBatch")
            return -1 if batch is None else batch      # batch 0 counts

        first = committed()
        wait_until(lambda: committed() >= first + 2,
                   "two more batches by the first driver", 240, r.diag, 1)
        assert r.kubelet.kill9(namespace, f"{NAME}-driver-0"), "the first driver ran no process"
        st = r.wait_status(lambda s: s.get("driverPod") == f"{NAME}-driver-1"
                           and s.get("lifecycleState") == "Running", "the next driver after the kill", 300)
        assert st["restartCount"] == 1 and st["resolution"]["slots"] == 2, st
        after = committed()
        wait_until(lambda: committed() >= after + 2,
                   "two batches by the second driver", 240, r.diag, 1)
        ids = finish_ids(r, feed)
        log = kubectl.run("logs", "-n", namespace, f"{NAME}-driver-1", check=False).stdout
        # The slot tasks ran the image's jar (jvm_writer says so at its first batch).
        assert f"sink.writer jvm: the slot tasks run eos.slotwriter.SparkEntry of {IMAGE_JAR}" in log, log[-3000:]
        report_result(f"sink.writer jvm in the image on the real nodes: {len(ids)} unique ids exactly once "
                      f"through a driver SIGKILL (resolved {st['resolution']['slots']} slots)")
