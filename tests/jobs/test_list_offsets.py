"""ledger.list_offsets retries while a leader moves (a clean-clone CI run saw UNKNOWN_LEADER_EPOCH from
resolution's end-offset read just after a broker SIGKILL and restart), and gives up on other errors."""
from concurrent.futures import Future

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from eos_job import ledger

pytestmark = pytest.mark.unit


class _Result:
    def __init__(self, offset):
        self.offset = offset


class _Admin:
    def __init__(self, errors):
        self.errors, self.calls = list(errors), 0

    def list_offsets(self, request, request_timeout, **kwargs):
        self.calls += 1
        out = {}
        for tp in request:
            f = Future()
            if self.errors:
                f.set_exception(KafkaException(KafkaError(self.errors[0])))
            else:
                f.set_result(_Result(tp.partition * 10))
            out[tp] = f
        if self.errors:
            self.errors.pop(0)
        return out


TPS = [TopicPartition("t", 0), TopicPartition("t", 1)]


def test_a_moving_leader_is_waited_for(monkeypatch):
    monkeypatch.setattr(ledger.time, "sleep", lambda s: None)
    admin = _Admin([KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.NOT_LEADER_FOR_PARTITION])
    assert ledger.list_offsets(admin, TPS, object(), 5.0) == {("t", 0): 0, ("t", 1): 10}
    assert admin.calls == 3


def test_other_errors_are_raised_at_once(monkeypatch):
    monkeypatch.setattr(ledger.time, "sleep", lambda s: None)
    admin = _Admin([KafkaError.TOPIC_AUTHORIZATION_FAILED])
    with pytest.raises(KafkaException):
        ledger.list_offsets(admin, TPS, object(), 5.0)
    assert admin.calls == 1


def test_a_leader_that_never_comes_back_is_raised_after_the_timeout(monkeypatch):
    clock = iter(range(0, 1000))
    monkeypatch.setattr(ledger.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(ledger.time, "sleep", lambda s: None)
    admin = _Admin([KafkaError.UNKNOWN_LEADER_EPOCH] * 100)
    with pytest.raises(KafkaException):
        ledger.list_offsets(admin, TPS, object(), 5.0)
    assert 2 <= admin.calls < 10
