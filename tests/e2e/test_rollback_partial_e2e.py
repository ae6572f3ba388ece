"""A rollback over a batch the broken spec partially committed, through the operator (protocol amendment A1).

The unique-id stream, map-only with one slot per source partition (``job.slotsFrom: sourcePartitions``, 3
partitions, 3 slots), is upgraded from a snapshot to a spec whose task for source partition 1 fails every time
(``tests/e2e/jobs/ids_broken_on_partition.py``), after the other slots of its first batch committed: a batch
partially committed by the broken spec. Never ready, it is rolled back to the last stable spec from the
upgrade's snapshot, replaying the ledger's batches of the broken run. The rolled-back driver finishes that
batch: the broken spec's committed slots skipped (their records are those slots' own source partitions under
any spec), the rest written. Every id sent is in the output once, read_committed.

With key slots the same rollback is refused, nothing written (the slot write path on the broker:
tests/stack/test_partial_other_spec.py, with the negative control that finishes key slots anyway and loses and
duplicates ids).

The drivers run on the real nodes (kubelet + containerd, the project's image; tests/e2e/on_nodes.py): the test's
job modules reach them as a ConfigMap mounted at /app/tests/e2e/jobs, the checkpoint and the upgrade's snapshot
are in the stack's bucket, and the drivers' logs are followed from the nodes (``NodePods``).
"""
from __future__ import annotations

import json

import pytest

from eos_stack.cluster import condition, wait_until
from tests.e2e.streams import NAME, finish_ids, rig

pytestmark = [pytest.mark.stack, pytest.mark.real_nodes]

GOOD, BROKEN = "tests.e2e.jobs.ids_by_partition", "tests.e2e.jobs.ids_broken_on_partition"


def test_a_rollback_finishes_the_batch_a_broken_upgrade_partially_committed(
        stack_env, nodes, kubectl, namespace, on_nodes, tmp_path, report_result):
    with rig(stack_env, kubectl, namespace, tmp_path, on_nodes=on_nodes) as r:
        doc = r.stream(GOOD, upgradePreFlight=False, upgradeReadinessTimeoutSeconds=60)
        doc["spec"]["job"].update({"parallelism": 3, "slotsFrom": "sourcePartitions"})
        feed = r.run_ids(doc, seed=41)

        kubectl.patch_spec(namespace, NAME, {"job": {"module": BROKEN}})
        st = r.wait_status(lambda s: (s.get("rejectedSpec") or {}).get("reason") == "RolledBack"
                           and s.get("lifecycleState") == "Running" and "upgrade" not in s,
                           "the broken upgrade to be rolled back", 600)
        rolled_pod = st["driverPod"]
        assert json.loads(st["lastReconciledSpec"])["job"]["module"] == GOOD
        assert condition(st, "Ready")["status"] == "True"
        assert condition(st, "Degraded")["reason"] == "UpgradeRolledBack"
        reasons = kubectl.events(namespace, NAME)
        assert reasons.count("UpgradeRolledBack") == 1, reasons
        broken_logs = [p for p in r.kubelet.log_dir.glob(f"{namespace}_{NAME}-driver-*.log")
                       if "broken upgrade: cannot handle source partition 1" in p.read_text(errors="replace")]
        assert broken_logs, "the broken spec's driver never ran its failing task"

        # The precondition, from the rolled-back driver's own log: it met a batch the broken spec had partially
        # committed (another output hash) and finished it, skipping the broken spec's committed slots.
        log_path = r.kubelet.log_path(namespace, rolled_pod)
        wait_until(lambda: log_path.exists() and "slots skipped as already committed" in log_path.read_text(
            errors="replace"),
                   f"{rolled_pod} to finish the partial batch", 180, r.diag, 1)
        text = log_path.read_text(errors="replace")
        assert "seeded from snapshot" in text, text[-4000:]           # the rollback restored the upgrade's snapshot
        finished = [line for line in text.splitlines() if "is partially committed by another spec" in line
                    and "sourcePartitions" in line]
        assert finished, text[-4000:]
        batch = int(finished[0].split("batch ", 1)[1].split(":", 1)[0])
        done = [line for line in text.splitlines() if f"batch {batch} committed:" in line]
        assert done and " 0/3 slots skipped" not in done[0], done       # some slot was the broken spec's
        broken_hash = finished[0].split("output hash ", 1)[1].split(")", 1)[0]
        assert broken_hash

        finish_ids(r, feed)      # every id once: the broken spec's slots and the rolled-back spec's rest
        report_result(f"rollback over a partial batch: the broken spec (output hash {broken_hash}) committed part "
                      f"of batch {batch} and failed; rolled back as {rolled_pod}, which finished it ({done[0][-90:]}); "
                      "every id once")
