"""The stack's services as Pods on the real nodes reach them (part of :mod:`eos_stack.node`).

kube-apiserver, Kafka and MinIO listen on 127.0.0.1, which a Pod's network namespace cannot reach. The node
part gives them one address on this machine, the *services address* (``node_config.services_ip``:
``10.243.<x>.1``, a /32 on an interface ``eos<tag>s`` of its own), and every Pod a route to it through its
bridge's gateway (``node_config.cni_conflist``). A packet to it is delivered to this machine's own stack (a
local address: no forwarding, no masquerade); nothing off the machine routes to it. On it, one forwarder daemon
(``eos_stack.forward``, ``node-forward``) relays to the loopback servers:

- ``<services>:<apiserver port>`` -> kube-apiserver; Pods name it ``https://kubernetes.default.svc:<port>``
  through ``hostAliases`` (``node_config.host_aliases``): that name is in its certificate, the address is not.
- ``<services>:<kafka pods port>`` -> Kafka's ``PODS`` listener (kafka.py), which advertises the services
  address, so the broker's metadata sends a Pod's client back through the forwarder (transactions included).
- ``<services>:<kafka pods SASL_SSL port>`` -> Kafka's ``PODS_SASL_SSL`` listener: the SASL_SSL listener's users,
  ACLs and CA, with a certificate that names the services address too (kafka_security.subject_alt_names).
- ``<services>:<s3 port>`` -> MinIO.

.stack/env gets ``POD_KUBE_APISERVER``, ``POD_KAFKA_BOOTSTRAP``, ``POD_KAFKA_SECURE_BOOTSTRAP``, ``POD_S3_ENDPOINT``
and ``EOS_SERVICES_IP``.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from . import kafka, kube, s3
from .common import Stack, log, port_open, run, wait_for
from .node_config import API_HOSTNAME, services_iface, services_ip

FORWARDER = "node-forward"
ENV_KEYS = ["POD_KUBE_APISERVER", "POD_KAFKA_BOOTSTRAP", "POD_KAFKA_SECURE_BOOTSTRAP", "POD_S3_ENDPOINT",
            "EOS_SERVICES_IP"]


def mappings(st: Stack) -> dict[str, int]:
    """What the forwarder relays: name -> loopback port, the same port on the services address."""
    kafka_ports = kafka.ports(st)
    return {"kube-apiserver": kube.load_ports(st)["apiserver"], "kafka": kafka_ports["pods"],
            "kafka-secured": kafka_ports["pods_sasl_ssl"], "s3": s3.port(st)}


def ensure_address(st: Stack) -> str:
    ip, iface = services_ip(st.state), services_iface(st.state)
    if subprocess.run(["ip", "link", "show", iface], capture_output=True).returncode != 0:
        # A bridge without ports: this kernel has no dummy interfaces; its address is local all the same.
        run(["ip", "link", "add", iface, "type", "bridge"], what=f"create interface {iface}")
    if f" {ip}/32 " not in run(["ip", "-o", "addr", "show", "dev", iface], what="ip addr"):
        run(["ip", "addr", "add", f"{ip}/32", "dev", iface], what=f"address {ip}")
    run(["ip", "link", "set", iface, "up"], what=f"{iface} up")
    return ip


def up(st: Stack) -> dict[str, str]:
    ip = ensure_address(st)
    ports = mappings(st)
    argv = [sys.executable, "-m", "eos_stack.forward", *(f"{ip}:{p}=127.0.0.1:{p}" for p in ports.values())]
    pid = st.running_pid(FORWARDER)
    # Another checkout's Python (a worktree's venv link) runs the same forwarder: compare what it relays.
    if pid is not None and (running := kube._argv(pid)) is not None and running[1:] != argv[1:]:
        st.stop_daemon(FORWARDER, grace=5.0)
        pid = None
    if pid is None:
        st.start_daemon(FORWARDER, argv, marker="eos_stack.forward", cwd=Path(__file__).resolve().parents[1])
    wait_for(lambda: st.running_pid(FORWARDER) and all(port_open(p, ip) for p in ports.values()),
             f"the forwarder on {ip}", 30, on_fail=lambda: st.log_tail(FORWARDER))
    if not (port_open(ports["kafka"]) and port_open(ports["kafka-secured"])):
        log("node: Kafka runs without its Pods' listeners (started by older code): Pods on the real nodes cannot "
            "reach it until `python -m eos_stack up kafka` restarts it with the current configuration")
    return pod_env(st)


def pod_env(st: Stack) -> dict[str, str]:
    """Where Pods reach the services (what ``up`` adds to .stack/env), computed from the kept ports."""
    ip, ports = services_ip(st.state), mappings(st)
    return {"POD_KUBE_APISERVER": f"https://{API_HOSTNAME}:{ports['kube-apiserver']}",
            "POD_KAFKA_BOOTSTRAP": f"{ip}:{ports['kafka']}", "POD_KAFKA_SECURE_BOOTSTRAP": f"{ip}:{ports['kafka-secured']}",
            "POD_S3_ENDPOINT": f"http://{ip}:{ports['s3']}",
            "EOS_SERVICES_IP": ip}


def down(st: Stack) -> None:
    st.stop_daemon(FORWARDER, grace=5.0)
    iface = services_iface(st.state)
    if subprocess.run(["ip", "link", "show", iface], capture_output=True).returncode == 0:
        subprocess.run(["ip", "link", "delete", iface], capture_output=True)
