"""Lifecycle chaos through the operator, on the unique-id stream.

One stream runs under the operator, its driver, snapshot and drain Pods on the real nodes (tests/e2e/on_nodes.py:
the checkpoint and snapshots in the stack's bucket), while ids keep arriving and periodic snapshots are taken.
Its Kafka is a broker of this test alone (``private_kafka``), which the broker kill SIGKILLs: its listener for
Pods is advertised at the stack's services address and forwarded there by the test (``Forwarder``). A seeded random schedule (``EOS_LIFECYCLE_SEED``) of lifecycle operations
is applied to it, each kind at least once: a driver SIGKILL, an operator SIGKILL, a snapshot upgrade, a
parallelism change (a new generation), a broken upgrade that rolls back, a nonce snapshot, a restore of an
older snapshot of the same stream, delete and re-create, suspend and resume, and a broker SIGKILL. Every
change is made GitOps-style: the whole manifest is applied again. After each operation the stream must run
and write new output before the next one. At the end every id sent is in the sink exactly once (set
equality, read_committed), the ledger only grew per slot and no transaction is open.

``make test`` runs 15 operations (``EOS_LIFECYCLE_OPS``); ``make soak`` runs 100.
"""
from __future__ import annotations

import contextlib
import copy
import os
import random
import time
from collections import Counter
from typing import Any

import pytest

from eos_job.verify import read_committed
from eos_stack import kafka
from eos_stack.cluster import wait_until
from eos_stack.common import Stack
from tests.e2e.streams import NAME, IdFeed, Rig, assert_ids_exactly_once, rig, wait_ids
from tests.harness.private import Forwarder

pytestmark = pytest.mark.stack

OPS = int(os.environ.get("EOS_LIFECYCLE_OPS", "15"))   # make soak: 100
KINDS = ("driver-kill", "operator-kill", "upgrade", "rescale", "rollback", "nonce-snapshot", "restore-older",
         "delete-recreate", "suspend-resume", "broker-kill")


