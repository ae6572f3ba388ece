"""Upgrade safety on the real stack: pre-flight, drain, operator kills mid-upgrade,
periodic snapshots with retention, and a restore from an older snapshot into a new stream.

Each test runs its own namespace and operator process; the driver, pre-flight, drain and snapshot Pods run their
real commands. The tests marked ``real_nodes`` (pre-flight, the drain, the idle upgrade, the operator killed
mid-upgrade, the periodic snapshots and the fork) run them on the real nodes (the checkpoint in the stack's
bucket, the test job modules from a ConfigMap: tests/e2e/on_nodes.py; the drain's driver fault added by the
operator under test, ``driver_env``); the fork test reads the older snapshot in the bucket from this machine.
Output is checked with
read_committed consumers. Exactness is proven on the unique-id stream (every id sent in
the output once, as a set: ``finish_ids``), where final counts per key would hide a lost
batch that a later one rewrote. The pre-flight test, whose point is the state schema of a stateful job, runs
the deduplicating unique-id job (``tests/e2e/jobs/ids_deduped.py``: every id seen kept in its state store).
"""
from __future__ import annotations

import contextlib
import json
import time
from typing import Any

import pytest

from eos_job import checkpoint, snapshot
from eos_job.storage import Loc, S3Options
from eos_stack.cluster import condition, wait_until
from tests.e2e.streams import (IDS, NAME, IdFeed, OperatorProcess, colors_stream, finish_ids,
                               kept_ids_from, rig, settle_ids, wait_ids)

pytestmark = pytest.mark.stack


# -------------------------------------------------------------------------- tests
@pytest.mark.real_nodes
def test_pre_flight_blocks_an_incompatible_upgrade(
        stack_env, nodes, kubectl, namespace, on_nodes, tmp_path, report_result):
    """The driver and the pre-flight Pod on the real nodes, the test's job modules mounted from a ConfigMap."""
    with rig(stack_env, kubectl, namespace, tmp_path, on_nodes=on_nodes) as r:
        feed = r.run_ids(r.stream("tests.e2e.jobs.ids_deduped"), seed=3)

        # The new job's state is incompatible (its deduplication key differs): pre-flight refuses it, nothing
        # is stopped.
        kubectl.patch_spec(namespace, NAME, {"job": {"module": "tests.e2e.jobs.ids_deduped_incompatible"}})
        st = r.wait_status(lambda s: (s.get("rejectedSpec") or {}).get("reason") == "PreFlightFailed",
                           "pre-flight to block the upgrade", 300)
        assert st["driverPod"] == f"{NAME}-driver-0" and r.pod_phase(f"{NAME}-driver-0") == "Running"
        assert "upgrade" not in st and "pendingLaunch" not in st
        assert condition(st, "Ready")["status"] == "True"
        degraded = condition(st, "Degraded")
        assert (degraded["status"], degraded["reason"]) == ("True", "UpgradeBlocked"), degraded
        blocked_msg = r.kubectl.event_messages(namespace, NAME, "UpgradeBlocked")
        assert blocked_msg and "pre-flight" in blocked_msg[0], blocked_msg
        assert "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE" in blocked_msg[0], blocked_msg   # refused for its state
        before = r.output_total()
        wait_until(lambda: r.output_total() > before, "the old job to keep writing", 120, r.diag, 2)
        reasons = kubectl.events(namespace, NAME)
        assert "PreFlight" in reasons and "SnapshotTaken" not in reasons and "Upgraded" not in reasons

        ids = finish_ids(r, feed)
        report_result(f"upgrade safety: pre-flight blocked an incompatible state change of the deduplicating "
                      f"job with the old driver running; {len(ids)} unique ids exactly once (a broken upgrade's "
                      f"rollback: test_rollback_partial_e2e.py)")


