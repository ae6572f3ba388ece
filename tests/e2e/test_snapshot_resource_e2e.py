"""ExactlyOnceSnapshot on the real stack: the operator process, the real nodes running the driver and the
snapshot Pods' real commands (``python -m eos_job snapshot take|dispose``), a colors stream on real Spark and
Kafka, its checkpoint and snapshots in the stack's bucket.

One stream start: snapshots are taken of it while it runs, a snapshot of a missing stream fails, deleting a
snapshot disposes its files (or keeps them when asked to), and a snapshot outlives its stream: its dispose Pod,
made from what the snapshot recorded, still runs on the stream's nodes (their scheduler and taint: the
placement recorded with the snapshot's access; without it the Pod would wait for a scheduler forever).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from eos_job.spec import stream_uid
from eos_job.storage import Loc, S3Options
from eos_stack.cluster import Kubectl, wait_until
from examples.colors.generator import produce
from tests.e2e.streams import ColorsTopics, Diagnostics, colors_stream

pytestmark = pytest.mark.stack

REPO = Path(__file__).resolve().parents[2]
SNAPSHOT_LABEL = "streaming.eos.dev/snapshot"


@pytest.fixture
def release_snapshots(kubectl, namespace):
    """After the test (the operator is gone by then): let go of snapshots still held by the finalizer."""
    yield
    for s in kubectl.json("get", "exactlyoncesnapshots", "-n", namespace)["items"]:
        kubectl.run("patch", "exactlyoncesnapshot", s["metadata"]["name"], "-n", namespace, "--type=merge", "-p",
                    '{"metadata":{"finalizers":null}}', check=False)


class SnapshotDiagnostics(Diagnostics):
    def __call__(self) -> str:
        parts = []
        try:
            for s in self.kubectl.json("get", "exactlyoncesnapshots", "-n", self.namespace)["items"]:
                parts.append(f"snapshot {s['metadata']['name']} status: {json.dumps(s.get('status'))}")
        except Exception as exc:  # noqa: BLE001 - diagnostics must not hide the failure
            parts.append(f"(could not read snapshots: {exc})")
        if self.kubelet is not None:
            for log in sorted(self.kubelet.log_dir.glob(f"{self.namespace}_*-snap-*.log")) + sorted(
                    self.kubelet.log_dir.glob(f"{self.namespace}_*-dispose-*.log")):
                parts.append(f"{log.name}:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(parts) + "\n" + super().__call__()


def snapshot(name: str, stream: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "streaming.eos.dev/v1beta1", "kind": "ExactlyOnceSnapshot",
            "metadata": {"name": name}, "spec": {"stream": stream, **spec}}


def snap_status(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    return kubectl.json("get", "exactlyoncesnapshot", name, "-n", namespace).get("status") or {}


def state_is(kubectl: Kubectl, namespace: str, name: str, state: str):
    return lambda: (lambda s: s if s.get("state") == state else None)(snap_status(kubectl, namespace, name))


def snapshot_events(kubectl: Kubectl, namespace: str, name: str) -> list[dict[str, Any]]:
    return [e for e in kubectl.event_objects(namespace, name) if e["involvedObject"].get("kind") ==
            "ExactlyOnceSnapshot"]


def pods_of(kubectl: Kubectl, namespace: str, snap: str) -> list[str]:
    items = kubectl.json("get", "pods", "-n", namespace, "-l", f"{SNAPSHOT_LABEL}={snap}")["items"]
    return [p["metadata"]["name"] for p in items]


@pytest.mark.real_nodes
def test_snapshot_resource_take_list_fail_dispose_keep(stack_env, nodes, kubectl, namespace, kubelet, operator,
                                                       on_nodes, tmp_path, release_snapshots):
    help_ = subprocess.run([sys.executable, "-m", "eos_job", "snapshot", "--help"], capture_output=True, text=True,
                           cwd=REPO)
    assert help_.returncode == 0 and "dispose" in help_.stdout, help_.stderr
    diag = SnapshotDiagnostics(kubectl, namespace, operator, kubelet)
    topics = ColorsTopics(stack_env["KAFKA_BOOTSTRAP"])
    stream_doc = on_nodes.place(colors_stream("colors", topics, tmp_path / "checkpoint"))
    checkpoint = stream_doc["spec"]["checkpoint"]["path"]
    s3 = S3Options(endpoint=stack_env["S3_ENDPOINT"], path_style=True, access_key=stack_env["S3_ACCESS_KEY"],
                   secret_key=stack_env["S3_SECRET_KEY"])

    def stored(path: str) -> Loc:
        """A snapshot's files as this machine reads them from the bucket."""
        return Loc.of(path if "://" in path else f"s3a://{stack_env['S3_BUCKET']}{path}", s3)

    produce(topics.bootstrap, topics.events, 2000)
    kubectl.apply(stream_doc, namespace)
    status = wait_until(lambda: (lambda s: s if s.get("lifecycleState") == "Running"
                                 and s.get("lastCommittedBatch") is not None else None)(
        kubectl.status(namespace, "colors")), "the stream to run and commit a batch", 240, diag, 1)
    driver = status["driverPod"]

    # 1. A snapshot of the running stream.
    kubectl.apply(snapshot("colors-manual", "colors"), namespace)
    done = wait_until(state_is(kubectl, namespace, "colors-manual", "Completed"), "colors-manual to complete",
                      180, diag, 1)
    path = stored(done["path"])
    assert done["path"].endswith(f"{checkpoint}/snapshots/colors-manual"), done["path"]
    assert isinstance(done["batch"], int) and done["batch"] >= 0
    assert done["streamUid"] == stream_uid(namespace, "colors") and done["attempts"] == 1
    assert done["sizeBytes"] > 0 and done["takenAt"] and done.get("checkpointId")
    manifest = json.loads((path / "eos-snapshot.json").read_text())
    assert manifest["lastBatch"] == done["batch"] and manifest["stream"]["uid"] == done["streamUid"]
    assert pods_of(kubectl, namespace, "colors-manual") == [], "the attempt Pod is removed once read"
    assert (kubelet.log_dir / f"{namespace}_colors-manual-snap-1.log").exists()
    reasons = [e["reason"] for e in snapshot_events(kubectl, namespace, "colors-manual")]
    assert reasons == ["SnapshotStarted", "SnapshotCompleted"], reasons
    # The stream was not disturbed: the same driver runs on.
    after = kubectl.status(namespace, "colors")
    assert after["lifecycleState"] == "Running" and after["driverPod"] == driver

    # kubectl get eoss: the printer columns.
    table = kubectl.run("get", "eoss", "-n", namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "STREAM", "BATCH", "PATH", "STATE", "AGE"], table
    row = next(line.split() for line in table[1:] if line.startswith("colors-manual "))
    assert row[:5] == ["colors-manual", "colors", str(done["batch"]), done["path"], "Completed"], row

    # 2. A snapshot of a stream that does not exist fails at once, saying what to do.
    kubectl.apply(snapshot("ghost-snap", "ghost"), namespace)
    failed = wait_until(state_is(kubectl, namespace, "ghost-snap", "Failed"), "ghost-snap to fail", 60, diag)
    assert "stream ghost does not exist" in failed["message"], failed
    assert "create the ExactlyOnceStream ghost" in failed["message"], failed
    assert failed["attempts"] == 0 and pods_of(kubectl, namespace, "ghost-snap") == []
    messages = kubectl.event_messages(namespace, "ghost-snap", "SnapshotFailed")
    assert messages and "stream ghost does not exist" in messages[0]

    # 3. Two snapshots deleted after their stream is gone: one keeps its files, one disposes them.
    kubectl.apply(snapshot("colors-keep", "colors", disposeOnDelete=False), namespace)
    kubectl.apply(snapshot("colors-orphan", "colors"), namespace)
    kept = wait_until(state_is(kubectl, namespace, "colors-keep", "Completed"), "colors-keep to complete", 180,
                      diag, 1)
    assert kept["batch"] >= done["batch"]
    orphan = wait_until(state_is(kubectl, namespace, "colors-orphan", "Completed"), "colors-orphan to complete",
                        180, diag, 1)
    assert orphan["access"]["mountPath"] == checkpoint, orphan
    assert orphan["access"]["placement"]["schedulerName"] == stream_doc["spec"]["job"]["podTemplate"]["schedulerName"]

    # 4. Deleting a snapshot disposes its files (a dispose Pod), then the finalizer lets it go.
    kubectl.run("delete", "exactlyoncesnapshot", "colors-manual", "-n", namespace, "--timeout=120s")
    assert not path.exists(), f"{path} should have been disposed"
    assert (kubelet.log_dir / f"{namespace}_colors-manual-dispose-0.log").exists()
    assert pods_of(kubectl, namespace, "colors-manual") == []
    disposed = kubectl.event_messages(namespace, "colors-manual", "SnapshotDisposed")
    assert disposed and done["path"] in disposed[0]

    # 5. The stream goes; its snapshot stays (no owner reference), and deleting it keeps the files as asked.
    kubectl.run("delete", "exactlyoncestream", "colors", "-n", namespace, "--timeout=120s")
    assert snap_status(kubectl, namespace, "colors-keep")["state"] == "Completed"
    kubectl.run("delete", "exactlyoncesnapshot", "colors-keep", "-n", namespace, "--timeout=60s")
    keep_path = stored(kept["path"])
    assert (keep_path / "eos-snapshot.json").is_file(), "disposeOnDelete: false keeps the files"
    messages = kubectl.event_messages(namespace, "colors-keep", "SnapshotKept")
    assert messages and kept["path"] in messages[0]
    # ... and with disposeOnDelete its files go, through the image, store and placement it recorded when taken:
    # with its stream gone, the dispose Pod still runs on the real nodes.
    orphan_path = stored(orphan["path"])
    assert (orphan_path / "eos-snapshot.json").is_file()
    kubectl.run("delete", "exactlyoncesnapshot", "colors-orphan", "-n", namespace, "--timeout=120s")
    assert not orphan_path.exists(), f"{orphan_path} should have been disposed without its stream"
    assert (kubelet.log_dir / f"{namespace}_colors-orphan-dispose-0.log").exists()
    assert kubectl.event_messages(namespace, "colors-orphan", "SnapshotDisposed")
    kubectl.run("delete", "exactlyoncesnapshot", "ghost-snap", "-n", namespace, "--timeout=60s")
