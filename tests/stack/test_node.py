"""Real nodes (stack/eos_stack/node.py): kubelets on containerd and runc with a CNI bridge, and kube-scheduler.

What only a real node gives, checked on the real parts: Nodes that register and turn Ready, a Pod that
meets the ``restricted`` Pod Security level scheduled by kube-scheduler and run from the project's image
(``make image``) with its output read back through the API server (``kubectl logs``), a cgroup memory limit
that OOM-kills (``OOMKilled``, exit 137), and a Pod deletion that takes every process of the container, also
a child in a session and process group of its own (the process kubelet kills one process group).

The module starts the node part and stops it afterwards (a scheduler would take the Pods of the tests that
still use the process kubelet: the file is serial, tests/conftest.py). It fails, never skips, when the stack,
the node part or the image is missing.
"""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from eos_stack import node
from eos_stack.common import Stack, StackError
from eos_stack.image_common import image_name
from eos_stack.node_config import layouts

from .conftest import fresh_namespace

pytestmark = pytest.mark.timeout(900)   # the first test also waits for the nodes (image import: ~1 min a node)

UID = 10001
RESTRICTED = {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SC = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


@pytest.fixture(scope="module")
def nodes(stack_env):
    st = Stack()
    try:
        env = node.up(st)
    except StackError as exc:
        pytest.fail(f"the node part could not start: {exc}", pytrace=False)
    st.update_env(env)
    for n in layouts(st.state, node.count()):
        if image_name() not in node.ctr(n, "images", "ls", "-q").split():
            pytest.fail(f"{image_name()} is not in {n.name}'s containerd: build it with `make image`", pytrace=False)
    yield layouts(st.state, node.count())
    node.down(st)


@pytest.fixture
def ns(api, nodes):
    """A namespace that enforces the restricted Pod Security level, deleted afterwards."""
    yield from fresh_namespace(api, "node", {"pod-security.kubernetes.io/enforce": "restricted",
                                             "pod-security.kubernetes.io/enforce-version": "latest"})


def pod(name: str, command: list[str], *, memory: str | None = None, node_name: str | None = None,
        grace: int = 30) -> dict:
    container = {"name": "main", "image": image_name(), "imagePullPolicy": "Never", "command": command,
                 "securityContext": CONTAINER_SC}
    if memory:
        container["resources"] = {"limits": {"memory": memory, "cpu": "500m"}}
    spec = {"restartPolicy": "Never", "securityContext": RESTRICTED, "containers": [container],
            "terminationGracePeriodSeconds": grace}
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def wait_pod(v1, ns: str, name: str, check, what: str, timeout: float = 180):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = v1.read_namespaced_pod(name, ns)
        if check(last):
            return last
        time.sleep(1)
    events = v1.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
    raise AssertionError(f"{what}: timed out; pod status {last.status if last else None}\n"
                         + "\n".join(f"{e.reason}: {e.message}" for e in events))


def kubectl(env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([env["KUBECTL"], f"--kubeconfig={env['KUBECONFIG']}", *args], capture_output=True,
                          text=True, timeout=60)


def pod_processes(uid: str) -> dict[int, int]:
    """pid -> process group of every process on this machine whose cgroup is the Pod's (cgroupfs: ``pod<uid>``)."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if f"pod{uid}" in (proc / "cgroup").read_text():
                found[int(proc.name)] = os.getpgid(int(proc.name))
        except (OSError, ProcessLookupError):
            continue
    return found


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
    done = wait_pod(v1, ns, "hello", lambda p: p.status.phase in ("Succeeded", "Failed"), "hello to finish")
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
    done = wait_pod(v1, ns, "hog", lambda p: p.status.phase in ("Succeeded", "Failed"), "hog to end")
    term = done.status.container_statuses[0].state.terminated
    assert done.status.phase == "Failed", done.status
    assert (term.reason, term.exit_code) == ("OOMKilled", 137), term
    # Negative control: the same program within a limit that fits runs to the end.
    v1.create_namespaced_pod(ns, pod("fits", ["python", "-c", "x = b'x' * (16 << 20); print('survived')"],
                                     memory="256Mi", node_name=nodes[-1].name))
    fits = wait_pod(v1, ns, "fits", lambda p: p.status.phase in ("Succeeded", "Failed"), "fits to end")
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