@pytest.mark.soak   # make soak (overlaps the planner unit test of the idle upgrade); make test deselects it
@pytest.mark.real_nodes
def test_an_upgrade_while_no_input_arrives_is_verified_not_rolled_back(stack_env, nodes, kubectl, namespace, on_nodes,
                                                                       tmp_path, report_result):
    """An idle source gives the upgraded driver no batch to commit; it is ready all the same (the replay
    horizon shows nothing waiting), and input after the upgrade is written exactly once by the new spec."""
    with rig(stack_env, kubectl, namespace, tmp_path, on_nodes=on_nodes) as r:
        feed = r.run_ids(r.stream(IDS, upgradeReadinessTimeoutSeconds=30, upgradePreFlight=False), seed=13)
        before = feed.finish()                      # no more input from here on
        wait_ids(r.bootstrap, r.topics.counts, before, r.diag, timeout=240)
        kubectl.patch_spec(namespace, NAME, {"job": {"args": {"version": "idle-upgrade"}}})
        st = r.wait_status(lambda s: "upgrade" not in s and "upgradeCheck" not in s
                           and s.get("driverPod") != f"{NAME}-driver-0" and s.get("lifecycleState") == "Running"
                           and json.loads(s.get("lastStableSpec") or "{}").get("job", {}).get("args")
                           == {"version": "idle-upgrade"}, "the idle upgrade to be verified", 300)
        reasons = kubectl.events(namespace, NAME)
        assert "UpgradeVerified" in reasons and "UpgradeRolledBack" not in reasons, reasons
        verified = kubectl.event_messages(namespace, NAME, "UpgradeVerified")
        assert any("the source is idle" in m for m in verified), verified
        assert "rejectedSpec" not in st and condition(st, "Ready")["status"] == "True"
        # Input after the upgrade goes through the new driver, exactly once with what came before.
        more = IdFeed(r.bootstrap, r.topics.events, chunk=50, pause=1.0, first_id=10_000_000)
        r.feeds.append(more)
        more.send(500, seed=14, start_id=20_000_000)
        more.start()
        finish_ids(r, more, also=before)
        report_result(f"idle upgrade: no input during the 30s readiness window; verified as "
                      f"{st['driverPod']} (not rolled back); later input exactly once")


# Status content right after each step of an upgrade is written: the intent, the snapshot read back,
# resolution done (the operator dies right after that write, before acting on it).
KILL_AFTER = ('"step":"Stopping"', '"step":"Stopped"', '"resolvedSpecHash":"')
HA_KILL_AFTER = KILL_AFTER[1]   # mid snapshot upgrade: the old driver stopped, its snapshot taken


@pytest.mark.real_nodes
def test_operator_killed_at_each_step_of_an_upgrade_finishes_each_exactly_once(
        stack_env, nodes, kubectl, namespace, on_nodes, tmp_path, report_result):
    """Three upgrades; in each the operator dies right after writing one step of the upgrade to status
    (after intent, after the snapshot, after resolution) and a new operator finishes it. In the middle one
    the dying operator is the leader of two replicas (leader election on a Lease): the standby, waiting
    since before the upgrade, takes over and finishes it. The drivers run on the real nodes, the checkpoints
    and snapshots in the bucket."""
    takeover, standby = None, None
    with rig(stack_env, kubectl, namespace, tmp_path, on_nodes=on_nodes) as r, contextlib.ExitStack() as cleanup:
        cleanup.callback(lambda: standby is not None and standby.stop())
        feed = r.run_ids(r.stream(IDS, upgradePreFlight=False), seed=5)
        for v, marker in enumerate(KILL_AFTER, start=1):
            r.operator.stop()
            ha = marker == HA_KILL_AFTER
            crashing = r.start_operator(leader_election=ha, EOS_TEST_CRASH_AFTER_STATUS=marker)
            if ha:
                def holder() -> str | None:
                    got = kubectl.run("get", "lease", "spark-eos-operator", "-n", namespace, "-o", "json", check=False)
                    return json.loads(got.stdout)["spec"].get("holderIdentity") if got.returncode == 0 else None
                wait_until(lambda: holder() == crashing.identity, "the first replica to lead", 60, r.diag)
                standby = OperatorProcess(stack_env["KUBECONFIG"], namespace, tmp_path / "standby.log",
                                          leader_election=True).start()
                wait_until(lambda: "standing by" in standby.tail(), "the second replica to stand by", 60, r.diag)
            kubectl.patch_spec(namespace, NAME, {"job": {"args": {"version": f"v{v}"}}})
            wait_until(lambda: not crashing.alive(), f"the operator to die after writing {marker}", 240, r.diag)
            died = time.monotonic()
            assert crashing.proc.returncode == 137, crashing.tail()
            if ha:
                wait_until(lambda: holder() == standby.identity, "the standby to take the Lease over", 60, r.diag, 0.2)
                takeover = time.monotonic() - died
                r.operator = r.diag.operator = standby
            else:
                r.start_operator()
            st = r.wait_status(lambda s: s.get("driverPod") == f"{NAME}-driver-{v}"
                               and s.get("lifecycleState") == "Running" and "upgrade" not in s,
                               f"upgrade {v} to finish", 300)
            uid = kubectl.stream(namespace, NAME)["metadata"]["uid"]
            assert st["checkpointDir"].endswith(f"/ckpt-{uid[:8]}-{v}")
        finish_ids(r, feed)
        reasons = kubectl.events(namespace, NAME)
        assert reasons.count("Upgraded") == 3 and reasons.count("Submitted") == 4, reasons
        assert reasons.count("SnapshotTaken") == 3 - 1   # the kill right after "Stopped" loses that one event
        runs = sorted(p.name for p in r.kubelet.log_dir.glob(f"{namespace}_{NAME}-driver-*.log"))
        assert runs == [f"{namespace}_{NAME}-driver-{a}.log" for a in range(4)], runs   # one process each
        status = r.status()
        assert len(status["snapshots"]) == 3
        report_result("operator SIGKILLed after intent, after snapshot and after resolution of three upgrades: "
                      "each finished once (4 drivers in all), output exactly once; the kill after the snapshot hit "
                      f"the leader of two replicas, whose standby took the Lease over {takeover:.1f}s later")


