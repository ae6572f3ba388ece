"""The local broker's secured listener: SASL_SSL (SCRAM, TLS from the stack's CA) with ACLs.

A stream's user (``kafka_security.grant_stream``) commits transactions to its sink and ledger and reads
its sources over SASL_SSL, with the CA file and hostname verification; a wrong password, a topic or a
transactional id without an ACL, and a revoked ACL are refused with the broker's own errors; the
PLAINTEXT listener stays unauthenticated for everything else.
"""
from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

TIMEOUT = 60.0


@pytest.fixture
def st(stack_env):
    from eos_stack.common import Stack
    return Stack()


@pytest.fixture
def bootstrap(stack_env) -> str:
    return stack_env["KAFKA_BOOTSTRAP"]


@pytest.fixture
def names():
    sfx = uuid.uuid4().hex[:10]
    return {"source": f"sec-src-{sfx}", "sink": f"sec-sink-{sfx}", "dlq": f"sec-dlq-{sfx}",
            "ledger": f"sec-ledger-{sfx}", "other": f"sec-other-{sfx}", "tx": f"sec-tx-{sfx}-",
            "group": f"eos-sec-{sfx}-", "user": f"stream-{sfx}", "password": uuid.uuid4().hex}


@pytest.fixture
def topics(bootstrap, names):
    """Source, sink, dead-letter, ledger and one more topic, made over PLAINTEXT (super user ANONYMOUS)."""
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        made = [names[k] for k in ("source", "sink", "dlq", "ledger", "other")]
        for fut in admin.create_topics([NewTopic(t, num_partitions=1, replication_factor=1) for t in made],
                                       operation_timeout=30).values():
            fut.result(timeout=TIMEOUT)
        yield made
        for fut in admin.delete_topics(made, operation_timeout=30).values():
            fut.result(timeout=TIMEOUT)


@pytest.fixture
def stream_user(st, names, topics):
    """A SCRAM user with exactly a stream's ACLs; ``(user, password, bindings)``."""
    from eos_stack import kafka_security as ks
    ks.create_user(st, names["user"], names["password"])
    bindings = ks.grant_stream(st, names["user"], source_topics=[names["source"]],
                               write_topics=[names["sink"], names["dlq"]], ledger_topic=names["ledger"],
                               transactional_prefix=names["tx"], group_prefix=names["group"])
    yield names["user"], names["password"], bindings
    ks.revoke_user(st, names["user"])
    ks.delete_user(st, names["user"])


def secure(st, user: str, password: str, **extra) -> dict:
    from eos_stack import kafka_security as ks
    conf = ks.client_config(st, user, password)
    assert conf["ssl.endpoint.identification.algorithm"] == "https"
    return {**conf, **extra}


