"""Node loss on the real nodes: the driver's kubelet stops, the driver keeps running, the operator replaces it on the
other node after NODE_LOSS_GRACE_SECONDS without waiting for its Pod, and the epoch fence stops the old driver.

The unique-id stream runs under the operator (a host process, as in test_real_node_stream.py) with its driver on a
real node X. Its backlog is less than a batch (batch 0), then the source is idle. X's kubelet is stopped (containerd
and the driver's container keep running: ``node.stop_kubelet``); the node lifecycle controller marks X Unknown
(kube.py: 20 s without a Lease renewal) and taints it unreachable; the operator says DriverNodeNotReady, then, 30 s
later, DriverNodeLost: it deletes the old Pod (Terminating for good: no kubelet confirms it) and, the old container
seen still running, resolves and starts the next driver, which the taint sends to the other node.

Right after the resolution new ids arrive: the old driver, still running on X, starts batch 1. Two guards of the
protocol stop such a zombie, each on its own, and the cases switch them off in the drivers
(``EOS_UNSAFE_DISABLE`` through the test operator's ``EOS_TEST_DRIVER_ENV``; ``EOS_FAULT_HOLD_OPEN`` from batch 1,
first driver only, holds its slot transactions open until a file in the old Pod's scratch volume, written on the
host, releases them):

* ``guarded`` (every safety on; ``make test``): the old driver's first write of batch 1, its input record in ledger
  partition 0, goes through the stream's driver transactional id, which the resolution fenced: the write fails and
  the driver stops ``Superseded`` ("ledger writer was fenced") before any slot transaction opens.
* ``writer-fence`` (``fence`` off, soak): the same guard, with the slot fence off: that guard alone stops it.
* ``slot-fence`` (``stream-epoch`` off, soak: the partition-0 writer takes an id of its own): the old driver records
  batch 1 and goes on to its slot transactions, through the producers it kept from batch 0 (amendment A2: no
  fence, no read), which the resolution fenced: their writes are refused ("fenced by a newer instance"). What
  follows depends on timing, and either way is exact: a slot that reached the hold fails at its commit and its
  next read meets the new driver's epoch (``Superseded``); or its next round fences again and, no newer epoch
  stamped yet, commits batch 1 as the stream's newest driver, which the new driver then finds committed. It stops
  by itself at its next write at the latest.
* ``unguarded`` (``fence`` and ``stream-epoch`` off, soak): the negative control. Its producers' ids are its own, so
  the resolution fenced nothing of the old driver: it holds batch 1's transactions open across the replacement, the
  new driver re-runs batch 1 (a read the held transactions hold back is taken as the answer), and after the
  release the old driver's transactions commit on top: the same audit reports the duplicates.

The guarded cases end with every id in the output once (``assert_ids_exactly_once``). The old driver's log (read
from X's log directory: no kubelet serves it) is kept as ``old-driver.log`` in the test's folder. X's kubelet is
started again (always, in a finally; any ``up node`` restarts a stopped kubelet too), removes the old Pod's
containers and confirms its deletion. The test is marked ``stops_a_node``: no other test uses the real nodes while X
is lost (tests/harness/node_lock.py); the tests that run no Pod there go on beside it.
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from kubernetes import client, config

from examples.colors.generator import expected_ids

from eos_job.pod_template import SCRATCH_DIR, SCRATCH_VOLUME
from eos_job.spec import API_GROUP, API_VERSION, PLURAL
from eos_operator.children import DRIVER_CONTAINER
from eos_operator.planner.node_loss import LOST, NODE_LOSS_GRACE_SECONDS, NOT_READY
from eos_stack.cluster import wait_until
from tests.e2e.streams import (NAME, ColorsTopics, Diagnostics, IdFeed, OperatorProcess,
                               assert_ids_exactly_once, wait_ids)
from tests.e2e.test_real_node_stream import BATCH, on_a_real_node, real_node_stream
from tests.harness.real_nodes import (committed_batch, container_processes, keys_secret, read_pod, stream_status,
                                      wait_processes_gone)

pytestmark = [pytest.mark.timeout(900), pytest.mark.stops_a_node]
HELD_BATCH = 1        # the backlog, less than a batch (BATCH records at most), is batch 0; the old driver holds batch 1
WRITER_FENCED = "ledger writer was fenced"       # epoch.write_driver_record's DriverSuperseded
HOLDING = "holding the transaction"              # faults.py's journal line
SLOT_FENCED = "fenced by a newer instance"       # librdkafka's _FENCED, a slot producer's write refused
CASES = [pytest.param("", id="guarded"),
         pytest.param("fence", id="writer-fence", marks=pytest.mark.soak),
         pytest.param("stream-epoch", id="slot-fence", marks=pytest.mark.soak),
         pytest.param("fence,stream-epoch", id="unguarded", marks=pytest.mark.soak)]


def read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def node_ready_status(v1, node: str) -> str:
    return next(c.status for c in v1.read_node(node).status.conditions if c.type == "Ready")


def pod_dir(layout, uid: str) -> Path:
    return layout.kubelet_root / "pods" / uid / "volumes" / "kubernetes.io~empty-dir" / SCRATCH_VOLUME


def container_log(layout, namespace: str, pod: str, uid: str) -> str:
    """The container's log as the stopped kubelet's containerd writes it (no kubelet serves `kubectl logs`)."""
    logs = sorted((layout.home / "pod-logs" / f"{namespace}_{pod}_{uid}" / DRIVER_CONTAINER).glob("*.log"))
    return "\n".join(p.read_text(errors="replace") for p in logs)


def evidence(log: str) -> str:
    """The old driver's log lines from batch 1 on that say how it ended (for the report), without the CRI prefix."""
    keys = ("Superseded", "fenced", "fencing again", "fault injection", "batch 1 committed", "Failed:")
    lines = [line.split(" F ", 1)[-1].strip()[:240] for line in log.splitlines()
             if any(k in line for k in keys) and "UNSAFE" not in line]
    return " | ".join(lines[:8])