@pytest.mark.real_nodes
def test_parallelism_change_over_a_partially_committed_batch_drains_first(
        stack_env, nodes, kubectl, namespace, on_nodes, tmp_path, report_result):
    """driver-0 dies after slot 0 of a batch committed and before slot 1 did; while it waits to be
    restarted, job.parallelism goes 2 -> 3. The old spec finishes that batch first (drain, generation 0),
    then the new one starts under generation 1. On the real nodes: driver-0's fault (attempt 0) is added to its
    Pod by the operator under test (``driver_env``); the drain Pod gets none."""
    with rig(stack_env, kubectl, namespace, tmp_path, on_nodes=on_nodes,
             driver_env=[[0, "EOS_FAULT_PARTIAL_BATCH", "1:0"]]) as r:
        doc = r.stream(IDS, upgradePreFlight=False)
        doc["spec"]["restartStrategy"] = {"type": "fixed-delay", "fixedDelay": {"attempts": 3, "delaySeconds": 30}}
        feed = r.run_ids(doc, seed=9, first_output=False)
        st = r.wait_status(lambda s: s.get("lifecycleState") == "Restarting", "driver-0 to die mid-batch", 300)
        assert "exit code 137" in st["lastError"], st["lastError"]   # SIGKILLed by the fault, mid-batch
        kubectl.patch_spec(namespace, NAME, {"job": {"parallelism": 3}})
        st = r.wait_status(lambda s: s.get("lifecycleState") == "Running" and "upgrade" not in s
                           and s.get("driverPod") not in (None, f"{NAME}-driver-0"), "the upgrade to run", 420)
        assert st["txGeneration"] == 1
        reasons = kubectl.events(namespace, NAME)
        assert "SnapshotFallback" in reasons and "Draining" in reasons and "Drained" in reasons, reasons
        drained = " ".join(kubectl.event_messages(namespace, NAME, "Drained"))
        drain_logs = sorted(r.kubelet.log_dir.glob(f"{namespace}_{NAME}-drain-*.log"))
        assert len(drain_logs) == 1, drain_logs
        drain_log = drain_logs[0].read_text(errors="replace")
        assert "1/2 slots skipped as already committed" in drain_log, drain_log[-3000:]
        finish_ids(r, feed)      # the same sink across both generations: every id once
        report_result(f"drain: a batch partially committed by 2 slots was finished by the old spec ({drained[:120]}), "
                      "then 3 slots under generation 1; output exactly once")


