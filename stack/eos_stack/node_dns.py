"""Cluster DNS for the real nodes (part of :mod:`eos_stack.node`): CoreDNS serving ``cluster.local`` from the
stack's API server, as a host process on the stack's services address.

- **Binary.** CoreDNS ``COREDNS_VERSION`` from the Go module proxy, built by the wrapper module
  ``stack/coredns-build`` (its ``main.go`` links only the plugins the Corefile below uses: CoreDNS's own main
  links all of them, the cloud SDKs of route53, azure and clouddns included) into
  ``<cache>/bin/coredns-<version>/``, stamped with the wrapper's files so another plugin list rebuilds it.
- **Where.** It listens on ``<services address>:53`` (``node_config.services_ip``, UDP and TCP), which every Pod
  on the real nodes already has a route to; the kubelets' ``clusterDNS`` names that address. Not the
  conventional kube-dns ClusterIP (``10.0.0.10``): no kube-proxy runs here to carry it, and every stack on this
  machine has the same Service range, while each has its own services address.
- **What it answers.** ``cluster.local`` (Services, a headless Service's endpoints and their hostnames) and the
  reverse zones, from the kubernetes plugin; any other name NXDOMAIN (template plugin): nothing is forwarded,
  no packet leaves the machine. A Pod's ``search`` list still makes ``<svc>`` and ``<svc>.<ns>`` work.
- **Identity.** A client certificate ``system:eos-coredns`` bound to a ClusterRole that may only list and watch
  Services, EndpointSlices and Namespaces (``rbac()``): what the plugin watches with ``pods disabled``.
- **Needs** the EndpointSlice controller (the kube part runs it in kube-controller-manager): a headless
  Service's records come from its EndpointSlices.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Callable

from . import go_build, kube
from .common import REPO, Stack, StackError, http_ok, log, port_open, wait_for
from .node_config import CLUSTER_DOMAIN, services_ip

COREDNS_VERSION = "v1.15.0"             # pinned in stack/coredns-build/go.mod
GO_MIN = (1, 26)                        # CoreDNS v1.15.0's go.mod says go 1.26.0
BUILD_DIR = REPO / "stack" / "coredns-build"
DAEMON = "node-coredns"
USER = "system:eos-coredns"
PORT_NAMES = ("coredns-health", "coredns-ready")


# -- pure: the Corefile and the RBAC --------------------------------------------------------------------------
def corefile(listen_ip: str, kubeconfig: Path, health_port: int, ready_port: int) -> str:
    """Two server blocks on ``listen_ip:53``: the cluster's zones from the API server, every other name NXDOMAIN.
    ``log`` writes only failures and denials (NXDOMAIN, NODATA), so a name a Pod could not resolve is in the log."""
    return f"""# Written by eos_stack.node_dns: the real nodes' cluster DNS.
{CLUSTER_DOMAIN}:53 in-addr.arpa:53 ip6.arpa:53 {{
    bind {listen_ip}
    errors
    log . {{
        class denial error
    }}
    health 127.0.0.1:{health_port}
    ready 127.0.0.1:{ready_port}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods disabled
        ttl 5
    }}
    cache 5
}}
.:53 {{
    bind {listen_ip}
    errors
    log . {{
        class denial error
    }}
    template ANY ANY {{
        rcode NXDOMAIN
    }}
}}
"""


def rbac() -> list[dict]:
    """The ClusterRole and binding of CoreDNS's identity: list and watch what the kubernetes plugin reads."""
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "eos:coredns"},
            "rules": [{"apiGroups": [""], "resources": ["services", "namespaces"], "verbs": ["list", "watch"]},
                      {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                       "verbs": ["list", "watch"]}]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": "eos:coredns"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "eos:coredns"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}]}
    return [role, binding]


def build_stamp() -> str:
    """The version and the wrapper module's files: a changed plugin list or pin rebuilds the binary."""
    files = {f: hashlib.sha256((BUILD_DIR / f).read_bytes()).hexdigest() for f in ("go.mod", "go.sum", "main.go")}
    return json.dumps({"coredns": COREDNS_VERSION, **files}, sort_keys=True)


# -- the binary -----------------------------------------------------------------------------------------------
def binary(st: Stack) -> Path:
    return st.cache / "bin" / f"coredns-{COREDNS_VERSION}" / "coredns"


def binary_present(st: Stack) -> bool:
    try:
        stamped = (binary(st).parent / "BUILD").read_text() == build_stamp()
    except OSError:
        stamped = False
    return stamped and os.access(binary(st), os.X_OK)


def ensure_binary(st: Stack) -> None:
    if binary_present(st):
        return
    go, out = go_build.require_go(GO_MIN), binary(st).parent

    def build() -> None:
        log(f"node: building CoreDNS {COREDNS_VERSION} (its kubernetes plugin and a few others) into {out}")
        staging = out.with_name(out.name + f".build-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            go_build.run_logged_build([go, "build", "-trimpath", "-o", str(staging / "coredns"), "."],
                                      what="node: CoreDNS go build", cwd=BUILD_DIR, env=go_build.go_env(st),
                                      logfile=st.dir("logs") / "coredns-build.log")
            (staging / "coredns").replace(out / "coredns")
            (out / "BUILD").write_text(build_stamp())
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    go_build.build_once(out, "node: another `up` is building CoreDNS; waiting for it", lambda: binary_present(st),
                        build)


# -- the daemon -----------------------------------------------------------------------------------------------
def up(st: Stack, ports: dict[str, int], apply: Callable[[dict], None]) -> str:
    """Start CoreDNS unless it runs with this Corefile (one written by older code is restarted); wait until its
    kubernetes plugin has synced (``/ready``) and it answers on port 53. Returns the address Pods ask."""
    ensure_binary(st)
    home = st.dir("node", "dns")
    kcfg = home / "coredns.kubeconfig"
    if not kcfg.exists():
        kube.make_client_kubeconfig(st, USER, [], kcfg)
    for obj in rbac():
        apply(obj)
    ip = services_ip(st.state)
    cfg = home / "Corefile"
    text = corefile(ip, kcfg, ports["coredns-health"], ports["coredns-ready"])
    if st.running_pid(DAEMON) is not None and (not cfg.exists() or cfg.read_text() != text):
        log(f"node: {DAEMON} runs with an older Corefile; restarting it")
        st.stop_daemon(DAEMON)
    cfg.write_text(text)
    if st.running_pid(DAEMON) is None:
        st.start_daemon(DAEMON, [str(binary(st)), "-conf", str(cfg)], marker=str(cfg))
    wait_for(lambda: _alive(st) and http_ok(f"http://127.0.0.1:{ports['coredns-ready']}/ready") and port_open(53, ip),
             f"CoreDNS on {ip}:53 ready", 60, on_fail=lambda: st.log_tail(DAEMON))
    return ip


def _alive(st: Stack) -> bool:
    if st.running_pid(DAEMON) is None:
        raise StackError(f"{DAEMON} exited\n{st.log_tail(DAEMON)}")
    return True


def down(st: Stack) -> None:
    st.stop_daemon(DAEMON)
