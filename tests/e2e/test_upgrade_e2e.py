"""The snapshot upgrade on the real stack: operator, process kubelet, real runtime, real Kafka, and the
checkpoint on the stack's S3 server (the production shape: ``checkpoint.store: s3``, keys in a Secret; Kafka
only through the SASL_SSL listener as the stream's own SCRAM user with its ACLs).

The colors stream is upgraded (``EOS_UPGRADES`` times in a row, once in ``make test``) to a changed transformation
(``job.args.version``: same key and count, one more JSON field) while events keep
arriving. Each upgrade stops the driver at a clean batch boundary with a snapshot
(server-side copies in the bucket) and starts the new spec in a new checkpoint location
seeded from it. The operator reads the snapshot manifests and the checkpoints straight from
the bucket with the keys of the stream's Secret (its own environment has none). After the
upgrades, the output is exactly once (final counts, no count update twice), and the
output gap of each upgrade is measured from the read_committed record timestamps.

It stays on the counting job: its point is the aggregation state carried through the S3 snapshot (the
counts go on from the snapshot's state, not from zero) and the gap is read from the ``version`` field the
upgraded counts carry. Final counts per key can hide a lost batch that a later one rewrote; the unique-id
audit of snapshot upgrades is in test_upgrade_safety_e2e.py and test_chaos_lifecycle.py.
"""
from __future__ import annotations

