"""Real Kubernetes nodes on this machine: kubelets on containerd, runc and a CNI bridge, and kube-scheduler.

Started on demand (``python -m eos_stack up node`` or ``python -m eos_stack.node up|down|status``), not by a
plain ``eos_stack up`` (a cold node build is minutes; the tests, the demo and the benchmarks that run Pods start
it). Every test's Pods run here (the tests' process kubelet, a stand-in node, is retired). This part's
kube-scheduler has one profile of its own (``node_config.SCHEDULER_NAME``) and the real nodes a taint
(``node_config.TAINT``), so a Pod runs on them only when it asks (``node_config.placement()``): a Pod of the
default scheduler stays Pending, as it does on a cluster without that scheduler. Starting this part changes
nothing the API server runs with (its kubelet flags are set by the kube part's plain ``up``): tests may start it
while others run.

- **Binaries.** ``kubelet``, ``kube-scheduler`` and ``kube-proxy`` from the same ``k8s.io/kubernetes`` build
  module as the control plane (``stack/kube-build``), one ``go build`` into ``<cache>/bin/k8s-node-<ver>/``.
  A separate build, not the control plane's: adding them there would rebuild and replace the running
  control-plane binaries of every stack sharing the cache, and make every ``up`` pay for a node it may not
  want. It shares the warm Go cache (measured: 79 s on 2 busy cores with the packages compiled).
- **containerd, runc, CNI plugins from Debian** (bookworm: containerd 1.6.20, runc 1.1.5,
  containernetworking-plugins 1.1.1), installed with apt-get when missing. containerd 2.x from the Go module
  proxy is where this should go (issue 28), but it adds a cold build; Debian's 1.6 runs the CRI the kubelet
  1.35 needs today.
- **Per node** (``eos-node-1``, ``eos-node-2``; ``EOS_NODE_COUNT``): its own containerd (root, state, socket
  under ``<state>/node/n<i>``), kubelet root, cgroup root, ports, Pod CIDR and bridge (node_config.py). The
  node IP is the bridge's gateway address: private, on this machine, reachable by the node's Pods.
- **Images.** A pause image built here (a static C program, node_config.PAUSE_C) imported into each
  containerd; the project's image (``make image``) pushed to the stack's registry (eos_stack.registry) and
  pulled by each containerd (node_images.py); Pods name it ``$EOS_NODE_IMAGE`` (``<registry>/<name>:<tag>``).
- **Cluster DNS.** CoreDNS on the services address (node_dns.py), the kubelets' ``clusterDNS``.
- **Identities.** Client certificates of the stack CA: ``system:node:<name>`` in ``system:nodes`` (bound to
  the ``system:node`` ClusterRole: the API server runs RBAC without the Node authorizer) and
  ``system:kube-scheduler``. Each kubelet serves a certificate for its node IP; the API server reaches it
  by InternalIP with its own client certificate (``kubectl logs``).

Host changes (undone by ``down``): one bridge interface per node with its gateway address, cgroup folders
``/eos-<tag>-n<i>`` in each cgroup v1 hierarchy, and the iptables chains the kubelet makes (KUBE-FIREWALL,
canaries; removed when no kubelet runs any more). Not changed:
``net.ipv4.ip_forward`` (left as found; Pods on different nodes do not reach each other yet), masquerading.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import go_build, kube, node_dns, node_services, registry
from .common import Stack, StackError, free_port, http_ok, log, port_open, wait_for, write_if_changed
from .node_config import (SCHEDULER_NAME, TAINT, NodeLayout, cni_conflist, containerd_toml, kubelet_argv,
                          kubelet_config, layouts, resolv_conf, scheduler_config)
from .node_host import ensure_bridge, ensure_cgroups, remove_cgroups, remove_kubelet_chains, unmount_under
from .image_common import ensure_tools, image_name
from .node_images import ctr, ensure_pause, load_images, write_registry_hosts

BINARIES = ("kubelet", "kube-scheduler", "kube-proxy")
PACKAGES = [f"k8s.io/kubernetes/cmd/{b}" for b in BINARIES]
SCHEDULER = "kube-scheduler"
ENV_KEYS = ["EOS_NODES", "EOS_NODE_IMAGE", "EOS_CLUSTER_DNS", *node_services.ENV_KEYS]


def count() -> int:
    return int(os.environ.get("EOS_NODE_COUNT", "2"))


# -- binaries ---------------------------------------------------------------------------------------------
def bin_dir(st: Stack) -> Path:
    return st.cache / "bin" / f"k8s-node-{kube.K8S_VERSION}"


def binaries_present(st: Stack) -> bool:
    try:
        stamped = (bin_dir(st) / "BUILD").read_text() == kube.build_stamp()
    except OSError:
        stamped = False
    return stamped and all(os.access(bin_dir(st) / b, os.X_OK) for b in BINARIES)


def ensure_binaries(st: Stack) -> None:
    if binaries_present(st):
        return
    go, out = go_build.require_go(), bin_dir(st)

    def build() -> None:
        log(f"node: building {', '.join(BINARIES)} {kube.K8S_VERSION} into {out} (about 1.5 min with the kube "
            "build's Go cache warm, about 6 min more on top of a cold control-plane build)")
        staging = out.with_name(out.name + f".build-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            go_build.run_logged_build([go, "build", "-trimpath", "-ldflags", kube.version_ldflags(), "-o",
                                       str(staging) + "/", *PACKAGES], what="node: go build", cwd=kube.BUILD_DIR,
                                      env=go_build.go_env(st), logfile=st.dir("logs") / "node-build.log")
            for b in BINARIES:
                (staging / b).replace(out / b)
            (out / "BUILD").write_text(kube.build_stamp())
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    go_build.build_once(out, "node: another `up` is building the node binaries; waiting for it",
                        lambda: binaries_present(st), build)


# -- state: ports, certificates ---------------------------------------------------------------------------
def home(st: Stack) -> Path:
    return st.dir("node")


def ports(st: Stack) -> dict[str, int]:
    """Each kubelet's port and healthz port and the scheduler's: chosen once, kept in ports.json."""
    pf = home(st) / "ports.json"
    chosen = json.loads(pf.read_text()) if pf.exists() else {}
    names = [f"{n.name}-{k}" for n in layouts(st.state, count()) for k in ("kubelet", "healthz")] + [SCHEDULER]
    names += list(node_dns.PORT_NAMES)
    for name in names:
        if name not in chosen or (port_open(chosen[name]) and not _ours_running(st)):
            port = free_port()
            while port in chosen.values():
                port = free_port()
            chosen[name] = port
    pf.write_text(json.dumps(chosen, indent=2) + "\n")
    return chosen


def _ours_running(st: Stack) -> bool:
    return any(st.running_pid(f"{n.name}-kubelet") for n in layouts(st.state, count())) or \
        st.running_pid(SCHEDULER) is not None or st.running_pid(node_dns.DAEMON) is not None


def kubectl(st: Stack, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(kube.binary(st, "kubectl")), f"--kubeconfig={kube.admin_kubeconfig(st)}", *args],
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise StackError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()[-1500:]}")
    return proc


def ensure_identities(st: Stack, n: NodeLayout) -> dict[str, Path]:
    pki = n.home / "pki"
    pki.mkdir(parents=True, exist_ok=True)
    kcfg = pki / "kubelet.kubeconfig"
    if not kcfg.exists():
        kube.make_client_kubeconfig(st, f"system:node:{n.name}", ["system:nodes"], kcfg)
    crt, key = pki / "serving.crt", pki / "serving.key"
    if not crt.exists():
        kube._issue_cert(st, "serving", n.name, [], [
            "basicConstraints=critical,CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment",
            "extendedKeyUsage=serverAuth", f"subjectAltName=IP:{n.node_ip},DNS:{n.name}"], out_dir=pki)
    return {"kubeconfig": kcfg, "crt": crt, "key": key}


RBAC = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "eos:nodes"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}]}


# -- containerd --------------------------------------------------------------------------------
def start_containerd(st: Stack, n: NodeLayout) -> None:
    """Start the node's containerd unless it runs with this configuration; one started with another (an older
    version of this part: no registry ``config_path``) is restarted (its containers' shims keep running)."""
    name = f"{n.name}-containerd"
    cfg = n.home / "containerd.toml"
    text = containerd_toml(n)
    if st.running_pid(name) is not None and cfg.exists() and cfg.read_text() != text:
        log(f"node: {name} runs with an older configuration; restarting it")
        st.stop_daemon(name)
    write_if_changed(cfg, text)
    if st.running_pid(name) is None:
        n.socket.unlink(missing_ok=True)
        st.start_daemon(name, ["containerd", f"--config={cfg}"], marker=str(cfg))
    wait_for(lambda: st.running_pid(name) and ctr(n, "version", timeout=10, check=False),
             f"{name} to answer on {n.socket}", 60, on_fail=lambda: st.log_tail(name))


# -- kubelet and scheduler --------------------------------------------------------------------------------
def start_kubelet(st: Stack, n: NodeLayout, p: dict[str, int]) -> bool:
    """Start the node's kubelet unless it runs with this configuration; True when started. One running with
    another configuration (older code: no ``clusterDNS`` that answers) is restarted; its Pods keep running
    (containerd holds them), and Pods made after it get the new configuration."""
    name = f"{n.name}-kubelet"
    ids = ensure_identities(st, n)
    for d in (n.cni_conf_dir, n.kubelet_root, n.home / "pod-logs", n.home / "volume-plugins"):
        d.mkdir(parents=True, exist_ok=True)
    # Unchanged files are not written again: every `up node` (each test worker's, the node-loss test's) runs this,
    # and containerd reloads its CNI configuration on each write (common.write_if_changed).
    write_if_changed(n.cni_conf_dir / "10-eos.conflist", json.dumps(cni_conflist(n), indent=2) + "\n")
    write_if_changed(n.home / "resolv.conf", resolv_conf())
    cfg = n.home / "kubelet.json"
    text = json.dumps(kubelet_config(
        n, ca=kube.pki_dir(st) / "ca.crt", serving_crt=ids["crt"], serving_key=ids["key"],
        port=p[f"{n.name}-kubelet"], healthz_port=p[f"{n.name}-healthz"], resolv_conf=n.home / "resolv.conf"),
        indent=2) + "\n"
    if st.running_pid(name) is not None and cfg.exists() and cfg.read_text() != text:
        log(f"node: {name} runs with an older configuration; restarting it")
        st.stop_daemon(name)
    write_if_changed(cfg, text)
    argv = kubelet_argv(bin_dir(st) / "kubelet", n, cfg, ids["kubeconfig"])
    if st.running_pid(name) is not None:
        return False
    st.start_daemon(name, argv, marker=str(cfg))
    return True


def healthz(port: int) -> bool:
    return http_ok(f"http://127.0.0.1:{port}/healthz")


def node_ready(st: Stack, name: str, since: float = 0.0) -> bool:
    """The Node is Ready, by a status the kubelet posted at or after ``since`` (the node lifecycle controller marks
    a stopped kubelet's Node Unknown 20 s after its last Lease renewal, kube.py; a kubelet posts its status when it
    starts, then every 5 minutes unless it changes: give ``since`` only for a kubelet just started)."""
    from datetime import datetime
    proc = kubectl(st, "get", "node", name, "-o", "json", check=False)
    if proc.returncode != 0:
        return False
    conds = json.loads(proc.stdout)["status"].get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" and datetime.fromisoformat(
        c["lastHeartbeatTime"].replace("Z", "+00:00")).timestamp() >= since for c in conds)


