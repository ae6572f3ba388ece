"""Cluster DNS on the real nodes (stack/eos_stack/node_dns.py): CoreDNS on the stack's services address, the
kubelets' ``clusterDNS``, serving ``cluster.local`` from the API server.

A ``restricted`` Pod (``target``, hostname ``target``, subdomain ``peers``) serves a token on a TCP port; a
headless Service ``peers`` and a ClusterIP Service ``web`` select it. A client Pod on the same node resolves
the ClusterIP Service by its full and short names (the Service's ClusterIP), the headless Service (the Pod's IP)
and the Pod's own record ``target.peers.<ns>.svc.cluster.local``, and connects to that name to read the token.
The server Pod also carries a stream's driver labels and the operator's own headless driver Service
(``children.driver_service``) selects it: the client connects to ``<stream>-driver.<ns>.svc`` on the driver's
port, the name Spark's executors are given in cluster mode when ``spark.driver.host`` is left to Spark.
A name of the cluster that does not exist and a name outside it are NXDOMAIN (``Name or service not known``:
answered, not timed out). The negative control: the same client, the same checks, in a Pod with
``dnsPolicy: Default`` (the cluster DNS not used, as with no ``clusterDNS``): every name fails, no token.
Connecting to the ClusterIP itself needs kube-proxy, which the stack does not run: not checked.
"""
from __future__ import annotations

import json
import time
import uuid

import pytest
from kubernetes import client

from eos_operator.children import DRIVER_PORT, StreamRef, driver_service, driver_service_name, stream_selector
from eos_stack.common import Stack
from eos_stack.node_config import services_ip
from tests.harness.real_nodes import finished, real_pod, wait_pod

pytestmark = pytest.mark.timeout(600)

SERVER = r"""
import os, socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(os.environ["PORT"])))
s.listen()
print("serving", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(os.environ["TOKEN"].encode())
    c.close()
"""

CLIENT = r"""
import json, os, socket, time
ns, tries, port, out = os.environ["NS"], int(os.environ["TRIES"]), int(os.environ["PORT"]), {}
out["nameservers"] = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")]

def resolve(name, tries):
    for attempt in range(tries):
        try:
            return sorted({a[4][0] for a in socket.getaddrinfo(name, None, socket.AF_INET)})
        except socket.gaierror as exc:
            err = {"errno": exc.errno, "error": str(exc)}
            time.sleep(1)
    return err

pod = f"target.peers.{ns}.svc.cluster.local"
driver = f"{os.environ['DRIVER_SERVICE']}.{ns}.svc"
names = {"service": f"web.{ns}.svc.cluster.local", "short": "web", "headless": "peers", "pod": pod,
         "driver": driver}
out.update({k: resolve(n, tries) for k, n in names.items()})
out.update({k: resolve(n, 1) for k, n in (("missing", f"nope.{ns}.svc.cluster.local"), ("outside", "example.com"))})
for key, name in (("reply", pod), ("driver_reply", driver)):
    try:
        with socket.create_connection((name, port), timeout=5) as so:
            out[key] = so.recv(100).decode()
    except OSError as exc:
        out[key] = {"error": str(exc)}
print("RESULT " + json.dumps(out), flush=True)
"""

STREAM = "colors"
NODE = {"eos.local/node": "1"}   # server and clients on one node: Pods of two nodes do not reach each other yet


def services(ns: str) -> list[dict]:
    port = {"port": DRIVER_PORT, "targetPort": DRIVER_PORT, "protocol": "TCP"}
    return [{"metadata": {"name": "peers", "namespace": ns},
             "spec": {"clusterIP": "None", "selector": {"app": "dns-peer"}, "ports": [port]}},
            {"metadata": {"name": "web", "namespace": ns},
             "spec": {"selector": {"app": "dns-peer"}, "ports": [port]}}]


