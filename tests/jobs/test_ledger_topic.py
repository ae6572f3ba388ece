"""The ledger topic's durability (issue 27): created at least as durable as the sink topic, and an existing one
that falls short refused with the setting, its value, the required one and the command that fixes it. A fake
admin client; tests/e2e/test_ledger_guards.py checks the real broker."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from eos_job import ledger_topic
from eos_job.ledger import SinkUnavailable
from eos_job.ledger_topic import Durability


class _Done:
    def __init__(self, value=None):
        self.value = value

    def result(self, timeout=None):
        return self.value


class FakeAdmin:
    """list_topics, describe_configs, create_topics and create_partitions of a cluster of ``brokers``."""

    def __init__(self, brokers: int, **topics: tuple[int, dict[str, str]]):
        self.brokers = brokers
        self.topics = {name: (rf, 3, cfg) for name, (rf, cfg) in topics.items()}
        self.created: list = []

    def list_topics(self, topic=None, timeout=None):
        md = {name: SimpleNamespace(error=None, partitions={p: SimpleNamespace(replicas=list(range(rf)), leader=0)
                                                            for p in range(n)})
              for name, (rf, n, _) in self.topics.items()}
        return SimpleNamespace(brokers=dict.fromkeys(range(self.brokers)), topics=md)

    def describe_configs(self, resources):
        defaults = {"min.insync.replicas": "1", "unclean.leader.election.enable": "false", "cleanup.policy": "delete"}
        return {r: _Done({k: SimpleNamespace(value=v) for k, v in {**defaults, **self.topics[r.name][2]}.items()})
                for r in resources}

    def create_topics(self, new_topics):
        for t in new_topics:
            self.created.append(t)
            self.topics[t.topic] = (t.replication_factor, t.num_partitions, dict(t.config))
        return {t.topic: _Done() for t in new_topics}

    def create_partitions(self, parts):
        for p in parts:
            rf, _, cfg = self.topics[p.topic]
            self.topics[p.topic] = (rf, p.new_total_count, cfg)
        return {p.topic: _Done() for p in parts}


@pytest.mark.parametrize("brokers,sink_rf,sink_isr,rf,isr", [
    (1, 1, "1", 1, 1),        # the local stack's single broker
    (2, 2, "1", 2, 1),
    (3, 1, "1", 3, 2),        # a default topic on a 3-broker cluster: the ledger still gets 3 replicas
    (5, 3, "2", 3, 2),
    (5, 5, "3", 5, 3),        # never less than the sink
])
def test_a_new_ledger_is_created_at_least_as_durable_as_the_sink(brokers, sink_rf, sink_isr, rf, isr):
    admin = FakeAdmin(brokers, out=(sink_rf, {"min.insync.replicas": sink_isr}))
    need = ledger_topic.ledger_durability(admin, "out")
    assert (need.replication, need.min_insync) == (rf, isr)
    ledger_topic.ensure_ledger_topic(admin, "out.ledger", 2, need, timeout_s=1)
    [topic] = admin.created
    assert (topic.topic, topic.num_partitions, topic.replication_factor) == ("out.ledger", 3, rf)
    assert topic.config["cleanup.policy"] == "compact" and topic.config["min.insync.replicas"] == str(isr)
    assert topic.config["unclean.leader.election.enable"] == "false"


@pytest.fixture
def no_records(monkeypatch):
    monkeypatch.setattr(ledger_topic, "watermarks", lambda consumer, topic, partition, timeout_s: (0, 0))
    monkeypatch.setattr(ledger_topic, "records", lambda *a: iter(()))


GOOD = {"cleanup.policy": "compact", "min.insync.replicas": "2", "unclean.leader.election.enable": "false"}
NEED = Durability(3, 2, "out", 3)


def test_a_ledger_as_durable_as_the_sink_passes(no_records):
    admin = FakeAdmin(3, out=(3, {}), ledger=(3, GOOD))
    ledger_topic.check_ledger_topic(admin, None, "ledger", "uid", NEED, timeout_s=1)
    ledger_topic.check_ledger_topic(admin, None, "ledger", "uid", Durability(1, 1, "out", 1), timeout_s=1)


def test_a_ledger_created_by_the_driver_passes_its_own_check(no_records):
    admin = FakeAdmin(3, out=(1, {}))
    need = ledger_topic.ledger_durability(admin, "out")
    ledger_topic.ensure_ledger_topic(admin, "ledger", 2, need, timeout_s=1)
    ledger_topic.check_ledger_topic(admin, None, "ledger", "uid", need, timeout_s=1)


@pytest.mark.parametrize("rf,config,says", [
    (1, GOOD, [r"replication factor 1, the required is 3", "kafka-reassign-partitions",
               "delete the topic and let the driver create it"]),
    (3, {**GOOD, "min.insync.replicas": "1"},
     [r"min.insync.replicas=1, the required is 2",
      "kafka-configs --alter --entity-type topics --entity-name ledger --add-config min.insync.replicas=2"]),
    (3, {**GOOD, "unclean.leader.election.enable": "true"},
     [r"unclean.leader.election.enable=true, the required is false",
      "--entity-name ledger --add-config unclean.leader.election.enable=false"]),
    (3, {**GOOD, "cleanup.policy": "compact,delete"},
     [r"cleanup.policy=compact,delete", "--entity-name ledger --add-config cleanup.policy=compact"]),
])
def test_a_ledger_less_durable_than_the_sink_is_refused_saying_how_to_fix_it(no_records, rf, config, says):
    admin = FakeAdmin(3, out=(3, {}), ledger=(rf, config))
    with pytest.raises(SinkUnavailable) as exc:
        ledger_topic.check_ledger_topic(admin, None, "ledger", "uid", NEED, timeout_s=1)
    msg = str(exc.value)
    assert msg.startswith("ledger topic 'ledger' has "), msg
    for part in says:
        assert part in msg, msg


def test_a_sink_topic_whose_configs_the_stream_may_not_read_still_gets_a_ledger_by_its_replication(caplog):
    """A stream's principal with Describe but no DescribeConfigs on its sink topic (the secured e2e's user): the
    start goes on, the ledger's min.insync.replicas from its replication factor, and a warning names the ACL."""
    from confluent_kafka import KafkaError, KafkaException

    admin = FakeAdmin(3, out=(3, {}))

    def refused(resources):
        return {r: SimpleNamespace(result=lambda timeout=None: (_ for _ in ()).throw(
            KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)))) for r in resources}

    admin.describe_configs = refused
    ledger_topic.describe_topics(admin, 1)
    need = ledger_topic.ledger_durability(admin, "out", 1)
    assert (need.replication, need.min_insync) == (3, 2)
    assert "grant the sink principal DescribeConfigs" in caplog.text