def schedule(rng: random.Random, n: int) -> list[str]:
    """``n`` operations, every kind at least once (when ``n`` allows), in a random order."""
    ops = list(KINDS) * (n // len(KINDS)) + rng.sample(KINDS, n % len(KINDS))
    rng.shuffle(ops)
    return ops


class Lifecycle:
    """The stream's manifest as a GitOps repository holds it, and the operations applied to it."""

    def __init__(self, r: Rig, rng: random.Random, broker: Stack):
        self.r, self.rng, self.kubectl, self.ns, self.broker = r, rng, r.kubectl, r.ns, broker
        # The readiness timeout is long enough for a cold Spark start on two busy cores, so only the broken
        # upgrade rolls back; the failure rate allows the kills and the broken upgrade's failures.
        self.doc = r.stream(upgradePreFlight=False, upgradeReadinessTimeoutSeconds=60,
                            snapshots={"intervalSeconds": 25, "maxCount": 4})
        self.doc["spec"]["job"]["module"] = "examples.colors.ids"
        self.doc["spec"]["restartStrategy"] = {"type": "failure-rate", "failureRate": {
            "maxFailures": 50, "intervalSeconds": 600, "delaySeconds": 1}}
        self.version = 0
        self.nonce = 0
        self.journal: list[str] = []

    # ---------------------------------------------------------------- observation
    def status(self) -> dict[str, Any]:
        return self.r.status()

    def output(self) -> int:
        return len(read_committed(self.r.bootstrap, self.r.topics.counts))

    def healthy(self, s: dict[str, Any]) -> bool:
        if s.get("lifecycleState") == "Failed":
            raise AssertionError(f"the stream failed: {s.get('lastError')}\n{self.r.diag()}")
        return (s.get("lifecycleState") == "Running" and "upgrade" not in s and "upgradeCheck" not in s
                and "pendingLaunch" not in s)

    def wait_progress(self, what: str, timeout: float = 360) -> None:
        """The stream runs (no upgrade in flight) and wrote output it had not written before ``what``."""
        before = self.output()
        wait_until(lambda: self.healthy(self.status()) and self.output() > before,
                   f"the stream to run and write after {what}", timeout, self.r.diag, 2)

    def apply(self) -> None:
        self.kubectl.apply(self.doc, self.ns)

    def completed_snapshots(self) -> list[dict[str, Any]]:
        items = self.kubectl.json("get", "exactlyoncesnapshots", "-n", self.ns)["items"]
        done = [s for s in items if s["spec"].get("stream") == NAME and not s["metadata"].get("deletionTimestamp")
                and (s.get("status") or {}).get("state") == "Completed"]
        return sorted(done, key=lambda s: s["status"]["batch"])

    # ---------------------------------------------------------------- operations
    def driver_kill(self) -> str:
        """SIGKILL every process of the driver Pod (the node's kill9 takes the whole tree); a driver between
        Pods (restarting) is waited for, up to a minute: a kill that found no process is no kill."""
        time.sleep(self.rng.uniform(0, 6))          # start-up, recovery, inside or between batches
        deadline = time.monotonic() + 60
        while True:
            pod = self.status().get("driverPod")
            if pod and self.r.kubelet.kill9(self.ns, pod):
                return f"SIGKILLed {pod}"
            if time.monotonic() > deadline:
                return f"{pod} had no process to kill"
            time.sleep(1)

    def operator_kill(self) -> str:
        time.sleep(self.rng.uniform(0, 4))
        self.r.operator.kill9()
        self.r.start_operator()
        return "operator SIGKILLed and started again"

    def upgrade(self) -> str:
        self.version += 1
        self.doc["spec"]["job"].setdefault("args", {})["version"] = f"v{self.version}"
        self.apply()
        return f"snapshot upgrade to args.version v{self.version}"

    def rescale(self) -> str:
        job = self.doc["spec"]["job"]
        job["parallelism"] = 3 if job["parallelism"] == 2 else 2
        generation = self.status().get("txGeneration", 0)
        self.apply()
        wait_until(lambda: self.status().get("txGeneration", 0) > generation, "a new generation", 360,
                   self.r.diag, 2)
        return f"parallelism to {job['parallelism']} (generation {self.status().get('txGeneration')})"

    def rollback(self) -> str:
        good = copy.deepcopy(self.doc)
        self.doc["spec"]["job"]["module"] = "tests.e2e.jobs.no_such_module"
        self.apply()
        s = self.r.wait_status(lambda s: (s.get("rejectedSpec") or {}).get("reason") == "RolledBack"
                               and self.healthy(s), "the broken upgrade to roll back", 420)
        self.doc = good                                # the repository reverts the broken commit
        self.apply()
        self.r.wait_status(lambda s: "rejectedSpec" not in s and self.healthy(s), "the revert to be seen", 120)
        return f"broken module rolled back to the last stable spec as {s['driverPod']}, then reverted"

    def nonce_snapshot(self) -> str:
        self.nonce += 1
        self.doc["spec"]["snapshotNonce"] = self.nonce
        self.apply()
        name = f"{NAME}-n{self.nonce}"
        wait_until(lambda: name in {s["metadata"]["name"] for s in self.completed_snapshots()},
                   f"snapshot {name}", 240, self.r.diag, 2)
        return f"snapshot {name} taken"

    def restore_older(self) -> str:
        snaps = [s for s in self.completed_snapshots()
                 if s["metadata"]["name"] != self.doc["spec"].get("restoreFrom")]
        if not snaps:
            return "no other completed snapshot yet: " + self.nonce_snapshot()
        older, note = snaps[0], ""
        self.doc["spec"]["restoreFrom"] = older["metadata"]["name"]
        self.apply()
        path = older["status"]["path"]

        def restored_or_pruned(s: dict[str, Any]) -> str | None:
            if s.get("restoreFrom") == path and self.healthy(s):
                return "restored"
            ready = next((c for c in s.get("conditions") or [] if c.get("type") == "Ready"), {})
            return "pruned" if ready.get("reason") == "RestoreSourceNotReady" else None

        got = wait_until(lambda: restored_or_pruned(self.status()), f"the restore of {older['metadata']['name']}",
                         420, self.r.diag, 0.5)
        if got == "pruned":
            # Retention deleted the oldest snapshot just as it was named: the operator waits with a clear
            # reason (never a driver that cannot find its files); a user names another one, as here.
            note = f"{older['metadata']['name']} was being pruned, so "
            older = self.completed_snapshots()[-1]
            self.doc["spec"]["restoreFrom"] = older["metadata"]["name"]
            self.apply()
            path = older["status"]["path"]
            self.r.wait_status(lambda s: s.get("restoreFrom") == path and self.healthy(s),
                               f"the restore of {older['metadata']['name']}", 420)
        return f"{note}restored {older['metadata']['name']} (batch {older['status']['batch']})"

    def delete_recreate(self) -> str:
        self.kubectl.run("delete", "exactlyoncestream", NAME, "-n", self.ns, "--timeout=180s")
        wait_until(lambda: not [p for p in self.kubectl.pods(self.ns)
                                if p["metadata"]["name"].startswith(f"{NAME}-driver")],
                   "the driver to go", 120, self.r.diag, 1)
        time.sleep(self.rng.uniform(0, 4))            # input arrives while the stream does not exist
        self.apply()
        return "deleted (graceful stop, checkpoint kept) and re-created from the same manifest"

    def suspend_resume(self) -> str:
        self.doc["spec"]["job"]["state"] = "suspended"
        self.apply()
        self.r.wait_status(lambda s: s.get("lifecycleState") == "Suspended", "the stream to suspend", 180)
        time.sleep(self.rng.uniform(0, 4))
        self.doc["spec"]["job"]["state"] = "running"
        self.apply()
        return "suspended and resumed"

    def broker_kill(self) -> str:
        time.sleep(self.rng.uniform(0, 4))
        kafka.hard_kill(self.broker)
        return "broker SIGKILLed under running commits and started again"


@pytest.mark.timeout(max(2700, OPS * 60))   # make soak runs longer
@pytest.mark.real_nodes
def test_lifecycle_chaos_through_the_operator_keeps_every_id_exactly_once(stack_env, nodes, private_kafka, kubectl,
                                                                           namespace, on_nodes, tmp_path,
                                                                           report_result):
    rng = random.Random(int(os.environ.get("EOS_LIFECYCLE_SEED", "20261124")))
    ops = schedule(rng, OPS)
    # The stream's source, sink and ledger are on a broker of this test alone, the one its broker-kill SIGKILLs
    # (the manifest carries the bootstrap: the operator's resolution and the driver Pods go there too); the
    # stack's broker, which the tests running beside this one use, is never touched. The Pods reach it at the
    # stack's services address, forwarded to its listener for Pods (kept across its kill and restart).
    port = private_kafka.pods_port
    with (tmp_path / "forward.log").open("w") as flog, contextlib.ExitStack() as cleanup:
        forward = Forwarder(on_nodes.pod_env["EOS_SERVICES_IP"], f"127.0.0.1:{port}", flog, port=port)
        cleanup.callback(forward.stop)
        on_nodes.bootstrap = forward.listen
        r = cleanup.enter_context(rig({**stack_env, "KAFKA_BOOTSTRAP": private_kafka.bootstrap}, kubectl,
                                      namespace, tmp_path, on_nodes=on_nodes))
        run_lifecycle(r, rng, ops, private_kafka, kubectl, namespace, report_result)


def run_lifecycle(r: Rig, rng: random.Random, ops: list[str], private_kafka, kubectl, namespace: str,
                  report_result) -> None:
    life = Lifecycle(r, rng, private_kafka.stack)
    feed = IdFeed(r.bootstrap, r.topics.events, chunk=50, pause=1.0)
    feed.send(2_000, -1, 1_000_000)
    r.start_operator()
    life.apply()
    feed.start()
    done: Counter = Counter()
    started = time.monotonic()
    try:
        life.wait_progress("the first start", 300)
        for i, op in enumerate(ops):
            assert feed.error is None, f"the id feed failed before operation {i}: {feed.error!r}"
            t0 = time.monotonic()
            what = getattr(life, op.replace("-", "_"))()
            life.wait_progress(f"operation {i} ({op}: {what})")
            done[op + ("-missed" if what.endswith("had no process to kill") else "")] += 1
            life.journal.append(f"{i:3d} {op:16s} {time.monotonic() - t0:5.0f}s  {what}")
            print(life.journal[-1], flush=True)
        expected = feed.finish()
        wait_ids(r.bootstrap, r.topics.counts, expected, r.diag, timeout=600)
        assert_ids_exactly_once(r.bootstrap, r.topics.counts, r.topics.ledger(namespace, NAME), expected,
                                (r.topics.dlq,))
    finally:
        feed.stop_flag.set()
        if kafka.status(private_kafka.stack)[0] != "running":
            kafka.up(private_kafka.stack)
    reasons = kubectl.events(namespace, NAME)
    assert "UpgradeRolledBack" in reasons or not done["rollback"], reasons
    assert done["driver-kill"] >= 1, f"no driver kill found a process to kill: {dict(done)}"
    # No driver was ever refused a batch: each operation leaves the stream where the next can go on (a
    # re-created stream once upgraded onto its predecessor's stale checkpoint location and was refused).
    refused = [m for e in kubectl.event_objects(namespace, NAME) for m in [e.get("message") or ""]
               if "BatchRefused" in m]
    assert not refused, refused
    print("\n".join(life.journal))
    report_result(f"lifecycle chaos: {sum(done.values())} operations through the operator in "
                  f"{time.monotonic() - started:.0f}s ({dict(sorted(done.items()))}); "
                  f"{len(expected)} unique ids, every one exactly once")