def endpoint_of(discovery, ns: str, service: str) -> dict | None:
    for s in discovery.list_namespaced_endpoint_slice(ns, label_selector=f"kubernetes.io/service-name={service}").items:
        for e in s.endpoints or []:
            if e.conditions and e.conditions.ready:
                return {"ip": e.addresses[0], "hostname": e.hostname}
    return None


def result(v1, ns: str, name: str) -> dict:
    done = wait_pod(v1, ns, name, finished, f"{name} to resolve and finish", timeout=120)
    logs = v1.read_namespaced_pod_log(name, ns)
    assert done.status.phase == "Succeeded", f"{done.status}\n{logs[-3000:]}"
    return json.loads(next(line for line in logs.splitlines() if line.startswith("RESULT ")).split(" ", 1)[1])


def test_a_pod_resolves_services_and_a_headless_pod_record_through_the_cluster_dns(api, nodes, restricted_ns):
    st, ns, v1 = Stack(), restricted_ns, client.CoreV1Api(api)
    token = uuid.uuid4().hex
    server = real_pod("target", ["python", "-c", SERVER], env={"TOKEN": token, "PORT": str(DRIVER_PORT)},
                      hostname="target", subdomain="peers", nodeSelector=NODE, grace=1)
    server["metadata"]["labels"] = {"app": "dns-peer", **stream_selector(STREAM)}
    v1.create_namespaced_pod(ns, server)
    # The operator's driver Service as it makes it, less the owner reference (no stream owns it here: the
    # garbage collector would delete it).
    driver_svc = driver_service(StreamRef(STREAM, ns, str(uuid.uuid4())))
    del driver_svc["metadata"]["ownerReferences"]
    for svc in [*services(ns), driver_svc]:
        v1.create_namespaced_service(ns, svc)
    running = wait_pod(v1, ns, "target", lambda p: p.status.phase == "Running" and p.status.pod_ip,
                       "the server Pod to run", timeout=120)
    discovery = client.DiscoveryV1Api(api)
    deadline = time.monotonic() + 60
    while (ep := endpoint_of(discovery, ns, "peers")) is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert ep == {"ip": running.status.pod_ip, "hostname": "target"}, \
        f"no ready endpoint of the headless Service ({ep}): is the endpointslice controller running?"
    cluster_ip = v1.read_namespaced_service("web", ns).spec.cluster_ip

    env = {"NS": ns, "PORT": str(DRIVER_PORT), "DRIVER_SERVICE": driver_service_name(STREAM)}
    v1.create_namespaced_pod(ns, real_pod("client", ["python", "-c", CLIENT], env={**env, "TRIES": "20"},
                                          nodeSelector=NODE))
    # The negative control: the same checks without the cluster DNS (the node's resolver, which Pods cannot reach).
    v1.create_namespaced_pod(ns, real_pod("control", ["python", "-c", CLIENT], env={**env, "TRIES": "1"},
                                          nodeSelector=NODE, dnsPolicy="Default"))
    got, control = result(v1, ns, "client"), result(v1, ns, "control")

    assert got["nameservers"] == [services_ip(st.state)], got
    assert got["service"] == [cluster_ip] and got["short"] == [cluster_ip], got
    assert got["headless"] == [running.status.pod_ip] and got["pod"] == [running.status.pod_ip], got
    assert got["driver"] == [running.status.pod_ip], got
    assert got["reply"] == token and got["driver_reply"] == token, got
    # Answered NXDOMAIN (EAI_NONAME, -2), not left unanswered (EAI_AGAIN, -3): nothing is forwarded off the machine.
    assert got["missing"]["errno"] == -2 and got["outside"]["errno"] == -2, got

    assert control["nameservers"] != [services_ip(st.state)], control
    for key in ("service", "short", "headless", "pod", "driver"):
        assert isinstance(control[key], dict), f"{key} resolved without the cluster DNS: {control}"
    assert isinstance(control["reply"], dict) and isinstance(control["driver_reply"], dict), control
