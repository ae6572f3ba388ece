"""The replay horizon on the real stack: a suspended stream falls behind, retention is about to
delete what it has not read (warning), then deletes some of it (loss reported, to the record), and
the user's documented way forward loses exactly those records and nothing else: on the unique-id stream,
the output read_committed is every id sent but the deleted ones, each once (a deleted id in the output would be
reported as unexpected). The operator's Prometheus endpoint says the same."""
from __future__ import annotations

import contextlib
import time
import urllib.request

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from prometheus_client.parser import text_string_to_metric_families

from eos_job.verify import audit_ids
from eos_stack import prometheus
from eos_stack.cluster import condition, wait_until
from eos_stack.common import free_port
from examples.colors.generator import counted, event_value, events
from tests.e2e.streams import IDS, NAME, assert_ids_exactly_once, rig, scrape

HOUR_MS = 3_600_000


def scrape_operator(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The operator-level families of the operator's /metrics (eos_operator_*): sample name -> (labels, value)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name.startswith("eos_operator_"):
            out.setdefault(fam.name, [])
            for s in fam.samples:
                out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def assert_operator_metrics(port: int) -> None:
    """The operator's own series: reconciles of the stream timed (mostly ok), none running between passes
    for long, the API and Kafka error counters present (their values depend on the run: plausible only)."""
    m = scrape_operator(port)
    counts = m.get("eos_operator_reconcile_duration_seconds_count", [])
    assert sum(v for labels, v in counts if labels == {"kind": "stream", "outcome": "ok"}) > 0, counts
    seconds = m.get("eos_operator_reconcile_duration_seconds_sum", [])
    assert sum(v for labels, v in seconds if labels["kind"] == "stream") > 0, seconds
    assert {(labels["kind"], labels["state"]) for labels, _ in m["eos_operator_reconciles_in_flight"]} >= {
        ("stream", "running"), ("stream", "waiting"), ("snapshot", "running"), ("snapshot", "waiting")}
    assert all(0 <= v <= 4 for _, v in m["eos_operator_reconciles_in_flight"]), m["eos_operator_reconciles_in_flight"]
    kafka = {labels["operation"]: v for labels, v in m["eos_operator_kafka_errors_total"]}
    assert set(kafka) >= {"resolve", "ledger-read", "replay-horizon"} and all(v >= 0 for v in kafka.values()), kafka
    assert "eos_operator_kube_api_errors" in m          # the family, even before a first failure
    assert all(labels["code"] == "network" or labels["code"].isdigit()
               for labels, _ in m.get("eos_operator_kube_api_errors_total", [])), m



def produce(bootstrap: str, topic: str, partition: int, n: int, *, start_id: int, age_s: float = 0) -> set[int]:
    """n colors events into one partition, timestamped ``age_s`` seconds ago; the ids the job keeps."""
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    stamp = int((time.time() - age_s) * 1000)
    kept: set[int] = set()
    for i, color in events(n, seed=start_id, start_id=start_id):
        p.produce(topic, key=str(i).encode(), value=event_value(i, color), partition=partition, timestamp=stamp)
        if counted(color):
            kept.add(i)
    assert p.flush(30) == 0, "events not delivered"
    return kept


def all_in(r, expected: set[int]) -> bool:
    return not audit_ids(r.bootstrap, r.topics.counts, expected).missing


@pytest.mark.real_nodes
def test_the_replay_horizon_warns_before_retention_deletes_unread_records_and_reports_the_loss(
        stack_env, nodes, kubectl, namespace, on_nodes, tmp_path, report_result):
    with rig(stack_env, kubectl, namespace, tmp_path, on_nodes=on_nodes) as r, contextlib.ExitStack() as cleanup, \
            AdminClient({"bootstrap.servers": r.bootstrap}) as admin:
        res = ConfigResource(ResourceType.TOPIC, r.topics.events, incremental_configs=[
            ConfigEntry("retention.ms", str(HOUR_MS), incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([res])[res].result(30)

        # 1. A running stream that has read everything: Safe, from its ledger's source positions.
        port = free_port()
        r.start_operator(metrics_port=port)
        # A real Prometheus scrapes the operator every second and evaluates the chart's alerts as shipped.
        prom = cleanup.enter_context(prometheus.start(f"127.0.0.1:{port}", tmp_path / "prometheus"))

        def stream_alerts() -> dict[str, str]:
            return {a["labels"]["alertname"]: a["state"] for a in prometheus.alerts(prom)
                    if a["labels"].get("stream") == NAME and a["labels"].get("namespace") == namespace}
        expected: set[int] = set()
        for part in range(3):
            expected |= produce(r.bootstrap, r.topics.events, part, 100, start_id=part * 100)
        kubectl.apply(r.stream(IDS), namespace)
        wait_until(lambda: all_in(r, expected), "the first events to be written", 300, r.diag, 2)
        st = r.wait_status(lambda s: (s.get("replayHorizon") or {}).get("state") == "Safe"
                           and s["replayHorizon"]["backlogRecords"] == 0, "a Safe replay horizon", 120)
        wait_until(lambda: prometheus.query(prom, f'eos_stream_replay_horizon_backlog_records{{stream="{NAME}"}}'),
                   "Prometheus to scrape the stream's horizon", 60, r.diag)
        assert stream_alerts() == {}, "a healthy stream raised an alert"

        # 2. Suspended, it falls behind with records 40 minutes old of a 60-minute retention: Shrinking.
        kubectl.patch_spec(namespace, NAME, {"job": {"state": "suspended"}})
        r.wait_status(lambda s: s.get("lifecycleState") == "Suspended", "the stream to suspend")
        behind = {part: produce(r.bootstrap, r.topics.events, part, 50, start_id=1000 + part * 50, age_s=2400)
                  for part in range(3)}
        st = r.wait_status(lambda s: (s.get("replayHorizon") or {}).get("state") == "Shrinking"
                           and s["replayHorizon"]["backlogRecords"] == 150, "the replay horizon to shrink", 120)
        h = st["replayHorizon"]
        assert h["lostRecords"] == 0, h
        assert 0 < h["secondsLeft"] <= 1200 + 5, h          # 20 of 60 minutes left, less what time passed
        # The lag per source partition: the 50 records each partition got while suspended.
        assert sorted((x["partition"], x["records"]) for x in h["lag"]) == [(0, 50), (1, 50), (2, 50)], h
        assert condition(st, "Degraded")["reason"] == "ReplayHorizonShrinking"
        assert st["lastCommittedBatch"] == h["batch"]
        # Prometheus sees it too: the shrinking alert is pending (it fires after 2 minutes); a suspended
        # stream is not "not ready".
        wait_until(lambda: stream_alerts().get("EosStreamReplayHorizonShrinking") in ("pending", "firing"),
                   "the replay-horizon alert in Prometheus", 60, r.diag)
        assert "EosStreamNotReady" not in stream_alerts()

        # 3. Retention deletes partition 0's unread records: they are reported lost, to the record.
        low = TopicPartition(r.topics.events, 0, 150)       # 100 read + 50 unread: delete them all
        admin.delete_records([low])[low].result(30)
        st = r.wait_status(lambda s: (s.get("replayHorizon") or {}).get("state") == "Exceeded",
                           "the lost records to be reported", 120)
        h = st["replayHorizon"]
        assert (h["lostRecords"], h["partition"], h["backlogRecords"]) == (50, f"{r.topics.events}/0", 100), h
        assert condition(st, "Degraded")["reason"] == "ReplayHorizonExceeded"
        # The operator writes status first, then its events (eos_operator.loop): the event may land a moment later.
        wanted = {("Warning", "ReplayHorizonShrinking"), ("Warning", "ReplayHorizonExceeded")}
        wait_until(lambda: wanted <= {(e["type"], e["reason"]) for e in kubectl.event_objects(namespace, NAME)},
                   "both replay-horizon Warning events", 30, r.diag, 0.5)
        wait_until(lambda: stream_alerts().get("EosStreamReplayHorizonExceeded") == "firing",
                   "the records-lost alert to fire in Prometheus", 60, r.diag)
        fired = stream_alerts()

        # 4. The way forward the message names: accept the loss and resume. Exactly the deleted records
        #    are missing; every other id is in the output once.
        assert "failOnDataLoss" in h["message"]
        # The same, as Prometheus scrapes it from the operator.
        m = scrape(port)
        assert m[("eos_stream_replay_horizon_lost_records", namespace)] == 50
        assert m[("eos_stream_degraded", namespace)] == 1
        assert m[("eos_stream_lifecycle_state", namespace, "Suspended")] == 1
        assert m[("eos_stream_events_total", namespace, "Warning", "ReplayHorizonExceeded")] == 1
        assert_operator_metrics(port)
        kubectl.patch_spec(namespace, NAME, {"job": {"state": "running"},
                                             "source": {"acceptDataLoss": True}})
        expected |= behind[1] | behind[2]          # partition 0's 50 are gone: never in the output
        wait_until(lambda: all_in(r, expected), "the rest to be written", 300, r.diag, 2)
        r.wait_status(lambda s: (s.get("replayHorizon") or {}).get("state") == "Safe", "a Safe horizon again", 120)
        assert "ReplayHorizonSafe" in kubectl.events(namespace, NAME)
        assert_ids_exactly_once(r.bootstrap, r.topics.counts, r.topics.ledger(namespace, NAME), expected,
                                (r.topics.dlq,))
        report_result(f"replay horizon: Safe, then Shrinking ({h['backlogRecords'] + 50} behind) while suspended, "
                      f"then Exceeded with exactly the 50 deleted records reported lost; resumed with "
                      f"acceptDataLoss (failOnDataLoss=false), {len(expected)} ids exactly once without them; a real Prometheus "
                      f"scraping the operator raised {fired}")
