"""A Pod on a real node reaches the stack's services (stack/eos_stack/node_services.py), which listen on
127.0.0.1: the stack's services address (a /32 of this machine that Pods get a route to) with Kafka's PODS
listener advertised there and a forwarder for the API server and MinIO.

One ``restricted`` Pod of the project's image, placed by the real scheduler: it produces to Kafka in
transactions (one committed, one aborted, one committed) and reads the topic ``read_committed``; it lists the
Pods of its namespace with its ServiceAccount's token (a projected token, checked against the stack CA through
the name in the API server's certificate) and is refused the Secrets (the token's identity, not an admin's);
it reads an object the test put in MinIO, with keys from a Secret; it commits a transaction through the
broker's SASL_SSL listener for Pods (SCRAM, the certificate checked against the services address) and reads
the topic back through it. Its route table has no default route, and
the servers' loopback ports do not answer it (the negative control: why the services address is needed).
The host then reads the same topic: ``read_committed`` sees what the Pod saw, ``read_uncommitted`` the aborted
records too (so the aborted transaction reached the broker: the isolation did the filtering).
"""
from __future__ import annotations

import json
import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kubernetes import client

from eos_stack import kafka_security, kube, node_services, s3
from eos_stack.common import Stack
from eos_stack.node_config import host_aliases
from tests.harness.real_nodes import finished, real_pod, wait_pod

pytestmark = pytest.mark.timeout(900)

POD_SCRIPT = r"""
import json, os, time, uuid
from confluent_kafka import Consumer, Producer, TopicPartition

env, out = os.environ, {}
routes = open("/proc/net/route").read().split("\n")[1:]
out["default_route"] = any(r.split()[1] == "00000000" for r in routes if r.split())
import socket
def connects(host, port):
    with socket.socket() as so:
        so.settimeout(3)
        return so.connect_ex((host, int(port))) == 0
# Negative control: the servers' own loopback ports are not reachable from the Pod (why the services address).
out["loopback"] = [connects("127.0.0.1", port) for port in env["LOOPBACK_PORTS"].split(",")]

boot, topic = env["POD_KAFKA_BOOTSTRAP"], env["TOPIC"]
p = Producer({"bootstrap.servers": boot, "transactional.id": "pod-" + uuid.uuid4().hex})
p.init_transactions(60)
for batch, end in ((["c-0", "c-1", "c-2"], p.commit_transaction), (["a-0", "a-1"], p.abort_transaction),
                   (["c-3"], p.commit_transaction)):
    p.begin_transaction()
    for v in batch:
        p.produce(topic, value=v)
    p.flush(30)
    end(60)
c = Consumer({"bootstrap.servers": boot, "group.id": "pod-" + uuid.uuid4().hex, "isolation.level": "read_committed",
              "enable.auto.commit": False})
c.assign([TopicPartition(topic, 0, 0)])
seen, deadline = [], time.monotonic() + 60
while "c-3" not in seen and time.monotonic() < deadline:
    m = c.poll(1.0)
    if m is not None and m.error() is None:
        seen.append(m.value().decode())
c.close()
out["kafka"] = seen

# The SASL_SSL listener for Pods: SCRAM, TLS from the stack's CA, the broker's certificate checked against the
# services address (librdkafka verifies the host name by default).
secured = {"bootstrap.servers": env["POD_KAFKA_SECURE_BOOTSTRAP"], "security.protocol": "SASL_SSL",
           "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": env["KAFKA_USER"],
           "sasl.password": env["KAFKA_PASSWORD"], "ssl.ca.location": "/var/run/eos/api/kafka-ca.crt"}
p = Producer({**secured, "transactional.id": "pod-sasl-" + uuid.uuid4().hex})
p.init_transactions(60)
p.begin_transaction()
p.produce(topic, value="s-0")
p.commit_transaction(60)
c = Consumer({**secured, "group.id": "pod-" + uuid.uuid4().hex, "isolation.level": "read_committed",
              "enable.auto.commit": False})
c.assign([TopicPartition(topic, 0, 0)])
seen, deadline = [], time.monotonic() + 60
while "s-0" not in seen and time.monotonic() < deadline:
    m = c.poll(1.0)
    if m is not None and m.error() is None:
        seen.append(m.value().decode())
c.close()
out["kafka_sasl_ssl"] = seen

from kubernetes import client
cfg = client.Configuration()
cfg.host, cfg.ssl_ca_cert = env["POD_KUBE_APISERVER"], "/var/run/eos/api/ca.crt"
cfg.api_key = {"authorization": "Bearer " + open("/var/run/eos/api/token").read()}
v1 = client.CoreV1Api(client.ApiClient(cfg))
out["pods"] = [x.metadata.name for x in v1.list_namespaced_pod(env["NS"]).items]
try:
    v1.list_namespaced_secret(env["NS"])
    out["secrets"] = "listed"
except client.ApiException as exc:
    out["secrets"] = exc.status

from pyarrow import fs
s3 = fs.S3FileSystem(access_key=env["S3_ACCESS_KEY"], secret_key=env["S3_SECRET_KEY"], scheme="http",
                     endpoint_override=env["POD_S3_ENDPOINT"].removeprefix("http://"), region=env["S3_REGION"])
with s3.open_input_stream(env["S3_OBJECT"]) as f:
    out["s3"] = f.read().decode()
print("RESULT " + json.dumps(out), flush=True)
"""


