"""The start check of the slot producers' request size against the sink topics' max.message.bytes."""
from __future__ import annotations

import logging
from concurrent.futures import Future
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException

from eos_job.contract import SpecRefused
from eos_job.request_limits import SinkLimits, batch_room, check_sink_limits, fit_batch

FIELDS = {"out": "sink.topic", "dlq": "sink.deadLetterTopic"}


def test_an_unset_batch_size_is_fitted_under_the_smallest_limit_and_the_log_says_so(caplog):
    caplog.set_level(logging.INFO, "eos_job.request_limits")
    limits = fit_batch({}, {"out": 65536, "dlq": 1048588}, FIELDS)
    assert limits.batch_size == batch_room(65536) == 64512
    assert limits.producer_overrides() == {"batch.size": "64512"}
    assert limits.topic_bytes == {"out": 65536, "dlq": 1048588}
    assert "batch.size=64512" in caplog.text and "max.message.bytes=65536" in caplog.text
    assert "'out' (sink.topic)" in caplog.text


def test_an_explicit_batch_size_that_cannot_fit_is_refused_naming_both_settings():
    with pytest.raises(SpecRefused) as refused:
        fit_batch({"batch.size": "1000000"}, {"out": 1048588, "dlq": 65536}, FIELDS)
    text = str(refused.value)
    assert "sink.producerConfig.batch.size = 1000000" in text and "max.message.bytes = 65536" in text
    assert "'dlq' (sink.deadLetterTopic)" in text and "at most 64512" in text


def test_requests_that_fit_change_nothing():
    assert fit_batch({}, {"out": 1048588}, FIELDS) == SinkLimits({"out": 1048588})      # librdkafka's defaults
    assert fit_batch({"batch.size": "16384"}, {"out": 65536}, FIELDS).batch_size is None
    # message.max.bytes bounds a request too: an explicit batch.size above a small one fits
    assert fit_batch({"batch.size": "1000000", "message.max.bytes": "60000"}, {"out": 65536},
                     FIELDS).batch_size is None
    assert fit_batch({}, {}, FIELDS) == SinkLimits()                                     # nothing read


class FakeAdmin:
    """describe_configs answering per topic: a limit, or an error (a missing describe-configs ACL)."""

    def __init__(self, answers: dict, broker_limit: int = 1048588):
        self.answers, self.broker_limit = answers, broker_limit

    def describe_configs(self, resources, request_timeout=None):
        out = {}
        for res in resources:
            fut: Future = Future()
            answer = self.answers.get(res.name) if res.restype.name == "TOPIC" else self.broker_limit
            if isinstance(answer, KafkaError):
                fut.set_exception(KafkaException(answer))
            else:
                key = "max.message.bytes" if res.restype.name == "TOPIC" else "message.max.bytes"
                fut.set_result({} if answer is None else {key: SimpleNamespace(value=str(answer))})
            out[res] = fut
        return out

    def list_topics(self, timeout=None):
        return SimpleNamespace(brokers={1: object()})


def test_the_check_reads_each_topics_limit_and_falls_back_to_the_brokers():
    admin = FakeAdmin({"out": 65536, "dlq": None}, broker_limit=2_000_000)
    limits = check_sink_limits(admin, {}, FIELDS, 5.0)
    assert limits.topic_bytes == {"out": 65536, "dlq": 2_000_000} and limits.batch_size == 64512


def test_a_topic_whose_configs_cannot_be_read_is_left_to_the_slots_with_a_warning(caplog):
    admin = FakeAdmin({"out": KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), "dlq": 1048588})
    limits = check_sink_limits(admin, {"batch.size": "1000000"}, FIELDS, 5.0)
    assert limits == SinkLimits({"dlq": 1048588})
    assert "cannot read max.message.bytes of topic 'out'" in caplog.text and "describe-configs" in caplog.text
