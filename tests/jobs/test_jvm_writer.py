"""What the driver hands the JVM slot writer (eos_job.jvm_writer): the slot config as JSON, field by field the
Python slot tasks' (jvm/slot-writer's Config reads these names), with only the producer settings the Java
producer shares: never the librdkafka ones, never credentials."""
from __future__ import annotations

import json

import pytest

from eos_job import jvm_writer, sink
from eos_job.spec import ExactlyOnceStreamSpec, semantic_errors

from .test_spec import spec

pytestmark = pytest.mark.unit


def cfg(**kw) -> sink.SlotWriterConfig:
    base = dict(bootstrap="b:9092", producer_config={"batch.size": "65536", "sasl.password": "hunter2",
                                                      "linger.ms": "20"},
                topic="out", dead_letter_topic=None, ledger_topic="l", tx_prefix="eos-p", generation=2,
                stream_uid="u", checkpoint_id="c", spec_hash="h", transaction_timeout_ms=60000, batch=7, slots=3,
                unsafe=frozenset({"ledger-skip", "fence"}), slot_map=(1, 0))
    return sink.SlotWriterConfig(**{**base, **kw})


def test_the_config_carries_every_field_and_only_the_shared_producer_settings():
    doc = json.loads(jvm_writer.config_json(cfg()))
    assert doc["producer_config"] == {"batch.size": "65536"}
    assert "hunter2" not in jvm_writer.config_json(cfg())
    assert doc["unsafe"] == ["fence", "ledger-skip"] and doc["slot_map"] == [1, 0]
    assert {k: doc[k] for k in ("tx_prefix", "generation", "batch", "stream_uid", "checkpoint_id", "epoch")} == \
           {"tx_prefix": "eos-p", "generation": 2, "batch": 7, "stream_uid": "u", "checkpoint_id": "c", "epoch": 0}
    assert "fault_commit_returned_slot" not in doc
    faulted = json.loads(jvm_writer.config_json(cfg(), {"commit_returned_slot": 1, "fail_slot": 2}))
    assert (faulted["fault_commit_returned_slot"], faulted["fault_fail_slot"]) == (1, 2)


def test_the_java_clients_security_replaces_the_librdkafka_settings():
    """sink.writer jvm with credentials and tls: the Java client's settings (ledger.sink_java_security) go in the
    config the slot tasks read; the librdkafka ones of the Python writer's producer config stay out."""
    from eos_job.kafka_security import KafkaSecrets
    from eos_job.ledger import sink_java_security

    doc = spec()
    doc["sink"] = {**doc["sink"], "writer": "jvm",
                   "credentials": {"mechanism": "SCRAM-SHA-512", "securityProtocol": "SASL_SSL",
                                   "username": {"name": "k", "key": "user"}, "password": {"name": "k", "key": "pw"}},
                   "tls": {"ca": {"name": "k", "key": "ca.crt"}}}
    model = ExactlyOnceStreamSpec.model_validate(doc)
    assert semantic_errors(model) == []          # no longer refused with jvm
    security = sink_java_security(model.sink, KafkaSecrets({"username": "u", "password": 'p"w', "ca": "PEM"}))
    sent = json.loads(jvm_writer.config_json(cfg(), security=security))["producer_config"]
    assert sent == {"batch.size": "65536", "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                    "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                                        'username="u" password="p\\"w";',
                    "ssl.endpoint.identification.algorithm": "https", "ssl.truststore.type": "PEM",
                    "ssl.truststore.certificates": "PEM"}, sent


def test_the_dead_letter_topic_and_the_topic_limits_reach_the_jvm_writer():
    doc = json.loads(jvm_writer.config_json(cfg(dead_letter_topic="poison", topic_limits={"out": 1000})))
    assert (doc["dead_letter_topic"], doc["topic_limits"]) == ("poison", {"out": 1000})


def test_producer_config_is_mapped_to_the_java_producers_names():
    assert jvm_writer.java_producer_settings({"linger.ms": "20", "compression.codec": "zstd",
                                              "message.max.bytes": "2000000", "queue.buffering.max.ms": "7"}) == \
        {"linger.ms": "7", "compression.type": "zstd", "max.request.size": "2000000"}
    with pytest.raises(ValueError, match="sink.producerConfig.socket.keepalive.enable"):
        jvm_writer.java_producer_settings({"socket.keepalive.enable": "true"})


@pytest.mark.parametrize("sink_extra,field", [({"producerConfig": {"linger.ms": "20", "socket.keepalive.enable": "true"}},
                                               "sink.producerConfig.socket.keepalive.enable")])
def test_what_the_jvm_writer_does_not_do_yet_is_refused_naming_the_field(sink_extra, field):
    doc = spec()
    doc["sink"] = {**doc["sink"], **sink_extra}
    assert semantic_errors(ExactlyOnceStreamSpec.model_validate(doc)) == []          # python: fine
    doc["sink"]["writer"] = "jvm"
    errors = semantic_errors(ExactlyOnceStreamSpec.model_validate(doc))
    assert len(errors) == 1 and errors[0].startswith(field), errors


def test_a_driver_without_the_writers_jar_is_told_what_to_do():
    """py4j answers a class it cannot find with a package, which is not callable: said as such, not as a TypeError."""
    from types import SimpleNamespace

    class Package:   # what py4j's JVM view gives for a name that is no class on the class path
        def __getattr__(self, name):
            return Package()

    df = SimpleNamespace(sparkSession=SimpleNamespace(_jvm=Package()), _jdf=None)
    with pytest.raises(RuntimeError, match="EOS_SLOT_WRITER_JAR"):
        jvm_writer.run_slots(df, cfg())