def read(conf: dict, topic: str, group: str, *, isolation: str = "read_committed") -> list[str]:
    """Every value of ``topic``[0] (assign() from offset 0, no commits), as the job's ledger reader does."""
    c = Consumer({**conf, "group.id": f"{group}{uuid.uuid4().hex[:6]}", "isolation.level": isolation,
                  "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        seen: list[str] = []
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    return seen
                raise KafkaException(msg.error())
            seen.append(msg.value().decode())
        pytest.fail(f"did not reach the end of {topic} within {TIMEOUT}s; saw {seen}")
    finally:
        c.close()


def delivery_errors(conf: dict, topic: str) -> list[KafkaError]:
    """Produce one record (not transactional) and return its delivery error, if any."""
    errors: list[KafkaError] = []
    p = Producer({**conf, "message.timeout.ms": 20000})
    p.produce(topic, value=b"x", on_delivery=lambda err, _msg: errors.append(err))
    assert p.flush(TIMEOUT) == 0
    return errors


def first_error(conf: dict) -> KafkaError:
    """The first error a client of ``conf`` reports (its error callback) while it connects."""
    errors: list[KafkaError] = []
    p = Producer({**conf, "error_cb": errors.append, "log_level": 0})
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and not errors:
        p.poll(0.2)
    assert errors, f"no error within {TIMEOUT}s"
    return errors[0]


def test_env_names_the_secured_listener(stack_env, st):
    from eos_stack import kafka_security as ks
    assert stack_env["KAFKA_SECURE_BOOTSTRAP"] == ks.secure_bootstrap(st) != stack_env["KAFKA_BOOTSTRAP"]
    assert stack_env["KAFKA_CA_FILE"] == str(ks.ca_file(st))
    assert ks.ca_pem(st).startswith("-----BEGIN CERTIFICATE-----")


def test_stream_user_commits_transactions_and_reads_committed_over_sasl_ssl(st, bootstrap, names, stream_user):
    from eos_stack import kafka_security as ks
    user, password, _ = stream_user
    plain = Producer({"bootstrap.servers": bootstrap})
    for v in ("s0", "s1"):
        plain.produce(names["source"], value=v.encode())
    assert plain.flush(TIMEOUT) == 0

    conf = secure(st, user, password)
    assert read(conf, names["source"], names["group"]) == ["s0", "s1"]  # READ on the source

    p = Producer({**conf, "transactional.id": f"{names['tx']}0-1", "transaction.timeout.ms": 60000})
    p.init_transactions(TIMEOUT)
    for batch, commit in (("c0", True), ("a0", False), ("c1", True)):
        p.begin_transaction()
        p.produce(names["sink"], value=batch.encode())
        p.produce(names["ledger"], key=b"batch", value=batch.encode())
        if commit:
            p.commit_transaction(TIMEOUT)
        else:
            p.flush(TIMEOUT)  # in the log, then aborted
            p.abort_transaction(TIMEOUT)

    assert read(conf, names["ledger"], names["group"]) == ["c0", "c1"]  # the stream reads its ledger back
    # The sink is write-only for the stream; the admin super user reads it, also over SASL_SSL.
    admin_conf = secure(st, *ks.admin_credentials(st))
    assert read(admin_conf, names["sink"], names["group"]) == ["c0", "c1"]
    assert read(admin_conf, names["sink"], names["group"], isolation="read_uncommitted") == ["c0", "a0", "c1"]

    # The job's epoch and generation records: idempotent, not transactional, no cluster ACL needed (its batch
    # records go through the transactional id <prefix>-driver, under the stream's prefixed ACL: the secured e2e).
    idem = Producer({**conf, "enable.idempotence": True, "acks": "all"})
    idem.produce(names["ledger"], key=b"epoch", value=b"e1")
    assert idem.flush(TIMEOUT) == 0
    assert read(conf, names["ledger"], names["group"])[-1] == "e1"


def test_grant_stream_grants_exactly_the_streams_acls(st, names, stream_user):
    from eos_stack import kafka_security as ks
    user, password, bindings = stream_user
    assert ks.acls(st, user) == set(bindings)
    conf = secure(st, user, password)

    with pytest.raises(KafkaException) as info:  # WRITE, not READ, on the sink
        read(conf, names["sink"], names["group"])
    assert info.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, info.value

    with AdminClient(conf) as admin:
        with pytest.raises(KafkaException) as info:  # CREATE on its ledger only
            admin.create_topics([NewTopic(f"{names['other']}-new", 1, 1)])[f"{names['other']}-new"].result(TIMEOUT)
        assert info.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, info.value
        # ... and ALTER there: the job grows the ledger when the slot count grows.
        admin.create_partitions([NewPartitions(names["ledger"], 2)])[names["ledger"]].result(TIMEOUT)


def test_wrong_password_fails_authentication(st, stream_user):
    user, _, _ = stream_user
    err = first_error(secure(st, user, "not-the-password"))
    assert err.code() == KafkaError._AUTHENTICATION, err
    assert "authentication" in err.str().lower(), err


def test_scram_sha_256_users_authenticate_too(st, names):
    from eos_stack import kafka_security as ks
    user = f"{names['user']}-256"
    ks.create_user(st, user, names["password"], mechanism="SCRAM-SHA-256")
    ks.create_user(st, user, names["password"], mechanism="SCRAM-SHA-256")  # idempotent
    try:
        conf = secure(st, user, names["password"], **{"sasl.mechanism": "SCRAM-SHA-256"})
        with AdminClient(conf) as admin:
            md = admin.list_topics(timeout=TIMEOUT)
        assert md.brokers and not md.topics  # authenticated; no ACL, so no topic is visible
    finally:
        ks.delete_user(st, user)
    assert ks.user_mechanisms(st, user) == set()


def test_the_broker_certificate_is_verified(st):
    from eos_stack import kafka_security as ks
    conf = secure(st, *ks.admin_credentials(st))
    # Signed by the stack's CA, not by one the system trusts.
    err = first_error({**conf, "ssl.ca.location": "/etc/ssl/certs/ca-certificates.crt"})
    # librdkafka reports the failed handshake as _SSL or, when the socket closes first, _TRANSPORT (seen in a
    # clean-clone run); either way the reason must be the certificate check.
    assert err.code() in (KafkaError._SSL, KafkaError._TRANSPORT) and "certificate verify failed" in err.str(), err
    # The certificate names DNS:localhost next to IP:127.0.0.1.
    with AdminClient({**conf, "bootstrap.servers": f"localhost:{ks.secure_port(st)}"}) as admin:
        md = admin.list_topics(timeout=TIMEOUT)
    assert md.brokers


def test_topic_without_acl_is_refused(st, names, stream_user):
    user, password, _ = stream_user
    conf = secure(st, user, password)
    assert delivery_errors(conf, names["dlq"]) == [None]  # granted: the dead-letter topic
    errors = delivery_errors(conf, names["other"])  # no ACL at all
    assert errors[0] is not None and errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, errors


def test_a_revoked_acl_is_refused(st, names, stream_user):
    from eos_stack import kafka_security as ks
    user, password, bindings = stream_user
    conf = secure(st, user, password)
    assert delivery_errors(conf, names["sink"]) == [None]
    ks.revoke(st, [b for b in bindings if b.name == names["sink"] and b.operation.name == "WRITE"])
    errors = delivery_errors(conf, names["sink"])  # DESCRIBE is left: metadata fine, the write refused
    assert errors[0] is not None and errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, errors

    # Without its group ACL a librdkafka consumer (which must have a group.id) fails each poll, even
    # with assign() and no commits: the group DESCRIBE in grant_stream is needed.
    ks.revoke(st, [b for b in bindings if b.restype.name == "GROUP"])
    c = Consumer({**conf, "group.id": f"{names['group']}x", "enable.auto.commit": False, "log_level": 0})
    try:
        c.assign([TopicPartition(names["source"], 0, 0)])
        deadline = time.monotonic() + TIMEOUT
        while (msg := c.poll(0.5)) is None and time.monotonic() < deadline:
            pass
    finally:
        c.close()
    assert msg is not None and msg.error() is not None, msg
    assert msg.error().code() == KafkaError.GROUP_AUTHORIZATION_FAILED, msg.error()


def test_transactional_id_outside_the_prefix_is_refused(st, names, stream_user):
    user, password, _ = stream_user
    p = Producer(secure(st, user, password, **{"transactional.id": f"elsewhere-{names['tx']}0-1"}))
    with pytest.raises(KafkaException) as info:
        p.init_transactions(TIMEOUT)
    assert info.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, info.value


def test_plaintext_listener_is_unchanged(bootstrap, names, topics):
    """No credentials, no ACL: the PLAINTEXT principal ANONYMOUS is a super user."""
    conf = {"bootstrap.servers": bootstrap}
    assert delivery_errors(conf, names["other"]) == [None]
    p = Producer({**conf, "transactional.id": f"plain-{uuid.uuid4().hex[:8]}"})
    p.init_transactions(TIMEOUT)
    p.begin_transaction()
    p.produce(names["other"], value=b"y")
    p.commit_transaction(TIMEOUT)
    assert read(conf, names["other"], "plain-") == ["x", "y"]