def read_topic(bootstrap: str, topic: str, isolation: str, until: str) -> list[str]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"host-{uuid.uuid4().hex}",
                  "isolation.level": isolation, "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    seen: list[str] = []
    for _ in range(120):
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            seen.append(m.value().decode())
            if seen[-1] == until:
                break
    c.close()
    return seen


def rbac(ns: str) -> list[tuple[str, dict]]:
    meta = {"namespace": ns}
    return [
        ("sa", {"metadata": {"name": "reader", **meta}}),
        ("role", {"metadata": {"name": "pod-reader", **meta},
                  "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]}),
        ("binding", {"metadata": {"name": "pod-reader", **meta},
                     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
                     "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns}]}),
    ]


def test_a_restricted_pod_on_a_real_node_reaches_kafka_the_api_server_and_minio(api, nodes, restricted_ns,
                                                                                 stack_env):
    st, ns, v1 = Stack(), restricted_ns, client.CoreV1Api(api)
    env = node_services.pod_env(st)    # not .stack/env: test workers rewrite it concurrently
    topic = f"pods-{uuid.uuid4().hex[:8]}"
    with AdminClient({"bootstrap.servers": stack_env["KAFKA_BOOTSTRAP"]}) as admin:
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)

    objs = dict(rbac(ns))
    v1.create_namespaced_service_account(ns, objs["sa"])
    rbac_api = client.RbacAuthorizationV1Api(api)
    rbac_api.create_namespaced_role(ns, objs["role"])
    rbac_api.create_namespaced_role_binding(ns, objs["binding"])
    v1.create_namespaced_config_map(ns, {"metadata": {"name": "api-ca"},
                                         "data": {"ca.crt": (kube.pki_dir(st) / "ca.crt").read_text(),
                                                  "kafka-ca.crt": kafka_security.ca_pem(st)}})
    creds = s3.credentials(st)
    kafka_user, kafka_password = kafka_security.admin_credentials(st)
    v1.create_namespaced_secret(ns, {"metadata": {"name": "s3"}, "stringData": {
        "access": creds["access_key"], "secret": creds["secret_key"], "kafka": kafka_password}})
    obj = f"{s3.BUCKET}/node-services/{ns}.txt"
    token = uuid.uuid4().hex
    with s3.filesystem(st).open_output_stream(obj) as f:
        f.write(token.encode())

    body = real_pod("reach", ["python", "-c", POD_SCRIPT], env={
        "POD_KAFKA_BOOTSTRAP": env["POD_KAFKA_BOOTSTRAP"], "POD_KUBE_APISERVER": env["POD_KUBE_APISERVER"],
        "POD_KAFKA_SECURE_BOOTSTRAP": env["POD_KAFKA_SECURE_BOOTSTRAP"], "KAFKA_USER": kafka_user,
        "POD_S3_ENDPOINT": env["POD_S3_ENDPOINT"], "S3_REGION": s3.REGION, "S3_OBJECT": obj, "TOPIC": topic,
        "NS": ns, "LOOPBACK_PORTS": ",".join(str(p) for p in node_services.mappings(st).values())},
        serviceAccountName="reader", automountServiceAccountToken=False,
        hostAliases=host_aliases(st.state),
        volumes=[{"name": "api", "projected": {"sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
            {"configMap": {"name": "api-ca", "items": [{"key": "ca.crt", "path": "ca.crt"},
                                                       {"key": "kafka-ca.crt", "path": "kafka-ca.crt"}]}}]}}])
    container = body["spec"]["containers"][0]
    container["env"] += [{"name": name, "valueFrom": {"secretKeyRef": {"name": "s3", "key": key}}}
                         for name, key in (("S3_ACCESS_KEY", "access"), ("S3_SECRET_KEY", "secret"),
                                           ("KAFKA_PASSWORD", "kafka"))]
    container["volumeMounts"] = [{"name": "api", "mountPath": "/var/run/eos/api", "readOnly": True}]
    v1.create_namespaced_pod(ns, body)
    done = wait_pod(v1, ns, "reach", finished, "the Pod to reach the services and finish", timeout=300)
    logs = v1.read_namespaced_pod_log("reach", ns)
    assert done.status.phase == "Succeeded", f"{done.status}\n{logs[-3000:]}"
    assert done.spec.node_name in {n.name for n in nodes}
    result = json.loads(next(line for line in logs.splitlines() if line.startswith("RESULT ")).split(" ", 1)[1])

    assert result["default_route"] is False, "the Pod has a default route: packets could leave the machine"
    assert result["loopback"] == [False] * len(node_services.mappings(st)), result["loopback"]
    committed = ["c-0", "c-1", "c-2", "c-3"]
    assert result["kafka"] == committed, result["kafka"]
    assert result["kafka_sasl_ssl"] == [*committed, "s-0"], result["kafka_sasl_ssl"]
    assert result["pods"] == ["reach"], result["pods"]
    assert result["secrets"] == 403, result["secrets"]
    assert result["s3"] == token
    # The same broker, seen from the host: the aborted records are there, read_committed hides them.
    assert read_topic(stack_env["KAFKA_BOOTSTRAP"], topic, "read_committed", "c-3") == committed
    raw = read_topic(stack_env["KAFKA_BOOTSTRAP"], topic, "read_uncommitted", "c-3")
    assert raw == ["c-0", "c-1", "c-2", "a-0", "a-1", "c-3"], raw
