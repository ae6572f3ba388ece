"""Kafka security settings of both ends from Secret values: librdkafka and Java, never in a repr."""
from __future__ import annotations

import pytest

from eos_job.kafka_security import (KafkaCredentials, KafkaSecretMissing, KafkaSecrets, KafkaTls, denial, env_name,
                                    java_config, librdkafka_config, secret_refs)
from eos_job.spec import ExactlyOnceStreamSpec, semantic_errors

pytestmark = pytest.mark.unit
REF = {"name": "kafka-user", "key": "password"}
CREDS = KafkaCredentials.model_validate({"mechanism": "SCRAM-SHA-512", "username": {"name": "kafka-user", "key": "u"},
                                         "password": REF})
TLS = KafkaTls.model_validate({"ca": {"name": "kafka-ca", "key": "ca.crt"}})
VALUES = KafkaSecrets({"username": "alice", "password": 'p"w\\d', "ca": "-----BEGIN CERTIFICATE-----\nX\n"})


def test_librdkafka_and_java_settings_from_the_secret_values():
    c = librdkafka_config("sink", CREDS, TLS, VALUES)
    assert c == {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "alice",
                 "sasl.password": 'p"w\\d', "ssl.endpoint.identification.algorithm": "https",
                 "ssl.ca.pem": VALUES.values["ca"]}
    j = java_config("source", CREDS, TLS, VALUES)
    assert j["sasl.jaas.config"] == ('org.apache.kafka.common.security.scram.ScramLoginModule required '
                                     'username="alice" password="p\\"w\\\\d";')
    assert j["ssl.truststore.type"] == "PEM" and j["ssl.truststore.certificates"] == VALUES.values["ca"]
    assert librdkafka_config("sink", None, None, KafkaSecrets()) == {}
    assert librdkafka_config("sink", None, TLS, VALUES)["security.protocol"] == "SSL"
    assert "p\"w" not in repr(VALUES)


def test_values_come_from_the_env_the_operator_fills_and_a_missing_one_is_named():
    env = {env_name("source", "username"): "alice", env_name("source", "password"): "pw"}
    assert env_name("sink", "ca") == "EOS_SINK_SSL_CA_PEM"
    got = KafkaSecrets.from_env("source", env)
    assert got.values == {"username": "alice", "password": "pw"}
    with pytest.raises(KafkaSecretMissing, match="EOS_SOURCE_SSL_CA_PEM"):
        librdkafka_config("source", CREDS, TLS, got)
    assert set(secret_refs(CREDS, TLS)) == {"username", "password", "ca"}


def test_what_kafka_refuses_is_named_and_other_errors_are_not():
    assert denial(RuntimeError("Kafka at h:1 refused the connection: authentication failed (...)")) \
        == "KafkaAuthenticationFailed"
    try:
        try:
            raise RuntimeError("KafkaError{code=TRANSACTIONAL_ID_AUTHORIZATION_FAILED,str=Transactional Id "
                               "authorization failed}")
        except RuntimeError as inner:
            raise ValueError("resolution could not fence t-0") from inner
    except ValueError as outer:
        assert denial(outer) == "KafkaAuthorizationFailed"
    assert denial(KafkaSecretMissing("x")) == "KafkaSecretMissing"
    assert denial(RuntimeError("cannot reach Kafka at h:1 within 15s")) is None


def test_spec_rules_for_security():
    base = {"job": {"module": "m"}, "source": {"bootstrapServers": "k:9093", "topics": ["in"]},
            "sink": {"bootstrapServers": "k:9093", "topic": "out"}, "checkpoint": {"store": "local", "path": "/c"}}
    ok = ExactlyOnceStreamSpec.model_validate({**base, "source": {**base["source"], "credentials": {
        "username": {"name": "u", "key": "u"}, "password": REF}, "tls": {"ca": {"name": "ca", "key": "c"}}}})
    assert semantic_errors(ok) == []
    plain = ExactlyOnceStreamSpec.model_validate({**base, "sink": {**base["sink"], "credentials": {
        "securityProtocol": "SASL_PLAINTEXT", "username": {"name": "u", "key": "u"}, "password": REF},
        "tls": {"ca": {"name": "ca", "key": "c"}}}})
    assert any(e.startswith("sink.tls") for e in semantic_errors(plain))
    inline = ExactlyOnceStreamSpec.model_validate({**base, "source": {**base["source"], "options": {
        "kafka.sasl.jaas.config": "x"}}})
    assert any(e.startswith("source.options.kafka.sasl.jaas.config") for e in semantic_errors(inline))
    with pytest.raises(ValueError, match="tls.certificate and tls.key"):
        KafkaTls.model_validate({"certificate": {"name": "c", "key": "crt"}})