def stop_kubelet(st: Stack, name: str) -> int:
    """Stop node ``name``'s kubelet alone (SIGTERM; its containerd and the containers it runs stay: a node whose
    kubelet is lost). Returns the stopped kubelet's pid. ``up`` starts it again (any ``up node`` does: a stopped
    kubelet never outlives the next run that asks for the nodes)."""
    daemon = f"{name}-kubelet"
    pid = st.running_pid(daemon)
    if pid is None:
        raise StackError(f"{daemon} does not run")
    st.stop_daemon(daemon)
    return pid


def start_scheduler(st: Stack, port: int) -> None:
    """kube-scheduler with the one profile ``SCHEDULER_NAME`` (node_config.scheduler_config); restarted when it
    runs with other arguments (an older version of this part started it with the default profile)."""
    kcfg = home(st) / "scheduler.kubeconfig"
    if not kcfg.exists():
        kube.make_client_kubeconfig(st, "system:kube-scheduler", [], kcfg)
    cfg = home(st) / "scheduler.json"
    write_if_changed(cfg, json.dumps(scheduler_config(kcfg), indent=2) + "\n")
    argv = [str(bin_dir(st) / "kube-scheduler"), f"--config={cfg}", f"--authentication-kubeconfig={kcfg}",
            f"--authorization-kubeconfig={kcfg}", "--bind-address=127.0.0.1", f"--secure-port={port}",
            f"--cert-dir={st.dir('node', 'scheduler-certs')}", "--profiling=false"]
    pid = st.running_pid(SCHEDULER)
    if pid is not None and kube._argv(pid) not in (None, argv):
        log(f"node: {SCHEDULER} runs with other arguments than this version starts it with; restarting it")
        st.stop_daemon(SCHEDULER)
        pid = None
    if pid is None:
        st.start_daemon(SCHEDULER, argv, marker=str(cfg))