@pytest.mark.parametrize("unsafe", CASES)
def test_a_lost_nodes_driver_is_replaced_on_the_other_node_and_fenced(
        stack_env, nodes, kubectl, namespace, tmp_path, report_result, unsafe):
    from eos_stack import node
    from eos_stack import node_services
    from eos_stack.common import Stack
    t_start = time.monotonic()
    st = Stack()
    pod_env = node_services.pod_env(st)
    topics = ColorsTopics(stack_env["KAFKA_BOOTSTRAP"])
    ledger = topics.ledger(namespace, NAME)
    kubectl.apply(keys_secret(stack_env), namespace)
    release, journal = f"{SCRATCH_DIR}/release", f"{SCRATCH_DIR}/faults.journal"
    driver_env = [[0, "EOS_FAULT_HOLD_OPEN", "600"], [0, "EOS_FAULT_FROM_BATCH", str(HELD_BATCH)],
                  [0, "EOS_FAULT_HOLD_RELEASE", release], [0, "EOS_FAULT_JOURNAL", journal]]
    if unsafe:
        driver_env.append([None, "EOS_UNSAFE_DISABLE", unsafe])
    off = set(filter(None, unsafe.split(",")))
    writer_guard = "stream-epoch" not in off   # the old driver's batch-1 record meets its fenced writer
    exact = not {"fence", "stream-epoch"} <= off
    holds = not exact                          # nothing of the old driver fenced: it holds batch 1 open
    operator = OperatorProcess(stack_env["KUBECONFIG"], namespace, tmp_path / "operator.log",
                               EOS_TEST_DRIVER_ENV=json.dumps(driver_env)).start()
    api = config.new_client_from_config(config_file=stack_env["KUBECONFIG"])
    v1, crs = client.CoreV1Api(api), client.CustomObjectsApi(api)

    def status() -> dict:
        return stream_status(crs, namespace, NAME)

    def committed() -> int:
        return committed_batch(status())

    diagnose = Diagnostics(kubectl, namespace, operator)
    feed = IdFeed(topics.bootstrap, topics.events)     # its sends only (no thread): every id sent is known
    stopped = None            # the layout of the node whose kubelet this test stopped
    old_log = lambda: ""      # noqa: E731 - the old driver's log once its Pod is known

    def keep_old_log() -> str:
        text = old_log()
        if text:
            (tmp_path / "old-driver.log").write_text(text)
        return text
    try:
        feed.send(BATCH // 2, 11, 0)
        doc = real_node_stream(topics, pod_env, stack_env["S3_BUCKET"], f"/e2e-node-loss/{namespace}")
        doc["spec"]["job"].pop("metrics", None)
        doc["spec"]["sink"]["transactionTimeoutMs"] = 300_000     # the held transactions outlive the replacement
        crs.create_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, doc)
        first = wait_until(lambda: (lambda p: p if p is not None and p.status.phase == "Running" else None)(
            read_pod(v1, namespace, f"{NAME}-driver-0")), "the first driver Pod to run on a real node", 300,
            diagnose, 1)
        first_node = on_a_real_node(kubectl.json("get", "pod", f"{NAME}-driver-0", "-n", namespace), nodes)
        wait_until(lambda: committed() >= HELD_BATCH - 1, "the backlog's batch committed", 420, diagnose, 1)
        uid, cid = first.metadata.uid, first.status.container_statuses[0].container_id
        stopped = next(n for n in nodes if n.name == first_node)
        assert container_processes(cid), "the first driver's container runs no process"

        t_lost = time.monotonic()
        node.stop_kubelet(st, first_node)
        wait_until(lambda: node_ready_status(v1, first_node) != "True", f"{first_node} NotReady", 120, diagnose, 1)
        not_ready_s = time.monotonic() - t_lost
        # The operator's stated behaviour: it says so, waits the grace, then replaces the driver.
        wait_until(lambda: NOT_READY in kubectl.events(namespace, NAME), "the DriverNodeNotReady event", 60,
                   diagnose, 1)
        assert status()["conditions"] and any(c["type"] == "Ready" and c["reason"] == NOT_READY
                                              for c in status()["conditions"]), status()
        wait_until(lambda: "Resolved" in kubectl.events(namespace, NAME)[kubectl.events(namespace, NAME).index(
            NOT_READY):], "the replacement's resolution", NODE_LOSS_GRACE_SECONDS + 120, diagnose, 0.5)
        replaced_s = time.monotonic() - t_lost
        reasons = kubectl.events(namespace, NAME)
        assert LOST in reasons and reasons.index(NOT_READY) < reasons.index(LOST) < len(reasons), reasons
        # The old container still runs (the replacement did not wait for it) and its Pod is still there.
        alive = container_processes(cid)
        assert alive, "the old driver's container stopped before the replacement: nothing to fence"
        old = v1.read_namespaced_pod(f"{NAME}-driver-0", namespace)
        assert old.metadata.deletion_timestamp is not None and old.spec.node_name == first_node, old.metadata
        # New ids now: the old driver (still running, the new one still starting) begins batch 1 and holds it.
        feed.send(BATCH // 2, 12, BATCH // 2)
        scratch = pod_dir(stopped, uid)
        old_log = lambda: container_log(stopped, namespace, f"{NAME}-driver-0", uid)   # noqa: E731, F811
        journal = lambda: read_text(scratch / "faults.journal")                        # noqa: E731
        if holds:
            wait_until(lambda: HOLDING in journal(), "the old driver holding batch 1 open", 120,
                       lambda: diagnose() + "\nold driver log:\n" + old_log()[-4000:], 0.5)
        elif writer_guard:
            # The resolution fenced the driver id: the old driver's batch-1 input record fails, it stops by itself.
            gone_s = wait_processes_gone(alive, timeout=120)
            log = keep_old_log()
            assert WRITER_FENCED in log and HOLDING not in journal(), evidence(log) or log[-4000:]
            fenced = (f"the old driver stopped by itself {gone_s:.0f} s after the new ids, before holding anything "
                      f"({WRITER_FENCED}: its partition-0 writer, fenced by the resolution)")
        running = wait_until(lambda: (lambda s: s if s.get("driverPod") == f"{NAME}-driver-1"
                                      and s.get("lifecycleState") == "Running" else None)(status()),
                             "the replacement driver to run", 300, diagnose, 1)
        second_node = on_a_real_node(kubectl.json("get", "pod", f"{NAME}-driver-1", "-n", namespace), nodes)
        assert second_node != first_node, f"the replacement landed on the lost node {first_node}"
        if writer_guard or holds:
            # From its log, not status: unguarded, the old driver's open transactions hold the ledger's
            # read_committed end back (the operator's progress read) until the release. (With the slot fence alone
            # the old driver may commit batch 1 itself first, see below: the new driver then has none to run.)
            wait_until(lambda: re.search(rf"batch {HELD_BATCH} committed:", kubectl.run(
                "logs", "-n", namespace, f"{NAME}-driver-1", check=False).stdout),
                "the replacement to commit batch 1", 420, diagnose, 1)
        (scratch / "release").touch()     # the old driver's held transactions (if any) try to commit now
        if holds:
            wait_until(lambda: "committing the held transaction" in journal(),
                       "the old driver to commit its held transactions", 60, diagnose, 0.5)
            fenced = ("the old driver held batch 1's transactions open across the replacement and committed them "
                      "after the release (unguarded)")
        feed.send(BATCH // 2, 13, BATCH)
        expected = set().union(*(expected_ids(n, seed, start) for n, seed, start in feed.chunks))
        wait_ids(topics.bootstrap, topics.counts, expected, diagnose, timeout=300)
        if not writer_guard and exact:
            # The slot fence alone. The old driver's batch-1 writes go through the producers it kept from batch 0
            # (amendment A2), which the resolution fenced: refused. Then, by timing, either a slot had reached the
            # hold (its commit fails after the release and its next read meets the new epoch), or its next round
            # fenced again and, no newer epoch stamped yet, committed batch 1 as the stream's newest driver (the
            # new one then finds it committed). Either way it stops by itself at its next write at the latest (the
            # last ids above give it one), while its node is still lost, and the audit below is exact.
            gone_s = wait_processes_gone(alive, timeout=180)
            log = keep_old_log()
            assert SLOT_FENCED in log and WRITER_FENCED not in log, evidence(log) or log[-4000:]
            how = ("held batch 1 open, then its commit was fenced" if HOLDING in journal() else
                   "committed batch 1 itself in its next fenced round, before the new epoch" if re.search(
                       rf"batch {HELD_BATCH} committed:", log) else "wrote nothing of batch 1")
            fenced = (f"the old driver's batch-1 slot writes were refused ({SLOT_FENCED}: its producers, kept from "
                      f"batch 0, fenced by the resolution); it {how}; it had stopped by itself at the latest "
                      f"{gone_s:.0f} s after the last ids ({'Superseded' if 'Superseded' in log else 'see its log'})")
        t_back = time.monotonic()
        log = keep_old_log()
        node.up(st)                        # X's kubelet again: it stops the old Pod's containers, the Pod goes
        stopped = None
        wait_until(lambda: not [p for p in kubectl.pods(namespace) if p["metadata"]["name"] == f"{NAME}-driver-0"],
                   "the old driver Pod removed by its kubelet", 180, diagnose, 1)
        wait_processes_gone(alive, timeout=60)
        back_s = time.monotonic() - t_back
        if exact:
            assert_ids_exactly_once(topics.bootstrap, topics.counts, ledger, expected, (topics.dlq,))
            verdict = f"{len(expected)} ids exactly once"
        else:
            with pytest.raises(AssertionError, match="not exactly once") as seen:
                assert_ids_exactly_once(topics.bootstrap, topics.counts, ledger, expected, (topics.dlq,))
            verdict = f"negative control: the audit reported {str(seen.value)[:300]}"
        assert running["restartCount"] >= 1, running     # node loss counts as a failure (restartStrategy)
        report_result(f"node loss ({unsafe or 'every safety on'}): {first_node}'s kubelet stopped; NotReady after "
                      f"{not_ready_s:.0f} s, replaced (resolved) {replaced_s:.0f} s after the stop with the old "
                      f"container running ({len(alive)} processes) and its Pod Terminating; {NAME}-driver-1 on "
                      f"{second_node}; {fenced}; kubelet back, old Pod gone {back_s:.0f} s later; {verdict}; "
                      f"{time.monotonic() - t_start:.0f} s in all; old driver's log: {evidence(log)}")
    finally:
        if stopped is not None:
            keep_old_log()
            try:
                node.up(st)                # always: the other tests share the nodes
            except Exception as exc:  # noqa: BLE001 - reported, the test has failed already
                print(f"cleanup: restarting {stopped.name}'s kubelet failed: {exc}")
        try:
            crs.delete_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, NAME)
            wait_until(lambda: not kubectl.pods(namespace), "the stream's Pods deleted", 120)
        except Exception as exc:  # noqa: BLE001 - cleanup; the namespace fixture releases what is left
            print(f"cleanup: {exc}")
        operator.stop()
        api.close()