@pytest.mark.soak   # make soak (overlaps the lifecycle chaos: periodic snapshots, retention, restores); make test deselects it
@pytest.mark.real_nodes
def test_periodic_snapshots_retention_and_restore_into_a_new_stream(
        stack_env, nodes, kubectl, namespace, on_nodes, tmp_path, report_result):
    # The snapshots in the bucket, read from this machine with the server's keys.
    s3 = S3Options(endpoint=on_nodes.pod_env["POD_S3_ENDPOINT"], path_style=True,
                   access_key=stack_env["S3_ACCESS_KEY"], secret_key=stack_env["S3_SECRET_KEY"])
    with rig(stack_env, kubectl, namespace, tmp_path, on_nodes=on_nodes) as r:
        feed = r.run_ids(r.stream(IDS, snapshots={"intervalSeconds": 10, "maxCount": 2}), seed=11,
                         first_output=False)
        seen: dict[str, dict[str, Any]] = {}

        def snapshots() -> list[dict[str, Any]]:
            items = kubectl.json("get", "exactlyoncesnapshots", "-n", namespace)["items"]
            for s in items:
                seen[s["metadata"]["name"]] = s
            return items

        def pruned() -> bool:
            items = snapshots()
            done = [s for s in items if (s.get("status") or {}).get("state") == "Completed"]
            return len(seen) >= 4 and 1 <= len(done) <= 2 and len(items) < len(seen)

        wait_until(pruned, "periodic snapshots and retention", 300, r.diag, 1)
        # No more periodic snapshots from here: retention would otherwise prune the one the fork names
        # before the fork has copied it (retention does not know about other streams' restoreFrom).
        kubectl.patch_spec(namespace, NAME, {"snapshots": {"intervalSeconds": None}})
        generation = kubectl.stream(namespace, NAME)["metadata"]["generation"]
        wait_until(lambda: kubectl.status(namespace, NAME).get("observedGeneration", 0) >= generation,
                   "the operator to see the patch", 60, r.diag, 0.5)
        def settled() -> bool:
            items = snapshots()
            states = [(s.get("status") or {}).get("state") for s in items]
            return all(x in ("Completed", "Failed") for x in states) and states.count("Completed") <= 2
        wait_until(settled, "snapshots in flight to finish and retention to apply", 120, r.diag, 1)
        items = snapshots()
        assert all(s["spec"]["trigger"] == "periodic" for s in items)
        gone = [s for n, s in seen.items() if n not in {i["metadata"]["name"] for i in items}]
        for s in gone:     # disposeOnDelete: the files of pruned snapshots are removed
            path = (s.get("status") or {}).get("path")
            if path:
                wait_until(lambda: not Loc.of(path, s3).files(), f"{path} to be disposed", 60, r.diag, 1)
        completed = sorted((s for s in items if s["status"]["state"] == "Completed"),
                           key=lambda s: s["status"]["batch"])
        older = completed[0]
        # Where the fork resumes: the source positions after the last batch the snapshot's checkpoint committed.
        older_loc = Loc.of(older["status"]["path"], s3)
        last = snapshot.read_manifest(older_loc)["lastBatch"]
        resume_at = checkpoint.kafka_offsets(older_loc / "checkpoint", last)[r.topics.events]
        # More output after the snapshot the fork starts from: a few batches past it.
        wait_until(lambda: (kubectl.status(namespace, NAME).get("lastCommittedBatch") or 0)
                   >= older["status"]["batch"] + 3, "batches after the older snapshot", 120, r.diag, 1)
        expected = finish_ids(r, feed)

        # Restore the older snapshot into a new stream (a fork, with its own sink topic).
        fork_counts = f"{r.topics.counts}-fork"
        from examples.colors.local_run import create_topics
        create_topics(r.bootstrap, {fork_counts: 3})
        fork = r.place(colors_stream("colors-fork", r.topics, tmp_path / "fork", attempts=3, delay=2, module=IDS))
        fork["spec"]["sink"]["topic"] = fork_counts
        fork["spec"]["restoreFrom"] = older["metadata"]["name"]
        kubectl.apply(fork, namespace)
        st = r.wait_status(lambda s: s.get("lifecycleState") == "Running", "the fork to run", 240,
                           name="colors-fork")
        assert st["restoreFrom"] == older["status"]["path"] and st["checkpointDir"].endswith(
            f"/ckpt-{kubectl.stream(namespace, 'colors-fork')['metadata']['uid'][:8]}-0")
        restored = kubectl.event_messages(namespace, "colors-fork", "Restored")
        assert restored and "fork" in restored[0], restored
        # The fork writes, once each, exactly the ids of the source from the snapshot's positions on: none
        # of what the older snapshot had committed, nothing lost after it (its own sink and ledger).
        fork_expected = kept_ids_from(r.bootstrap, r.topics.events, resume_at)
        assert fork_expected and fork_expected < expected, (len(fork_expected), len(expected))
        settle_ids(r, fork_expected, name="colors-fork", topic=fork_counts)
        report_result(f"periodic snapshots: {len(seen)} taken every 10s, retention kept {len(items)}; "
                      f"restore of {older['metadata']['name']} (batch {older['status']['batch']}) into a new "
                      f"stream: both outputs every id exactly once ({len(expected)} ids; the fork "
                      f"{len(fork_expected)} from the snapshot's positions on)")
