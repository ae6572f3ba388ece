"""Real nodes (stack/eos_stack/node.py): kubelets on containerd and runc with a CNI bridge, and kube-scheduler.

What only a real node gives, checked on the real parts: Nodes that register and turn Ready, a Pod that
meets the ``restricted`` Pod Security level scheduled by kube-scheduler and run from the project's image
(``make image``) with its output read back through the API server (``kubectl logs``), a cgroup memory limit
that OOM-kills (``OOMKilled``, exit 137), and a Pod deletion that takes every process of the container, also
a child in a session and process group of its own (killing the Pod's process group alone would leave it).

The module starts the node part unless it runs and leaves it running (every test's Pods run there), so it runs
beside the other tests. It fails, never skips, when the stack, the
node part or the image is missing.
"""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from eos_stack import kube, node
from eos_stack.common import Stack
from eos_stack.node_config import TAINT
from tests.harness.real_nodes import UID, finished, pod_processes, real_pod, wait_pod

pytestmark = pytest.mark.timeout(900)   # the first test also waits for the nodes (image import: ~1 min a node)


@pytest.fixture
def ns(restricted_ns):
    return restricted_ns


def pod(name: str, command: list[str], **kw) -> dict:
    return real_pod(name, command, **kw)


def kubectl(env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([env["KUBECTL"], f"--kubeconfig={env['KUBECONFIG']}", *args], capture_output=True,
                          text=True, timeout=60)


def test_nodes_register_and_turn_ready(api, nodes):
    v1 = client.CoreV1Api(api)
    for n in nodes:
        got = v1.read_node(n.name)
        ready = [c for c in got.status.conditions if c.type == "Ready"]
        assert ready and ready[0].status == "True", got.status.conditions
        assert {(a.type, a.address) for a in got.status.addresses} >= {("InternalIP", n.node_ip)}
        assert got.status.node_info.container_runtime_version.startswith("containerd://1.6"), got.status.node_info
        assert got.status.node_info.kubelet_version == "v1.35.4"
        assert not [t for t in (got.spec.taints or []) if t.key == "node.kubernetes.io/not-ready"]
        assert [(t.key, t.value, t.effect) for t in got.spec.taints or [] if t.key == TAINT["key"]] == \
            [(TAINT["key"], TAINT["value"], TAINT["effect"])], got.spec.taints


def test_restricted_pod_runs_the_image_on_a_scheduled_node(api, nodes, ns, stack_env):
    v1 = client.CoreV1Api(api)
    # Negative control: the namespace really enforces restricted (a Pod without the security context is refused).
    bare = pod("bare", ["true"])
    bare["spec"].pop("securityContext")
    bare["spec"]["containers"][0].pop("securityContext")
    with pytest.raises(ApiException) as refused:
        v1.create_namespaced_pod(ns, bare)
    assert refused.value.status == 403 and "restricted" in refused.value.body
    # No nodeName: kube-scheduler places it.
    v1.create_namespaced_pod(ns, pod("hello", ["python", "-c", "import os, sys; print('hello from', os.getuid(), "
                                               "os.getgid(), sys.version_info[:2])"]))
    done = wait_pod(v1, ns, "hello", finished, "hello to finish")
    assert done.status.phase == "Succeeded", done.status
    by_name = {n.name: n for n in nodes}
    assert done.spec.node_name in by_name, done.spec.node_name
    subnet = by_name[done.spec.node_name].pod_cidr.rsplit(".", 2)[0]
    assert done.status.pod_ip.startswith(subnet + "."), (done.status.pod_ip, subnet)
    logs = kubectl(stack_env, "logs", "-n", ns, "hello")      # API server -> kubelet at its InternalIP
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.startswith(f"hello from {UID} {UID} (3, "), logs.stdout


def test_pod_over_its_memory_limit_is_oom_killed(api, nodes, ns):
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_pod(ns, pod("hog", ["python", "-c", "x = b'x' * (256 << 20); print('survived')"],
                                     memory="64Mi", node_name=nodes[-1].name))
    done = wait_pod(v1, ns, "hog", finished, "hog to end")
    term = done.status.container_statuses[0].state.terminated
    assert done.status.phase == "Failed", done.status
    assert (term.reason, term.exit_code) == ("OOMKilled", 137), term
    # Negative control: the same program within a limit that fits runs to the end.
    v1.create_namespaced_pod(ns, pod("fits", ["python", "-c", "x = b'x' * (16 << 20); print('survived')"],
                                     memory="256Mi", node_name=nodes[-1].name))
    fits = wait_pod(v1, ns, "fits", finished, "fits to end")
    assert fits.status.phase == "Succeeded", fits.status


TREE = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)       # only the end of the grace period (SIGKILL) stops us
child = os.fork()
if child == 0:
    os.setsid()                                      # a session and process group of its own
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(3600)
    sys.exit(0)
print('tree', os.getpid(), child, flush=True)
time.sleep(3600)
"""


def test_deleting_a_pod_kills_every_process_of_its_container(api, nodes, ns):
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_pod(ns, pod("tree", ["python", "-c", TREE], node_name=nodes[0].name, grace=3))
    running = wait_pod(v1, ns, "tree", lambda p: p.status.phase == "Running", "tree to run")
    uid = running.metadata.uid
    deadline = time.monotonic() + 30
    procs: dict[int, int] = {}
    while time.monotonic() < deadline:
        procs = {pid: pgid for pid, pgid in pod_processes(uid).items()
                 if b"python" in Path(f"/proc/{pid}/cmdline").read_bytes()}
        if len(procs) >= 2:
            break
        time.sleep(0.5)
    assert len(procs) >= 2, f"the container's two python processes in the Pod's cgroup: {procs}"
    assert len(set(procs.values())) >= 2, f"the child has a process group of its own: {procs}"
    v1.delete_namespaced_pod("tree", ns)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            v1.read_namespaced_pod("tree", ns)
        except ApiException as exc:
            if exc.status == 404:
                break
            raise
        time.sleep(0.5)
    else:
        raise AssertionError("the Pod was not gone 60 s after its deletion")
    alive = [pid for pid in procs if Path(f"/proc/{pid}").exists()
             and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"]
    assert not alive, f"processes of the deleted Pod still run: {alive}"
    assert not pod_processes(uid), f"processes still in the Pod's cgroup: {pod_processes(uid)}"


def test_node_part_status(nodes):
    state, detail = node.status(Stack())
    assert state == "running", detail
    for n in nodes:
        assert n.name in detail and n.pod_cidr in detail


def test_starting_the_node_part_leaves_the_api_server_alone(nodes):
    """The node part may start while other tests run: it must not restart the shared API server (kube.up
    restarts it when its arguments change; the kubelet flags are the kube part's own, set by a plain up)."""
    st = Stack()
    before = st.running_pid("kube-apiserver")
    assert before is not None
    node.up(st)                                     # again: all runs, nothing to start
    assert st.running_pid("kube-apiserver") == before
    argv = kube._argv(before)
    assert "--kubelet-preferred-address-types=InternalIP" in argv, argv
    assert any(a.startswith("--kubelet-client-certificate=") for a in argv), argv
