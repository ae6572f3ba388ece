"""The process kubelet's driver stand-in (tests/harness/standin.py): a driver toward Kafka, without Spark.

One stream's driver Pod as the operator builds it (``children.driver_pod`` and its run ConfigMap), image
``eos-standin:test``, run by a process kubelet in stand-in mode: its batches reach the ledger as the job's
own readers see them, SIGTERM stops it at a clean boundary with exit 0, the next driver takes the next epoch
and continues the checkpoint, and SIGKILL leaves the Pod Failed with what resolution then finds consistent
(between batches, or inside one: a batch some slots committed, which the restart replays skipping them).
"""
from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kubernetes import client

from eos_job import checkpoint, protocol
from eos_job.ledger import ledger_consumer, read_latest
from eos_job.resolution import last_batch_record, resolve
from eos_job.spec import ExactlyOnceStreamSpec
from eos_job.verify import ledger_monotone
from eos_operator import children
from eos_stack.cluster import wait_until
from examples.colors.manifest import colors_manifest
from tests.harness.kubelet import ProcessKubelet

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def topics(bootstrap):
    run = uuid.uuid4().hex[:8]
    names = [f"standin-src-{run}", f"standin-sink-{run}"]
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        for fut in admin.create_topics([NewTopic(t, 1, 1) for t in names], operation_timeout=30).values():
            fut.result(60)
        yield names
        ledgers = [t for t in admin.list_topics(timeout=30).topics if t.startswith(f"{names[1]}.eos-ledger.")]
        admin.delete_topics(names + ledgers, operation_timeout=30)


def orphan(body: dict) -> dict:
    """No stream object here: the garbage collector would delete what names one as its owner."""
    body["metadata"].pop("ownerReferences")
    return body


def test_standin_driver_pod(stack_env, api, namespace, bootstrap, topics, tmp_path):
    v1 = client.CoreV1Api(api)
    ref = children.StreamRef("s1", namespace, "uid-" + uuid.uuid4().hex[:8])
    manifest = colors_manifest("s1", bootstrap, topics[0], topics[1], tmp_path / "ckpt", parallelism=2,
                               job={"image": "eos-standin:test"})
    spec = ExactlyOnceStreamSpec.model_validate(manifest["spec"])
    cfg = children.run_config(ref, spec, 0)
    ledger = cfg.ledger_topic()

    def phase(name: str) -> dict:
        pod = v1.read_namespaced_pod(name, namespace)
        state = pod.status.container_statuses[0].state if pod.status.container_statuses else None
        return {"phase": pod.status.phase, "terminated": state.terminated if state else None}

    with ProcessKubelet(stack_env["KUBECONFIG"], namespace=namespace, log_dir=tmp_path / "pods",
                        standin_image="eos-standin*", extra_env={"EOS_STANDIN_BATCH_SECONDS": "0.3"}) as kubelet:
        v1.create_namespaced_config_map(namespace, orphan(children.run_config_map(ref, cfg)))
        driver = lambda attempt: orphan(children.driver_pod(ref, spec, attempt=attempt, tx_generation=0))  # noqa: E731
        name0 = v1.create_namespaced_pod(namespace, driver(0)).metadata.name
        # The job's own reader of the ledger (the operator's progress read) sees the batches go by.
        wait_until(lambda: (last_batch_record(cfg) or protocol.BatchCompleteRecord(-1, 2, 0, 0)).batch >= 2,
                   "three batches in the ledger", 30, interval=0.2)
        pid = kubelet.pid(namespace, name0)
        assert pid is not None and os.getpgid(pid) == pid   # its own process group, as the kubelet signals it
        parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        assert "--zygote" in Path(f"/proc/{parent}/cmdline").read_text()   # forked from the kubelet's zygote
        assert " /run/eos-scratch " in Path(f"/proc/{pid}/mountinfo").read_text()   # with the Pod's emptyDir
        os.kill(pid, signal.SIGTERM)
        ended = wait_until(lambda: (p := phase(name0))["terminated"] and p, "the first stand-in to end", 30)
        assert ended["phase"] == "Succeeded" and ended["terminated"].exit_code == 0, ended
        assert '"reason": "Stopped"' in ended["terminated"].message
        ckpt = cfg.checkpoint_dir
        stopped_at = checkpoint.last_committed_batch(ckpt)
        assert checkpoint.replay_batch(ckpt) is None   # a clean boundary: no batch logged without its commit
        assert last_batch_record(cfg).batch == stopped_at

        name1 = v1.create_namespaced_pod(namespace, driver(1)).metadata.name
        wait_until(lambda: last_batch_record(cfg).batch >= stopped_at + 2, "the second stand-in's batches", 30,
                   interval=0.2)
        assert kubelet.kill9(namespace, name1)
        killed = wait_until(lambda: (p := phase(name1))["terminated"] and p, "the killed stand-in's Pod", 30)
        assert killed["phase"] == "Failed" and killed["terminated"].exit_code == 137, killed

    # What the second driver left, as resolution (the operator's, before a restart) finds it.
    report = resolve(cfg, timeout_s=30)
    assert report.fenced_transactional_ids == 2 + 1, report.summary
    assert report.last_complete_batch >= stopped_at + 2
    # A SIGKILL lands anywhere: between batches, or between one slot's commit and the other's. Then the batch
    # after the ledger's last complete one is logged in the checkpoint without its commit, and the slots that
    # committed it are those whose ledger records say so: the restart replays it and skips them.
    if report.partially_committed:
        assert report.replay_batch == report.last_complete_batch + 1, report.summary
        assert report.replay_slots_already_committed == sorted(
            int(s) for s, b in report.last_committed_batch_per_slot.items() if b == report.replay_batch), \
            report.summary
    consumer = ledger_consumer(bootstrap)
    try:
        key = protocol.slot_key(cfg.stream.uid, report.checkpoint_id, 0, 1)
        slot = protocol.SlotLedgerRecord.decode(read_latest(consumer, ledger, protocol.ledger_partition(1), key))
    finally:
        consumer.close()
    assert slot.epoch == 2 and slot.batch >= report.last_complete_batch   # the second driver's epoch
    assert ledger_monotone(bootstrap, ledger, timeout_s=30) == []
