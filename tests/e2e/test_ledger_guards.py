"""The ledger's assumptions are checked before a driver writes (real broker, no Spark): a ledger topic whose
records would expire, one less durable than the sink (unclean leader election on; too few replicas or a low
min.insync.replicas need more brokers than the stack's one: tests/jobs/test_ledger_topic.py) or one that holds
another stream's records stops the start with what to do."""
from __future__ import annotations

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from eos_job.ledger import SinkUnavailable
from eos_job.runtime import preflight
from tests.e2e.job_runs import run_config

pytestmark = pytest.mark.stack


def _ledger(run, config: dict[str, str]) -> None:
    with AdminClient({"bootstrap.servers": run.bootstrap}) as admin:
        admin.create_topics([NewTopic(run.ledger_topic(), num_partitions=3, replication_factor=1,
                                      config=config)])[run.ledger_topic()].result(30)


def _config(run) -> dict[str, str]:
    with AdminClient({"bootstrap.servers": run.bootstrap}) as admin:
        res = ConfigResource(ResourceType.TOPIC, run.ledger_topic())
        return {k: e.value for k, e in admin.describe_configs([res])[res].result(30).items()}


def test_a_fresh_ledger_passes_and_is_created_compacted(colors_run):
    run = colors_run()
    run.setup()
    preflight(run_config(run))          # creates the ledger topic
    config = _config(run)
    assert config["cleanup.policy"] == "compact"
    # The single-broker stack: one replica is all there is (and the sink topic's own), so min.insync.replicas 1;
    # unclean leader election off whatever the broker's default.
    assert config["min.insync.replicas"] == "1" and config["unclean.leader.election.enable"] == "false"
    with AdminClient({"bootstrap.servers": run.bootstrap}) as admin:
        md = admin.list_topics(run.ledger_topic(), timeout=30)
    assert {len(p.replicas) for p in md.topics[run.ledger_topic()].partitions.values()} == {1}
    preflight(run_config(run))          # and accepts it the second time


def test_a_ledger_with_unclean_leader_election_is_refused(colors_run):
    run = colors_run()
    run.setup()
    _ledger(run, {"cleanup.policy": "compact", "unclean.leader.election.enable": "true"})
    with pytest.raises(SinkUnavailable, match=r"unclean.leader.election.enable=true, the required is false.*"
                                              r"--add-config unclean.leader.election.enable=false"):
        preflight(run_config(run))


def test_a_ledger_whose_records_expire_is_refused(colors_run):
    run = colors_run()
    run.setup()
    _ledger(run, {"cleanup.policy": "delete"})
    with pytest.raises(SinkUnavailable, match=r"cleanup.policy=delete.*Set cleanup.policy=compact"):
        preflight(run_config(run))


def test_a_ledger_holding_another_streams_records_is_refused(colors_run):
    run = colors_run()
    run.setup()
    _ledger(run, {"cleanup.policy": "compact"})
    p = Producer({"bootstrap.servers": run.bootstrap})
    p.produce(run.ledger_topic(), key=b"0123456789abcdef-other-stream/epoch", value=b'{"epoch": 1}', partition=0)
    assert p.flush(30) == 0
    with pytest.raises(SinkUnavailable, match=r"holds records of another stream.*sink.ledgerTopic"):
        preflight(run_config(run))
