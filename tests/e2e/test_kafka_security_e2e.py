"""The unique-id stream with source and sink reachable only through the broker's SASL_SSL listener (the colors stream's snapshot
upgrade over the same listener is test_upgrade_e2e.py).

Its user (SCRAM-SHA-512, a local CA's TLS) holds exactly the ACLs a stream needs (``grant_stream``): read
its source topic, write its sink and dead-letter topics and its ledger, transactional ids under its prefix.
The driver Pods run on the real nodes and reach the broker's SASL_SSL listener for Pods (on the stack's
services address, whose certificate names that address); the operator, a process on this machine, reaches
the same listener. The driver gets the password and CA from the stream's Secrets by ``secretKeyRef``; the operator reads the
same Secrets for resolution, progress and the replay horizon. Through a driver SIGKILL every id is in the
sink exactly once, and the operator's replay-horizon reads of the source work over the listener. A wrong
password and a missing ACL each give their named status (``KafkaAuthenticationFailed``, ``KafkaAuthorizationFailed``) and one event, no restart counted, and
the stream recovers when they are fixed. The password appears in no ConfigMap, status, annotation, event
or log line."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

from eos_stack import kafka_security as ks
from eos_stack.cluster import wait_until
from eos_stack.common import Stack
from examples.colors.generator import expected_ids, produce
from tests.e2e.secured import kube_secret, secure
from tests.e2e.streams import ColorsTopics, Diagnostics, assert_ids_exactly_once, colors_stream, wait_ids

pytestmark = pytest.mark.stack
NAME = "colors"


def _ready(kubectl, namespace: str) -> dict:
    s = kubectl.status(namespace, NAME)
    return next((c for c in s.get("conditions") or [] if c["type"] == "Ready"), {})


@pytest.mark.real_nodes
def test_secured_stream_is_exact_and_names_what_kafka_refuses(stack_env, nodes, kubectl, namespace, kubelet, operator,
                                                              on_nodes, tmp_path, report_result):
    st, diag = Stack(), Diagnostics(kubectl, namespace, operator, kubelet)
    secure_bootstrap = on_nodes.pod_env["POD_KAFKA_SECURE_BOOTSTRAP"]   # the SASL_SSL listener for Pods
    topics = ColorsTopics(stack_env["KAFKA_BOOTSTRAP"])           # made (and verified) as the PLAINTEXT admin
    ledger = topics.ledger(namespace, NAME)
    manifest = colors_stream(NAME, topics, tmp_path, attempts=5, delay=1.0, module="examples.colors.ids")
    manifest["spec"]["upgradeMode"] = "snapshot"
    manifest = on_nodes.place(manifest)
    password = secure(manifest, stack_env, kubectl, namespace, source_topics=[topics.events],
                      write_topics=[topics.counts, topics.dlq], ledger=ledger, bootstrap=secure_bootstrap)
    user = f"stream-{namespace}-{NAME}"
    prefix = f"eos-{namespace}-{NAME}-"
    produce(topics.bootstrap, topics.events, 3000)
    expected, sent, journal = expected_ids(3000), 3000, []

    def feed(n: int, seed: int) -> None:
        nonlocal expected, sent
        produce(topics.bootstrap, topics.events, n, seed=seed, start_id=sent)
        expected |= expected_ids(n, seed, sent)
        sent += n

    def running_driver() -> str | None:
        s = kubectl.status(namespace, NAME)
        return s.get("driverPod") if s.get("lifecycleState") == "Running" and "upgrade" not in s else None

    kubectl.apply(manifest, namespace)
    d0 = wait_until(running_driver, "the secured stream to run", 240, diag, 1)
    wait_ids(topics.bootstrap, topics.counts, expected, diag, timeout=300)
    journal.append(f"{d0} runs over SASL_SSL; {len(expected)} ids through")

    # 1. A driver SIGKILL under load: resolution (the operator, with the Secret's values) and a restart.
    feed(2000, 21)
    time.sleep(2)
    assert kubelet.kill9(namespace, d0), diag()
    d1 = wait_until(lambda: (lambda d: d if d and d != d0 else None)(running_driver()), "the restart", 240, diag, 1)
    assert kubectl.status(namespace, NAME)["resolution"]["fencedTransactionalIds"] >= 2
    feed(1000, 22)
    wait_ids(topics.bootstrap, topics.counts, expected, diag)
    journal.append(f"{d0} SIGKILLed under load; {d1} resolved and restarted")

    # The operator's own reads over SASL_SSL: progress (the ledger) and the replay horizon (the source).
    def horizon_read_after_the_restart() -> dict | None:
        s = kubectl.status(namespace, NAME)
        h = s.get("replayHorizon") or {}
        return s if h.get("state") == "Safe" and h.get("backlogRecords") == 0 and h.get("batch", -1) >= 1 else None
    s = wait_until(horizon_read_after_the_restart, "the replay horizon read from the secured source", 60, diag, 1)
    journal.append(f"replay horizon read over SASL_SSL: {s['replayHorizon']['state']} at batch "
                   f"{s['replayHorizon']['batch']}")

    assert_ids_exactly_once(topics.bootstrap, topics.counts, ledger, expected, (topics.dlq,))

    # 2. A wrong password: resolution of the next start says so, once, and waits; the right one heals it.
    kubectl.apply(kube_secret("kafka-user", {"username": user, "password": "not-" + password}), namespace)
    assert kubelet.kill9(namespace, d1), diag()
    wait_until(lambda: _ready(kubectl, namespace).get("reason") == "KafkaAuthenticationFailed",
               "KafkaAuthenticationFailed in status", 120, diag, 1)
    assert secure_bootstrap in _ready(kubectl, namespace)["message"], _ready(kubectl, namespace)
    restarts = kubectl.status(namespace, NAME).get("restartCount", 0)
    kubectl.apply(kube_secret("kafka-user", {"username": user, "password": password}), namespace)
    d3 = wait_until(lambda: (lambda d: d if d and d != d1 else None)(running_driver()), "recovery", 240, diag, 1)
    # Healed by the launch's own retry (every 30 s): no restart counted, one event for the cause.
    assert kubectl.status(namespace, NAME).get("restartCount", 0) == restarts, "no restart storm"
    assert kubectl.events(namespace, NAME).count("KafkaAuthenticationFailed") == 1
    journal.append(f"wrong password: KafkaAuthenticationFailed, one event, no restart counted; healed as {d3}")

    # 3. A missing ACL (the transactional ids): KafkaAuthorizationFailed; granted again, the stream goes on.
    txn_acl = AclBinding(ResourceType.TRANSACTIONAL_ID, prefix, ResourcePatternType.PREFIXED, f"User:{user}", "*",
                         AclOperation.WRITE, AclPermissionType.ALLOW)
    ks.revoke(st, [txn_acl])
    assert kubelet.kill9(namespace, d3), diag()
    wait_until(lambda: _ready(kubectl, namespace).get("reason") == "KafkaAuthorizationFailed",
               "KafkaAuthorizationFailed in status", 120, diag, 1)
    ks.grant(st, [txn_acl])
    d4 = wait_until(lambda: (lambda d: d if d and d != d3 else None)(running_driver()), "recovery", 240, diag, 1)
    feed(1000, 25)
    wait_ids(topics.bootstrap, topics.counts, expected, diag)
    assert_ids_exactly_once(topics.bootstrap, topics.counts, ledger, expected, (topics.dlq,))
    journal.append(f"transactional-id ACL revoked: KafkaAuthorizationFailed; granted again, {d4} runs; "
                   f"{len(expected)} ids exactly once")

    # 4. The password is nowhere the platform keeps or shows things.
    places = {
        "ConfigMaps": kubectl.run("get", "configmaps", "-n", namespace, "-o", "yaml").stdout,
        "the stream (spec, status, annotations)": kubectl.run("get", "exactlyoncestream", NAME, "-n", namespace,
                                                              "-o", "yaml").stdout,
        "snapshots": kubectl.run("get", "exactlyoncesnapshots", "-n", namespace, "-o", "yaml").stdout,
        "events": kubectl.run("get", "events", "-n", namespace, "-o", "yaml").stdout,
        "Pods": kubectl.run("get", "pods", "-n", namespace, "-o", "yaml").stdout,
        "operator log": Path(operator.log_path).read_text(errors="replace"),
    }
    for log in sorted((tmp_path / "kubelet").rglob("*.log")) if (tmp_path / "kubelet").is_dir() else []:
        places[f"log {log.name}"] = log.read_text(errors="replace")
    leaks = [where for where, text in places.items() if password in text]
    assert not leaks, f"the password appears in: {leaks}"
    assert len(places) > 6, sorted(places)                        # the driver logs were searched too
    print("\n".join(journal))
    report_result(f"SASL_SSL (SCRAM-SHA-512, private CA) on source and sink with per-stream ACLs: a driver "
                  f"SIGKILL, {len(expected)} ids exactly once; wrong password -> "
                  "KafkaAuthenticationFailed, missing ACL -> KafkaAuthorizationFailed, both healed; the password "
                  f"in none of {len(places)} places")