import base64
import json
import os
import sys
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
for extra in (REPO / "operator", REPO / "jobs", REPO, REPO / "stack"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from eos_job.storage import Loc, S3Options  # noqa: E402
from eos_job.verify import audit_counts, read_committed  # noqa: E402
from eos_stack.cluster import PYTHONPATH, OperatorProcess, condition, wait_until  # noqa: E402
from examples.colors.local_run import create_topics  # noqa: E402
from examples.colors.manifest import colors_manifest  # noqa: E402
from tests.e2e.exactness import assert_exactly_once  # noqa: E402
from tests.harness.kubelet import ProcessKubelet  # noqa: E402
from tests.e2e.streams import Trickle, secure  # noqa: E402

pytestmark = pytest.mark.stack

NAME = "colors"
UPGRADES = int(os.environ.get("EOS_UPGRADES", "1"))   # the lifecycle chaos upgrades more, on the unique-id stream


def log_time(path: Path, text: str) -> float | None:
    """Time of the first line of a driver log containing ``text`` (the logging format's local time)."""
    from datetime import datetime
    for line in path.read_text(errors="replace").splitlines():
        if text in line:
            try:
                return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            except ValueError:
                return None
    return None




def test_snapshot_upgrades_mid_flow_write_everything_exactly_once(stack_env, kubectl, namespace, tmp_path,
                                                                        report_result):
    bootstrap = stack_env["KAFKA_BOOTSTRAP"]
    run_id = uuid.uuid4().hex[:8]
    src, counts, dlq = f"up-colors-events-{run_id}", f"up-colors-counts-{run_id}", f"up-colors-dlq-{run_id}"
    create_topics(bootstrap, {src: 3, counts: 3, dlq: 1})
    ledger = f"{counts}.eos-ledger.{namespace}.{NAME}"
    bucket, endpoint = stack_env["S3_BUCKET"], stack_env["S3_ENDPOINT"]
    kubectl.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ckpt-keys"}, "type": "Opaque",
                   "data": {k: base64.b64encode(stack_env[v].encode()).decode()
                            for k, v in (("id", "S3_ACCESS_KEY"), ("secret", "S3_SECRET_KEY"))}}, namespace)
    prefix = f"/e2e-upgrade/{run_id}"
    checkpoint = f"s3a://{bucket}{prefix}"
    stream = colors_manifest(NAME, bootstrap, src, counts, tmp_path, dlq=dlq, max_offsets_per_trigger=2000,
                             trigger_interval_ms=500,   # upgradeMode: snapshot, the default
                             restartStrategy={"type": "fixed-delay", "fixedDelay": {"attempts": 2, "delaySeconds": 1}})
    stream["spec"]["checkpoint"] = {"store": "s3", "path": prefix, "s3": {
        "bucket": bucket, "endpoint": endpoint, "pathStyleAccess": True,
        "accessKeyId": {"name": "ckpt-keys", "key": "id"}, "secretAccessKey": {"name": "ckpt-keys", "key": "secret"}}}
    # Kafka as production runs it: source and sink only through the SASL_SSL listener, the stream's own user.
    secure(stream, stack_env, kubectl, namespace, source_topics=[src], write_topics=[counts, dlq], ledger=ledger)
    s3 = S3Options(endpoint=endpoint, path_style=True, access_key=stack_env["S3_ACCESS_KEY"],
                   secret_key=stack_env["S3_SECRET_KEY"])
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"} & set(os.environ), \
        "the operator must read S3 with the Secret's keys, not keys of its environment"
    trickle = Trickle(bootstrap, src)
    with ProcessKubelet(stack_env["KUBECONFIG"], namespace=namespace, log_dir=tmp_path / "kubelet",
                        extra_env={"PYTHONPATH": PYTHONPATH}) as kubelet:
        operator = OperatorProcess(stack_env["KUBECONFIG"], namespace, tmp_path / "operator.log").start()

        def diag() -> str:
            parts = [json.dumps(kubectl.status(namespace, NAME), indent=1),
                     kubectl.run("get", "events", "-n", namespace, check=False).stdout,
                     "operator log:\n" + operator.tail()]
            for log in sorted(kubelet.log_dir.glob(f"{namespace}_*.log"))[-2:]:
                parts.append(f"{log.name}:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-25:]))
            return "\n".join(parts)

        try:
            trickle.send(2000, seed=7)     # a backlog, then a steady trickle
            kubectl.apply(stream, namespace)
            wait_until(lambda: kubectl.status(namespace, NAME).get("lifecycleState") == "Running",
                       "the stream to run", 120, diag)
            wait_until(lambda: audit_counts(bootstrap, counts).final, "first output", 240, diag, 2)
            trickle.start()
            patched_at = []
            for v in range(1, UPGRADES + 1):
                flowing = sum(audit_counts(bootstrap, counts).final.values())   # output flows before each upgrade
                wait_until(lambda: sum(audit_counts(bootstrap, counts).final.values()) > flowing,
                           f"output before upgrade {v}", 120, diag, 1)
                patched_at.append(time.time())
                kubectl.patch_spec(namespace, NAME, {"job": {"args": {"version": f"v{v}"}}})
                status = wait_until(lambda: (lambda s: s if s.get("driverPod") == f"{NAME}-driver-{v}"
                                             and s.get("lifecycleState") == "Running" else None)(
                    kubectl.status(namespace, NAME)), f"upgrade {v} to run", 180, diag)
                assert "upgrade" not in status
                uid = kubectl.stream(namespace, NAME)["metadata"]["uid"]
                assert status["checkpointDir"] == f"{checkpoint}/ckpt-{uid[:8]}-{v}"
                assert status["restoreFrom"] == status["snapshots"][-1]["path"]
                wait_until(lambda: any(json.loads(m.value()).get("version") == f"v{v}"
                                       for m in read_committed(bootstrap, counts)),
                           f"output of upgrade {v}", 120, diag, 1)
            expected = trickle.stop()
            wait_until(lambda: audit_counts(bootstrap, counts).final == expected, "the output to catch up",
                       240, diag, 2)
            assert_exactly_once(bootstrap, counts, ledger, expected, (dlq,))

            status = kubectl.status(namespace, NAME)
            assert [s["name"] for s in status["snapshots"]] == [
                f"{NAME}-{kubectl.stream(namespace, NAME)['metadata']['uid'][:8]}-a{a}" for a in range(UPGRADES)]
            assert all((Loc.of(s["path"], s3) / "eos-snapshot.json").is_file() for s in status["snapshots"])
            assert not (tmp_path / "live").exists() and not list(tmp_path.glob("ckpt-*")), "nothing on local disk"
            # The operator read the checkpoint it restarts on straight from the bucket (resolution).
            res = status["resolution"]
            assert res["checkpointReadable"] and res["checkpointId"], res
            assert res["checkpointLastCommittedBatch"] is not None, res
            assert status["lastStableSpec"] == status["lastReconciledSpec"]
            assert condition(status, "Ready")["status"] == "True"
            reasons = kubectl.events(namespace, NAME)
            assert reasons.count("SnapshotTaken") == UPGRADES and reasons.count("Upgraded") == UPGRADES
            assert "SnapshotFallback" not in reasons and "DriverFailed" not in reasons
            for a in range(UPGRADES):
                log = kubelet.log_path(namespace, f"{NAME}-driver-{a}").read_text(errors="replace")
                assert "snapshot written to" in log, log[-3000:]
            for a in range(1, UPGRADES + 1):
                log = kubelet.log_path(namespace, f"{NAME}-driver-{a}").read_text(errors="replace")
                assert "seeded from snapshot" in log, log[-3000:]

            # The output gap of each upgrade: the last record of the old spec to the first of the new one.
            records = [(m.timestamp()[1] / 1000.0, json.loads(m.value()).get("version"))
                       for m in read_committed(bootstrap, counts)]
            gaps = []
            print()
            for v in range(1, UPGRADES + 1):
                first_new = min(t for t, ver in records if ver == f"v{v}")
                old = f"v{v - 1}" if v > 1 else None
                last_old = max(t for t, ver in records if ver == old and t <= first_new)
                gaps.append(first_new - last_old)
                assert last_old >= patched_at[v - 1] - 5, "the old spec stopped writing long before the upgrade"
                # Where the gap goes, from the drivers' logs (seconds after the last old record).
                old_log = kubelet.log_path(namespace, f"{NAME}-driver-{v - 1}")
                new_log = kubelet.log_path(namespace, f"{NAME}-driver-{v}")
                marks = {"spec patched": patched_at[v - 1],
                         "SIGTERM": log_time(old_log, "received SIGTERM"),
                         "snapshot written": log_time(old_log, "snapshot written to"),
                         "new driver restored": log_time(new_log, "seeded from snapshot"),
                         "query started": log_time(new_log, "started (query id"),
                         "first new output": first_new}
                print(f"upgrade {v}: output gap {gaps[-1]:.1f}s; " + ", ".join(
                    f"{k} {t - last_old:+.1f}" for k, t in marks.items() if t is not None))
            report_result("snapshot upgrades: output gaps (s) " + ", ".join(f"{g:.1f}" for g in gaps)
                          + f"; mean {sum(gaps) / len(gaps):.1f}; output exactly once")
            for g in gaps:
                assert 0 < g < 300   # a sanity bound: Spark's cold start dominates on a shared machine
        finally:
            if trickle.is_alive():
                trickle.halt.set()
            kubectl.run("delete", "exactlyoncestream", NAME, "-n", namespace, "--timeout=120s", check=False)
            operator.stop()
