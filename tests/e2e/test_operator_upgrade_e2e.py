"""An operator upgrade while a stream runs (issue 31): the previous build's operator and runtime hand the running
unique-id stream to this build's, and nothing restarts that the spec does not ask for.

The previous build is ``PREVIOUS_BUILD``, the last commit that landed (until a ``v0.1.0`` tag exists; ``make
release`` is where it moves on): its ``jobs/``, ``operator/`` and ``examples/`` are taken from git into a folder
of their own, and its operator (a host process, as in every operator e2e) runs on them. The Pods run on the real
nodes (tests/e2e/on_nodes.py), in the project's image: the Pods the previous operator creates run the previous
build's runtime, its ``eos_job`` from a ConfigMap mounted at ``/opt/previous/eos_job`` and put first on their
``PYTHONPATH`` (``EOS_TEST_POD_ENV``, a test-only patch of the operator from outside its code,
``tests/e2e/streams.py``). That operator launches the stream and its driver commits batches with ids arriving.
Then the operator is replaced as a Deployment's rollout replaces it (SIGTERM, then this build's operator
starts), and the test checks:

- the running driver is adopted, not restarted: the same Pod (uid), no new driver Pod, the stream Running
  throughout, and its status moving on under the new operator (its last committed batch, which only an
  operator writes, passes the one seen at the switch);
- a spec change that needs a new driver (``triggerIntervalMs``: a restart on the live checkpoint) starts it
  on this build's runtime, which continues the previous runtime's checkpoint and ledger;
- every id sent is in the output exactly once (read_committed, set equality, none twice; the ledger audit);
- the runtime versions (issue 31, amendment A3): the previous runtime reports none (``runtimeVersion`` unset, not
  judged), this build's reports ``eos_job.__version__`` and is inside the policy.

Beside it, a second stream is the negative control of the adoption check and the version-skew check: the same
old operator and runtime start it, and the new operator is switched (``EOS_TEST_FORGET_ADOPTION``, a test-only
patch from outside its code, ``tests/e2e/streams.py``) to read its running driver's spec as another trigger
interval, so it restarts that driver instead of adopting it. :func:`adoption_violations`, the check the first
stream must pass, must report the new driver Pod. The restarted driver runs a copy of this build's runtime (a
ConfigMap at ``/opt/skewed/eos_job``, by the same patch for the control's Pods only) whose
``eos_job.__version__`` is outside the policy (newer than the operator: with this build at 0.1 no version is
older than the policy allows; the unit tests judge those): the stream must turn Degraded ``RuntimeVersionSkew``
with one Warning event and keep committing with the same driver. The main stream's spec-change restart is made
while that driver starts, so the control costs one overlapped driver start-up. Not here, for ``make test``'s
budget (a third driver start of the control, +22 s measured): the restart onto a runtime inside the policy and
its ``RuntimeVersionInPolicy`` event (the unit tests' ``tests/operator/test_planner_version_skew.py``).

Not covered here: the CRDs of the previous build. They are cluster-wide, and applying older ones would prune
fields from every other test's objects; the CRDs' compatibility is the unit tier's
(``tests/operator/test_crd.py`` and the API policy's tests) and ``tests/chart`` installs and upgrades the chart.
"""
from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

import eos_job
from eos_operator.version_skew import REASON as SKEW, skew_message
from eos_stack.cluster import Kubectl, condition, holds_for, wait_until
from tests.e2e.streams import IDS, NAME, ColorsTopics, IdFeed, OperatorProcess, colors_stream, finish_ids, rig
from tests.previous_build import PREVIOUS_BUILD

pytestmark = pytest.mark.stack

REPO = Path(__file__).resolve().parents[2]
CONTROL = "adopt-control"   # the negative control's stream
_MAJOR, _MINOR = (int(x) for x in eos_job.__version__.split(".")[:2])
SKEWED = f"{_MAJOR}.{_MINOR + 1}.0"   # a runtime newer than the operator: outside the policy


def previous_build(dest: Path) -> str:
    """The previous build's code in ``dest``, for its operator on this machine; its PYTHONPATH."""
    done = subprocess.run(["git", "-C", str(REPO), "archive", PREVIOUS_BUILD, "jobs", "operator", "examples"],
                          capture_output=True)
    assert done.returncode == 0, (
        f"the previous build {PREVIOUS_BUILD[:12]} is not in this clone's history ({done.stderr.decode().strip()}): "
        "clone the repository with its history (no --depth) to run the operator-upgrade test")
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return ":".join(str(dest / p) for p in ("jobs", "operator", ""))


def runtime_files(package: Path) -> dict[str, str]:
    """A flat ``eos_job`` package's modules: file name -> text."""
    return {f.name: f.read_text() for f in sorted(package.glob("*.py"))}


def skewed_runtime() -> dict[str, str]:
    """This build's ``eos_job`` with ``__version__`` set to SKEWED: file name -> text."""
    files = runtime_files(REPO / "jobs" / "eos_job")
    line = f'__version__ = "{eos_job.__version__}"'
    assert line in files["__init__.py"], files["__init__.py"]
    files["__init__.py"] = files["__init__.py"].replace(line, f'__version__ = "{SKEWED}"')
    return files


