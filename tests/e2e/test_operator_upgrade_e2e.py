"""An operator upgrade while a stream runs (issue 31): the previous build's operator and runtime hand the running
unique-id stream to this build's, and nothing restarts that the spec does not ask for.

The previous build is ``PREVIOUS_BUILD``, the last commit that landed (until a ``v0.1.0`` tag exists; ``make
release`` is where it moves on): its ``jobs/``, ``operator/`` and ``examples/`` are taken from git into a folder
of their own, and its operator (a host process, as in every operator e2e) runs on them, as do the driver Pods
the process kubelet starts while it runs. That operator launches the stream and its driver commits batches
with ids arriving. Then the operator is replaced as a Deployment's rollout replaces it (SIGTERM, then this
build's operator starts), and the test checks:

- the running driver is adopted, not restarted: the same Pod (uid), no new driver Pod, the stream Running
  throughout, and its status moving on under the new operator (its last committed batch, which only an
  operator writes, passes the one seen at the switch);
- a spec change that needs a new driver (``triggerIntervalMs``: a restart on the live checkpoint) starts it
  on this build's runtime, which continues the previous runtime's checkpoint and ledger;
- every id sent is in the output exactly once (read_committed, set equality, none twice; the ledger audit).

Not covered here: the CRDs of the previous build. They are cluster-wide, and applying older ones would prune
fields from every other test's objects; the CRDs' compatibility is the unit tier's
(``tests/operator/test_crd.py`` and the API policy's tests) and ``tests/chart`` installs and upgrades the chart.
"""
from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from eos_stack import cluster
from eos_stack.cluster import holds_for, wait_until
from tests.e2e.streams import IDS, NAME, IdFeed, finish_ids, rig

pytestmark = pytest.mark.stack

# The last commit that landed (CI passed on it: stop 36 of 2026-11-28). Moves on with each release.
PREVIOUS_BUILD = "a4d14b56fcac2045e6c37e83abf9de173e7e69d7"
REPO = Path(__file__).resolve().parents[2]


def previous_build(dest: Path) -> str:
    """The previous build's code in ``dest``; its PYTHONPATH."""
    done = subprocess.run(["git", "-C", str(REPO), "archive", PREVIOUS_BUILD, "jobs", "operator", "examples"],
                          capture_output=True)
    assert done.returncode == 0, (
        f"the previous build {PREVIOUS_BUILD[:12]} is not in this clone's history ({done.stderr.decode().strip()}): "
        "clone the repository with its history (no --depth) to run the operator-upgrade test")
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return ":".join(str(dest / p) for p in ("jobs", "operator", ""))


def test_an_operator_upgrade_adopts_the_running_stream_and_keeps_it_exact(stack_env, kubectl, namespace,
                                                                          tmp_path, report_result):
    old_path = previous_build(tmp_path / "previous")
    on_old: set[str] = set()
    phase = {"old": True}

    def env_for(pod: str) -> dict[str, str]:
        """Pods started while the previous operator runs run the previous runtime."""
        if phase["old"]:
            on_old.add(pod)
            return {"PYTHONPATH": old_path}
        return {}

    with rig(stack_env, kubectl, namespace, tmp_path, env_for=env_for) as r:
        old = r.operator = cluster.OperatorProcess(stack_env["KUBECONFIG"], namespace, tmp_path / "operator-old.log",
                                                   PYTHONPATH=old_path).start()
        r.diag.operator = old
        feed = IdFeed(r.bootstrap, r.topics.events, chunk=50, pause=1.0)
        r.feeds.append(feed)
        feed.send(1000, 53, 1_000_000)
        kubectl.apply(r.stream(IDS), namespace)
        st = r.wait_status(lambda s: s.get("lifecycleState") == "Running" and s.get("lastCommittedBatch") is not None,
                           "the previous build's operator to run the stream and see its first batch committed", 300)
        feed.start()
        driver = st["driverPod"]
        assert driver in on_old, (driver, on_old)
        uid = kubectl.json("get", "pod", driver, "-n", namespace)["metadata"]["uid"]
        r.wait_status(lambda s: s["lastCommittedBatch"] >= 2, "the previous runtime to commit the feed's batches")

        # The rollout: the old operator stops, the new one starts; Pods from now on run this build's runtime.
        old.stop()
        at_switch = r.status()["lastCommittedBatch"]
        phase["old"] = False
        r.start_operator(log="operator-new.log")

        def same_driver() -> bool:
            s = r.status()
            pods = [p["metadata"]["name"] for p in kubectl.pods(namespace)
                    if p["metadata"]["name"].startswith(f"{NAME}-driver-")]
            live = kubectl.json("get", "pod", driver, "-n", namespace)["metadata"]["uid"]
            return s.get("lifecycleState") == "Running" and s.get("driverPod") == driver and pods == [driver] \
                and live == uid

        wait_until(lambda: (r.status().get("lastCommittedBatch") or -1) > at_switch + 2,
                   "the new operator to report batches the adopted driver committed", 120, r.diag, 1)
        holds_for(same_driver, "the adopted driver running on, alone and unrestarted", 15, r.diag)
        adopted = r.status()["lastCommittedBatch"]

        # A change that needs a new driver: this build's runtime continues the previous one's checkpoint.
        kubectl.patch_spec(namespace, NAME, {"triggerIntervalMs": 700})
        st = r.wait_status(lambda s: s.get("lifecycleState") == "Running" and s.get("driverPod") not in (None, driver),
                           "the spec change's new driver", 300)
        assert st["driverPod"] not in on_old, (st["driverPod"], on_old)
        r.wait_status(lambda s: (s.get("lastCommittedBatch") or -1) > adopted + 1,
                      "the new runtime to commit batches after the previous one's", 240)
        ids = finish_ids(r, feed)
        report_result(f"operator upgrade from {PREVIOUS_BUILD[:7]}: {driver} (previous runtime) adopted at batch "
                      f"{at_switch} and ran on to batch {adopted}; {st['driverPod']} (this build's runtime) "
                      f"continued its checkpoint; {len(ids)} ids exactly once")