# -- the part interface -----------------------------------------------------------------------------------
def up(st: Stack) -> dict[str, str]:
    """Start what does not run yet; one ``up`` at a time (two test workers may ask at once)."""
    import fcntl
    with open(home(st) / "up.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _up(st)


def _up(st: Stack) -> dict[str, str]:
    t0 = time.monotonic()
    if os.geteuid() != 0:
        raise StackError("the node part runs kubelets and containerd: run it as root")
    if not kube.apiserver_ready(st):
        raise StackError("the node part needs the kube part: run `python -m eos_stack up kube` first")
    ensure_tools(("containerd", "ctr", "runc"), packages=("containerd", "containerd", "runc"),
                 needed_by="the node part (eos_stack.node)")
    if not Path("/usr/lib/cni/bridge").exists():
        ensure_tools(("/usr/lib/cni/bridge",), packages=("containernetworking-plugins",),
                     needed_by="the node part's Pod network")
    ensure_binaries(st)
    pause = ensure_pause(st)
    services = registry.up(st)
    project = registry.ensure_image(st, image_name())
    if project is None:
        log(f"node: {image_name()} is not built (`make image`): the nodes get the pause image only")
    p = ports(st)
    services.update(node_services.up(st))
    _apply(st, RBAC)
    # Before the kubelets: their clusterDNS is its address (node_dns.py).
    services["EOS_CLUSTER_DNS"] = node_dns.up(st, p, lambda obj: _apply(st, obj))
    nodes = layouts(st.state, count())
    since = time.time() - 1   # heartbeat times have whole seconds
    fresh = set()
    for n in nodes:
        n.home.mkdir(parents=True, exist_ok=True)
        ensure_bridge(n)
        ensure_cgroups(n)
        write_registry_hosts(n, registry.address(st))
        start_containerd(st, n)
    # Every node's pull at once: each is mostly unpacking layers into its own containerd.
    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        for done in [pool.submit(load_images, st, n, pause, project) for n in nodes]:
            done.result()
    for n in nodes:
        if start_kubelet(st, n, p):
            fresh.add(n.name)
    start_scheduler(st, p[SCHEDULER])
    for n in nodes:
        wait_for(lambda n=n: _alive(st, f"{n.name}-kubelet") and healthz(p[f"{n.name}-healthz"]),
                 f"{n.name}'s kubelet /healthz", 120, on_fail=lambda n=n: st.log_tail(f"{n.name}-kubelet"))
        wait_for(lambda n=n: _alive(st, f"{n.name}-kubelet") and node_ready(st, n.name, since if n.name in fresh else 0.0),
                 f"Node {n.name} Ready",
                 180, on_fail=lambda n=n: st.log_tail(f"{n.name}-kubelet"), interval=1)
        # The kubelet registers with the not-ready taint; the node lifecycle controller lifts it (kube.py), but a
        # controller-manager started by older code runs none: lift it once the Node is Ready.
        kubectl(st, "taint", "nodes", n.name, "node.kubernetes.io/not-ready:NoSchedule-", check=False)
        # Only Pods that ask for the real nodes (node_config.TAINT): also on a Node registered before the taint.
        kubectl(st, "taint", "nodes", n.name, f"{TAINT['key']}={TAINT['value']}:{TAINT['effect']}", "--overwrite")
    wait_for(lambda: _alive(st, SCHEDULER) and _https_ok(p[SCHEDULER]), "kube-scheduler /healthz", 60,
             on_fail=lambda: st.log_tail(SCHEDULER))
    log(f"node: {', '.join(n.name for n in nodes)} Ready in {time.monotonic() - t0:.1f}s (Pods name scheduler "
        f"{SCHEDULER_NAME} and tolerate {TAINT['key']})")
    return {"EOS_NODES": ",".join(n.name for n in nodes), "EOS_NODE_IMAGE": project or "", **services}


def _alive(st: Stack, name: str) -> bool:
    if st.running_pid(name) is None:
        raise StackError(f"{name} exited\n{st.log_tail(name)}")
    return True


def _https_ok(port: int) -> bool:
    import ssl
    import urllib.request
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE    # self-signed, on loopback
    try:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=ctx, timeout=3) as r:
            return r.status == 200
    except Exception:  # noqa: BLE001
        return False