# The runtimes other than the image's, as ConfigMaps mounted into every Pod of both streams; a Pod runs one only
# when its PYTHONPATH puts it first (EOS_TEST_POD_ENV). The image's own PYTHONPATH is /app (Dockerfile).
RUNTIMES = ("previous", "skewed")
IMAGE_PYTHONPATH = "/app"


def runtime_path(runtime: str) -> str:
    return f"/opt/{runtime}:{IMAGE_PYTHONPATH}"


def runtime_configmap(runtime: str, files: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"runtime-{runtime}"}, "data": files}


def with_runtimes(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` (placed on the nodes) with every runtime's ConfigMap mounted at ``/opt/<runtime>/eos_job``."""
    template = doc["spec"]["job"]["podTemplate"]
    for runtime in RUNTIMES:
        template["volumes"].append({"name": f"runtime-{runtime}", "configMap": {"name": f"runtime-{runtime}"}})
        template["volumeMounts"].append({"name": f"runtime-{runtime}", "mountPath": f"/opt/{runtime}/eos_job",
                                         "readOnly": True})
    return doc


def runs_runtime(kubectl: Kubectl, namespace: str, pod: str) -> str:
    """Which runtime Pod ``pod`` was given: a name of RUNTIMES, or "image" (its PYTHONPATH not overridden)."""
    env = kubectl.json("get", "pod", pod, "-n", namespace)["spec"]["containers"][0].get("env") or []
    path = next((e.get("value") for e in env if e["name"] == "PYTHONPATH"), None)
    return next((r for r in RUNTIMES if path == runtime_path(r)), "image")


def adoption_violations(kubectl: Kubectl, namespace: str, stream: str, driver: str, uid: str) -> list[str]:
    """What says that ``stream``'s driver Pod ``driver`` (uid ``uid``) was not adopted: the stream not Running on
    it, it gone or going, or any other driver Pod of the stream (a new one, of another uid). Empty: adopted."""
    status = kubectl.status(namespace, stream)
    found = []
    if status.get("lifecycleState") != "Running" or status.get("driverPod") != driver:
        found.append(f"status {status.get('lifecycleState')} on {status.get('driverPod')}, not Running on {driver}")
    seen = False
    for pod in kubectl.pods(namespace):
        meta = pod["metadata"]
        if not meta["name"].startswith(f"{stream}-driver-"):
            continue
        if meta["uid"] != uid:
            found.append(f"new driver Pod {meta['name']} (uid {meta['uid']})")
            continue
        seen = True
        if meta.get("deletionTimestamp"):
            found.append(f"{driver} is being deleted")
    if not seen:
        found.append(f"{driver} (uid {uid}) is gone")
    return found


def driver_of(kubectl: Kubectl, namespace: str, status: dict[str, Any]) -> tuple[str, str]:
    driver = status["driverPod"]
    return driver, kubectl.json("get", "pod", driver, "-n", namespace)["metadata"]["uid"]


@pytest.mark.real_nodes
def test_an_operator_upgrade_adopts_the_running_stream_and_keeps_it_exact(stack_env, nodes, kubectl, namespace,
                                                                          on_nodes, tmp_path, report_result):
    old_path = previous_build(tmp_path / "previous")
    runtimes = {"previous": runtime_files(tmp_path / "previous" / "jobs" / "eos_job"), "skewed": skewed_runtime()}
    for runtime, files in runtimes.items():   # created, not applied: an apply's annotation would exceed 256 KiB
        kubectl.run("create", "-n", namespace, "-f", "-", stdin=json.dumps(runtime_configmap(runtime, files)))

    with rig(stack_env, kubectl, namespace, tmp_path, on_nodes=on_nodes) as r:
        # Every Pod the previous operator creates runs the previous runtime.
        old = r.operator = OperatorProcess(stack_env["KUBECONFIG"], namespace, tmp_path / "operator-old.log",
                                           PYTHONPATH=old_path,
                                           EOS_TEST_POD_ENV=json.dumps({"": {"PYTHONPATH": runtime_path("previous")}})
                                           ).start()
        r.diag.operator = old
        feed = IdFeed(r.bootstrap, r.topics.events, chunk=50, pause=1.0)
        r.feeds.append(feed)
        feed.send(1000, 53, 1_000_000)
        kubectl.apply(with_runtimes(r.stream(IDS)), namespace)
        control_topics = ColorsTopics(r.bootstrap)
        control_feed = IdFeed(r.bootstrap, control_topics.events, chunk=20, pause=1.0)
        r.feeds.append(control_feed)
        control_feed.send(200, 54, 1_000_000)
        kubectl.apply(with_runtimes(r.place(colors_stream(CONTROL, control_topics, tmp_path / "control-checkpoint",
                                                          module=IDS))), namespace)
        st = r.wait_status(lambda s: s.get("lifecycleState") == "Running" and s.get("lastCommittedBatch") is not None,
                           "the previous build's operator to run the stream and see its first batch committed", 300)
        feed.start()
        driver, uid = driver_of(kubectl, namespace, st)
        assert runs_runtime(kubectl, namespace, driver) == "previous", driver
        st = r.wait_status(lambda s: s.get("lifecycleState") == "Running" and s.get("lastCommittedBatch") is not None,
                           "the control stream to run and commit", 300, name=CONTROL)
        control_feed.start()
        control_driver, control_uid = driver_of(kubectl, namespace, st)
        assert runs_runtime(kubectl, namespace, control_driver) == "previous", control_driver
        r.wait_status(lambda s: s["lastCommittedBatch"] >= 2, "the previous runtime to commit the feed's batches")
        # The check passes on both before the switch: whatever it reports after, the switch made.
        assert adoption_violations(kubectl, namespace, NAME, driver, uid) == []
        assert adoption_violations(kubectl, namespace, CONTROL, control_driver, control_uid) == []

        # The rollout: the old operator stops, the new one starts; Pods from now on run this build's runtime.
        # The new operator forgets that the control stream's driver runs its spec (the negative control).
        old.stop()
        at_switch = r.status()["lastCommittedBatch"]
        # The control stream's Pods from now on run the skewed copy of this build's runtime.
        r.start_operator(log="operator-new.log", EOS_TEST_FORGET_ADOPTION=CONTROL,
                         EOS_TEST_POD_ENV=json.dumps({f"{CONTROL}-": {"PYTHONPATH": runtime_path("skewed")}}))

        wait_until(lambda: (r.status().get("lastCommittedBatch") or -1) > at_switch + 2,
                   "the new operator to report batches the adopted driver committed", 120, r.diag, 1)
        holds_for(lambda: not adoption_violations(kubectl, namespace, NAME, driver, uid),
                  "the adopted driver running on, alone and unrestarted", 15, r.diag)
        st = r.status()
        adopted = st["lastCommittedBatch"]
        # The previous runtime's records name no version: nothing reported, nothing judged.
        assert "runtimeVersion" not in st and condition(st, "Degraded").get("reason") != SKEW, st

        # The negative control: the same check reports the restart, a new driver Pod.
        restarted = wait_until(lambda: [v for v in adoption_violations(kubectl, namespace, CONTROL, control_driver,
                                                                        control_uid) if v.startswith("new driver Pod")],
                               "the adoption check to report the control stream's restart", 180, r.diag, 1)
        # A change that needs a new driver: this build's runtime continues the previous one's checkpoint. Made
        # now, so that its new driver starts while the control's does (one start-up's wait, not two in a row).
        kubectl.patch_spec(namespace, NAME, {"triggerIntervalMs": 700})
        # The control's new driver runs a runtime outside the policy: Degraded RuntimeVersionSkew, one event,
        # running on.
        skewed = r.wait_status(lambda s: s.get("runtimeVersion") == SKEWED and s.get("lifecycleState") == "Running"
                               and condition(s, "Degraded").get("reason") == SKEW,
                               "the skewed runtime's version reported and judged", 300, name=CONTROL)
        assert runs_runtime(kubectl, namespace, skewed["driverPod"]) == "skewed", skewed["driverPod"]
        assert condition(skewed, "Degraded")["message"] == skew_message(eos_job.__version__, SKEWED), skewed
        assert condition(skewed, "Ready")["status"] == "True", skewed
        r.wait_status(lambda s: s["lastCommittedBatch"] >= skewed["lastCommittedBatch"] + 2
                      and s.get("driverPod") == skewed["driverPod"] and s.get("lifecycleState") == "Running"
                      and condition(s, "Degraded").get("reason") == SKEW,
                      "the skewed stream to keep committing with the same driver", 120, name=CONTROL)
        warned = [e["message"] for e in kubectl.event_objects(namespace, CONTROL)
                  if (e["type"], e["reason"]) == ("Warning", SKEW) for _ in range(int(e.get("count") or 1))]
        assert len(warned) == 1 and SKEWED in warned[0], warned
        kubectl.run("delete", "exactlyoncestream", CONTROL, "-n", namespace, "--wait=false")   # its CPU back

        st = r.wait_status(lambda s: s.get("lifecycleState") == "Running" and s.get("driverPod") not in (None, driver),
                           "the spec change's new driver", 300)
        assert runs_runtime(kubectl, namespace, st["driverPod"]) == "image", st["driverPod"]
        r.wait_status(lambda s: (s.get("lastCommittedBatch") or -1) > adopted + 1,
                      "the new runtime to commit batches after the previous one's", 240)
        st = r.wait_status(lambda s: s.get("runtimeVersion") == eos_job.__version__,
                           "this build's runtime to report its version", 60)
        assert condition(st, "Degraded").get("reason") != SKEW, st
        ids = finish_ids(r, feed)
        report_result(f"operator upgrade from {PREVIOUS_BUILD[:7]}: {driver} (previous runtime) adopted at batch "
                      f"{at_switch} and ran on to batch {adopted}; {st['driverPod']} (this build's runtime "
                      f"{st['runtimeVersion']}) continued its checkpoint; {len(ids)} ids exactly once. Negative "
                      f"control, adoption forgotten: {restarted[0]}; its runtime {SKEWED}: Degraded {SKEW}, "
                      f"one event, kept committing")
