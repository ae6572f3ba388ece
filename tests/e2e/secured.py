"""The secured listener for the end-to-end tests: a stream's manifest pointed at the broker's SASL_SSL listener
with a SCRAM user of its own, exactly a stream's ACLs, and its password and CA in Secrets."""
from __future__ import annotations

import base64
import secrets as pysecrets
from typing import Any

from eos_stack import kafka_security as ks
from eos_stack.cluster import Kubectl
from eos_stack.common import Stack


def kube_secret(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "type": "Opaque",
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


def secure(manifest: dict[str, Any], stack_env: dict[str, str], kubectl: Kubectl, namespace: str, *,
           source_topics: list[str], write_topics: list[str], ledger: str, bootstrap: str | None = None) -> str:
    """``manifest`` with source and sink only through the broker's SASL_SSL listener (``bootstrap``; unset: the
    one on loopback, else e.g. the Pods' one on the services address): a SCRAM-SHA-512 user of its own with
    exactly a stream's ACLs, its password and the CA in Secrets the spec references.
    Returns the password (for the tests that look for leaks)."""
    st, name = Stack(), manifest["metadata"]["name"]
    user, password = f"stream-{namespace}-{name}", pysecrets.token_urlsafe(18)
    ks.create_user(st, user, password)
    ks.grant_stream(st, user, source_topics=source_topics, write_topics=write_topics, ledger_topic=ledger,
                    transactional_prefix=f"eos-{namespace}-{name}-")
    kubectl.apply(kube_secret("kafka-user", {"username": user, "password": password}), namespace)
    kubectl.apply(kube_secret("kafka-ca", {"ca.crt": ks.ca_pem(st)}), namespace)
    security = {"credentials": {"mechanism": "SCRAM-SHA-512", "securityProtocol": "SASL_SSL",
                                "username": {"name": "kafka-user", "key": "username"},
                                "password": {"name": "kafka-user", "key": "password"}},
                "tls": {"ca": {"name": "kafka-ca", "key": "ca.crt"}}}
    for end in ("source", "sink"):
        manifest["spec"][end].update(bootstrapServers=bootstrap or stack_env["KAFKA_SECURE_BOOTSTRAP"], **security)
    return password