def _apply(st: Stack, obj: dict) -> None:
    proc = subprocess.run([str(kube.binary(st, "kubectl")), f"--kubeconfig={kube.admin_kubeconfig(st)}", "apply",
                           "-f", "-"], input=json.dumps(obj), capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise StackError(f"kubectl apply {obj['kind']}/{obj['metadata']['name']} failed: {proc.stderr[-1000:]}")


def down(st: Stack, purge: bool = False) -> None:
    nodes = layouts(st.state, len(layouts(st.state)))
    if kube.apiserver_ready(st):
        # Through the kubelets while they run: containers stopped, sandboxes and their networks released.
        for n in nodes:
            if st.running_pid(f"{n.name}-kubelet"):
                kubectl(st, "delete", "pods", "--all-namespaces", f"--field-selector=spec.nodeName={n.name}",
                        "--grace-period=1", "--timeout=60s", check=False, timeout=90)
    st.stop_daemon(SCHEDULER)
    for n in nodes:
        st.stop_daemon(f"{n.name}-kubelet")
        if st.running_pid(f"{n.name}-containerd"):
            for task in ctr(n, "tasks", "ls", "-q", check=False).split():
                ctr(n, "tasks", "kill", "-s", "SIGKILL", task, check=False)
            time.sleep(0.5 if ctr(n, "tasks", "ls", "-q", check=False).strip() else 0)
            for task in ctr(n, "tasks", "ls", "-q", check=False).split():
                ctr(n, "tasks", "delete", "-f", task, check=False)
            for c in ctr(n, "containers", "ls", "-q", check=False).split():
                ctr(n, "containers", "delete", c, check=False)
        st.stop_daemon(f"{n.name}-containerd")
        unmounted = unmount_under(n.home)
        if unmounted:
            log(f"node: unmounted {unmounted} mounts under {n.home}")
        remove_cgroups(n)
        if subprocess.run(["ip", "link", "show", n.bridge], capture_output=True).returncode == 0:
            subprocess.run(["ip", "link", "delete", n.bridge], capture_output=True)
    remove_kubelet_chains()
    node_dns.down(st)
    node_services.down(st)
    if purge and (st.state / "node").exists():
        shutil.rmtree(st.state / "node", ignore_errors=True)
    st.drop_env(ENV_KEYS)


def status(st: Stack) -> tuple[str, str]:
    if not binaries_present(st):
        return "missing", f"node binaries not built yet in {bin_dir(st)} (`up node` builds them)"
    nodes = layouts(st.state, count())
    down_ = [d for n in nodes for d in (f"{n.name}-containerd", f"{n.name}-kubelet") if st.running_pid(d) is None]
    down_ += [SCHEDULER] if st.running_pid(SCHEDULER) is None else []
    if down_:
        return "stopped", f"not running: {', '.join(down_)}"
    not_ready = [n.name for n in nodes if not node_ready(st, n.name)]
    if not_ready:
        return "stopped", f"not Ready: {', '.join(not_ready)}"
    if st.running_pid(node_services.FORWARDER) is None:
        return "stopped", f"not running: {node_services.FORWARDER} (the services address for Pods)"
    if st.running_pid(node_dns.DAEMON) is None:
        return "stopped", f"not running: {node_dns.DAEMON} (the cluster DNS)"
    return "running", ", ".join(f"{n.name} ({n.node_ip}, Pods {n.pod_cidr})" for n in nodes) + \
        f"; services and cluster DNS for Pods at {nodes[0].services_ip}"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in ("up", "down", "status"):
        print("usage: python -m eos_stack.node up|down [--purge]|status", file=sys.stderr)
        return 2
    st = Stack()
    try:
        if args[0] == "up":
            st.update_env(up(st))
        elif args[0] == "down":
            down(st, purge="--purge" in args)
        else:
            state, detail = status(st)
            print(f"node       {state:8} {detail}")
            return 0 if state == "running" else 3
    except StackError as exc:
        print(f"node {args[0]} failed: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
