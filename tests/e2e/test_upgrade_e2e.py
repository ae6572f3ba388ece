"""The snapshot upgrade on the real stack: operator, the driver Pods on the real nodes, real runtime, real Kafka,
and the checkpoint on the stack's S3 server (the production shape: ``checkpoint.store: s3``, keys in a Secret; Kafka
only through the SASL_SSL listener as the stream's own SCRAM user with its ACLs).

The unique-id stream through a stateful operator (``tests/e2e/jobs/ids_deduped.py``: deduplication by id, every
id seen kept in Spark's state store) is upgraded (``EOS_UPGRADES`` times in a row, once in ``make test``) to a
changed transformation (``job.args.version``: one more JSON field) while ids keep arriving. Each upgrade stops
the driver at a clean batch boundary with a snapshot (server-side copies in the bucket) and starts the new spec
in a new checkpoint location seeded from it. The operator reads the snapshot manifests and the checkpoints
straight from the bucket with the keys of the stream's Secret (its own environment has none).

After each upgrade, ids sent before it are sent again: the new driver drops them only if the state came
through the S3 snapshot (a driver that started without it would write them twice). The output is audited as a
set of unique ids (set equality with the ids sent, none twice, read_committed; the ledger; the sink audit), and
the output gap of each upgrade is measured from the read_committed record timestamps.
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
from eos_job.verify import audit_ids, read_committed  # noqa: E402
from eos_stack.cluster import OperatorProcess, condition, wait_until  # noqa: E402
from examples.colors.local_run import create_topics  # noqa: E402
from examples.colors.manifest import colors_manifest  # noqa: E402
from examples.colors.generator import expected_ids, produce  # noqa: E402
from tests.e2e.secured import secure  # noqa: E402
from tests.e2e.streams import IdFeed, assert_ids_exactly_once, wait_ids  # noqa: E402

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




@pytest.mark.real_nodes
@pytest.mark.parametrize("state", ["snapshot", pytest.param("dropped", marks=pytest.mark.soak)],
                         ids=["state-from-the-snapshot", "negative-control-without-it"])
def test_snapshot_upgrades_mid_flow_write_everything_exactly_once(stack_env, nodes, kubectl, namespace, on_nodes,
                                                                        tmp_path, report_result, state):
    """``negative-control-without-it`` (``make soak``: it costs a whole run): the same upgrade with
    ``upgradeMode: stateless`` from the latest offsets, a fresh checkpoint without the state; the ids sent again
    must come out twice (and only they: the rest is not re-read)."""
    bootstrap = stack_env["KAFKA_BOOTSTRAP"]
    run_id = uuid.uuid4().hex[:8]
    src, counts, dlq = f"up-colors-events-{run_id}", f"up-colors-counts-{run_id}", f"up-colors-dlq-{run_id}"
    create_topics(bootstrap, {src: 3, counts: 3, dlq: 1})
    ledger = f"{counts}.eos-ledger.{namespace}.{NAME}"
    # The bucket at the services address: the driver Pods and the operator (on this machine) reach it there.
    bucket, endpoint = stack_env["S3_BUCKET"], on_nodes.pod_env["POD_S3_ENDPOINT"]
    kubectl.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ckpt-keys"}, "type": "Opaque",
                   "data": {k: base64.b64encode(stack_env[v].encode()).decode()
                            for k, v in (("id", "S3_ACCESS_KEY"), ("secret", "S3_SECRET_KEY"))}}, namespace)
    prefix = f"/e2e-upgrade/{run_id}"
    checkpoint = f"s3a://{bucket}{prefix}"
    stream = colors_manifest(NAME, bootstrap, src, counts, tmp_path, dlq=dlq, max_offsets_per_trigger=2000,
                             trigger_interval_ms=500,   # upgradeMode: snapshot, the default
                             job={"module": "tests.e2e.jobs.ids_deduped"},
                             restartStrategy={"type": "fixed-delay", "fixedDelay": {"attempts": 2, "delaySeconds": 1}})
    stream["spec"]["checkpoint"] = {"store": "s3", "path": prefix, "s3": {
        "bucket": bucket, "endpoint": endpoint, "pathStyleAccess": True,
        "accessKeyId": {"name": "ckpt-keys", "key": "id"}, "secretAccessKey": {"name": "ckpt-keys", "key": "secret"}}}
    stream = on_nodes.place(stream)
    # Kafka as production runs it: source and sink only through the SASL_SSL listener (the Pods' one on the
    # services address), the stream's own user.
    secure(stream, stack_env, kubectl, namespace, source_topics=[src], write_topics=[counts, dlq], ledger=ledger,
           bootstrap=on_nodes.pod_env["POD_KAFKA_SECURE_BOOTSTRAP"])
    s3 = S3Options(endpoint=endpoint, path_style=True, access_key=stack_env["S3_ACCESS_KEY"],
                   secret_key=stack_env["S3_SECRET_KEY"])
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"} & set(os.environ), \
        "the operator must read S3 with the Secret's keys, not keys of its environment"
    feed = IdFeed(bootstrap, src, chunk=50, pause=1.0)
    output = lambda: len(read_committed(bootstrap, counts))   # noqa: E731 - records in the sink, read_committed
    with on_nodes.pods(tmp_path / "kubelet") as kubelet:
        operator = OperatorProcess(stack_env["KUBECONFIG"], namespace, tmp_path / "operator.log").start()

        def diag() -> str:
            parts = [json.dumps(kubectl.status(namespace, NAME), indent=1),
                     kubectl.run("get", "events", "-n", namespace, check=False).stdout,
                     "operator log:\n" + operator.tail()]
            for log in sorted(kubelet.log_dir.glob(f"{namespace}_*.log"))[-2:]:
                parts.append(f"{log.name}:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-25:]))
            return "\n".join(parts)

        try:
            feed.send(2000, 7, 1_000_000)     # a backlog, then a steady feed of new ids
            kubectl.apply(stream, namespace)
            wait_until(lambda: kubectl.status(namespace, NAME).get("lifecycleState") == "Running",
                       "the stream to run", 120, diag)
            wait_until(output, "first output", 240, diag, 2)
            feed.start()
            patched_at, resent = [], 0
            for v in range(1, UPGRADES + 1):
                flowing = output()   # output flows before each upgrade
                wait_until(lambda: output() > flowing, f"output before upgrade {v}", 120, diag, 1)
                patched_at.append(time.time())
                kubectl.patch_spec(namespace, NAME, {"job": {"args": {"version": f"v{v}"}},
                                                     **({"upgradeMode": "stateless", "source": {"startingOffsets": "latest"}}
                                                        if state == "dropped" else {})})
                status = wait_until(lambda: (lambda s: s if s.get("driverPod") == f"{NAME}-driver-{v}"
                                             and s.get("lifecycleState") == "Running" else None)(
                    kubectl.status(namespace, NAME)), f"upgrade {v} to run", 180, diag)
                assert "upgrade" not in status
                if state == "dropped":   # the control: no state came through; the ids sent again are written again
                    wait_until(lambda: any(json.loads(m.value()).get("version") == f"v{v}"
                                           for m in read_committed(bootstrap, counts)), "output without state", 180,
                               diag, 1)
                    again = set().union(*(expected_ids(n, seed, start) for n, seed, start in feed.chunks[:2]))
                    for n, seed, start in feed.chunks[:2]:
                        produce(bootstrap, src, n, seed=seed, start_id=start)
                    wait_until(lambda: audit_ids(bootstrap, counts, again).duplicates, "ids written twice", 180, diag, 2)
                    out = audit_ids(bootstrap, counts, feed.finish())
                    report_result(f"snapshot upgrade, negative control (stateless): {out.violations()}")
                    assert set(out.duplicates) <= again and out.duplicates
                    return
                uid = kubectl.stream(namespace, NAME)["metadata"]["uid"]
                assert status["checkpointDir"] == f"{checkpoint}/ckpt-{uid[:8]}-{v}"
                assert status["restoreFrom"] == status["snapshots"][-1]["path"]
                wait_until(lambda: any(json.loads(m.value()).get("version") == f"v{v}"
                                       for m in read_committed(bootstrap, counts)),
                           f"output of upgrade {v}", 120, diag, 1)
                # Ids the old spec wrote, sent again: only the state that came through the snapshot drops them.
                for n, seed, start in feed.chunks[:2]:
                    produce(bootstrap, src, n, seed=seed, start_id=start)
                    resent += n
            expected = feed.finish()
            wait_ids(bootstrap, counts, expected, diag, 300)
            assert_ids_exactly_once(bootstrap, counts, ledger, expected, (dlq,))

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
                          + f"; mean {sum(gaps) / len(gaps):.1f}; {len(expected)} unique ids exactly once, "
                          f"{resent} events sent again after the upgrades dropped by the state from the snapshots")
            for g in gaps:
                assert 0 < g < 300   # a sanity bound: Spark's cold start dominates on a shared machine
        finally:
            feed.stop_flag.set()
            kubectl.run("delete", "exactlyoncestream", NAME, "-n", namespace, "--timeout=120s", check=False)
            operator.stop()
