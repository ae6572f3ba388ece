"""The operator's batched progress reads against the local Kafka (eos_job.tips, eos_job.horizon.observe_many):
many streams of one cluster answered by one call, each answer the same as the one-stream read gives."""
from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from eos_job.clients import SharedClients
from eos_job.horizon import observe_many
from eos_job.protocol import BATCH_PARTITION, BatchCompleteRecord
from eos_job.resolution import last_batch_record
from eos_job.spec import ExactlyOnceStreamSpec, RunConfig, StreamIdentity
from eos_job.tips import Tip, read_tips
from examples.colors.manifest import colors_manifest

KAFKA_TIMEOUT = 60.0


@contextlib.contextmanager
def _topics(bootstrap: str, names: list[str], partitions: int = 1) -> Iterator[AdminClient]:
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        for fut in admin.create_topics([NewTopic(n, num_partitions=partitions, replication_factor=1) for n in names],
                                       operation_timeout=30).values():
            fut.result(timeout=KAFKA_TIMEOUT)
        yield admin


def _ledger_config(name: str, bootstrap: str, ledger: str, source: str = "tips-src") -> RunConfig:
    doc = colors_manifest(name, bootstrap, source, f"{name}-out", "/tmp/unused", namespace="tips")
    doc["spec"]["sink"]["ledgerTopic"] = ledger
    spec = ExactlyOnceStreamSpec.model_validate(doc["spec"])
    return RunConfig(stream=StreamIdentity(name=name, namespace="tips", uid=f"uid-{name}"), spec=spec,
                     checkpoint_dir="/tmp/unused")


def _write_batches(bootstrap: str, ledger: str, batches: list[int], offsets: dict | None = None) -> None:
    """Batch-complete records (with a history record before each, as the driver writes them) in the batch
    partition, committed in one transaction per batch, so the partition ends with a commit marker."""
    before = _stable_end(bootstrap, ledger)
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tips-{uuid.uuid4().hex[:8]}"})
    p.init_transactions(30)
    for b in batches:
        p.begin_transaction()
        p.produce(ledger, key=f"h{b}".encode(), value=b'{"kind": "history"}', partition=BATCH_PARTITION)
        record = BatchCompleteRecord(batch=b, slots=1, count=b * 10, skipped_slots=0, source_offsets=offsets or {})
        p.produce(ledger, key=b"batch", value=record.encode(), partition=BATCH_PARTITION)
        p.commit_transaction(30)
    # commit_transaction returns once the coordinator decided; the broker writes the commit marker into the
    # partition a moment later, and only then does the last stable offset (what read_committed readers and
    # ListOffsets see) move. Wait for it, or a read right after this sees the old end.
    want, deadline = before + 3 * len(batches), time.monotonic() + KAFKA_TIMEOUT
    while _stable_end(bootstrap, ledger) < want:
        assert time.monotonic() < deadline, f"{ledger}: the last stable offset never reached {want}"
        time.sleep(0.05)


def _stable_end(bootstrap: str, ledger: str) -> int:
    """The batch partition's last stable offset; asked again while a just-created topic has no leader yet."""
    from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
    from confluent_kafka.admin import OffsetSpec
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        tp = TopicPartition(ledger, BATCH_PARTITION)
        deadline = time.monotonic() + KAFKA_TIMEOUT
        while True:
            try:
                return admin.list_offsets({tp: OffsetSpec.latest()}, isolation_level=IsolationLevel.READ_COMMITTED,
                                          request_timeout=KAFKA_TIMEOUT)[tp].result().offset
            except KafkaException as exc:
                if time.monotonic() > deadline or not (exc.args[0].retriable() or "LEADER" in exc.args[0].name()):
                    raise
                time.sleep(0.1)


def test_tips_of_many_ledgers_in_one_call_match_the_one_stream_read(stack_env):
    bootstrap = stack_env["KAFKA_BOOTSTRAP"]
    run = uuid.uuid4().hex[:8]
    ledgers = [f"tips-{run}-{i}" for i in range(4)]
    with _topics(bootstrap, ledgers) as admin:
        clients = SharedClients()
        try:
            for i, ledger in enumerate(ledgers[:3]):
                _write_batches(bootstrap, ledger, list(range(i + 1)))   # ledger 3 exists with nothing in it
            missing = f"tips-{run}-missing"
            conf = {"bootstrap.servers": bootstrap}
            tips = read_tips(conf, ledgers + [missing], timeout_s=20, clients=clients)
            assert [tips[t].record.batch for t in ledgers[:3]] == [0, 1, 2]
            assert tips[ledgers[3]] == Tip(0, None) and tips[missing] == Tip(0, None)
            for i, ledger in enumerate(ledgers[:3]):
                one = last_batch_record(_ledger_config(f"s{i}", bootstrap, ledger), timeout_s=20)
                assert one == tips[ledger].record, (ledger, one, tips[ledger])

            # An end that has not moved gives the caller's answer back (no records read): a planted answer shows it.
            planted = Tip(tips[ledgers[0]].end, BatchCompleteRecord(batch=99, slots=1, count=0, skipped_slots=0))
            again = read_tips(conf, ledgers[:2], {ledgers[0]: planted, ledgers[1]: tips[ledgers[1]]}, timeout_s=20,
                              clients=clients)
            assert again[ledgers[0]] is planted and again[ledgers[1]] == tips[ledgers[1]]
            # An end that moved is read again.
            _write_batches(bootstrap, ledgers[1], [5])
            moved = read_tips(conf, ledgers[:2], {ledgers[0]: planted, ledgers[1]: tips[ledgers[1]]}, timeout_s=20,
                              clients=clients)
            assert moved[ledgers[1]].record.batch == 5 and moved[ledgers[1]].end > tips[ledgers[1]].end
        finally:
            clients.close()
            admin.delete_topics(ledgers, operation_timeout=30)


def test_horizons_of_streams_on_one_source_partition_at_different_offsets(stack_env):
    bootstrap = stack_env["KAFKA_BOOTSTRAP"]
    run = uuid.uuid4().hex[:8]
    source = f"tips-src-{run}"
    with _topics(bootstrap, [source], partitions=2) as admin:
        clients = SharedClients()
        try:
            p = Producer({"bootstrap.servers": bootstrap})
            now_ms = int(time.time() * 1000)
            for i in range(6):   # record i written (6 - i) s ago
                p.produce(source, value=b"x", partition=0, timestamp=now_ms - (6 - i) * 1000)
            p.flush(30)
            # Two streams behind on the same partition at offsets 1 and 4, one caught up, one with no batch yet.
            streams = {}
            for name, at in (("a", 1), ("b", 4), ("c", 6)):
                record = BatchCompleteRecord(batch=3, slots=1, count=0, skipped_slots=0,
                                             source_offsets={source: {"0": at, "1": 0}})
                streams[name] = (_ledger_config(name, bootstrap, f"l-{name}", source), record)
            streams["d"] = (_ledger_config("d", bootstrap, "l-d", source), None)
            horizons = observe_many({"bootstrap.servers": bootstrap}, streams, timeout_s=20, now=time.time(),
                                    clients=clients)
            assert horizons["d"] is None
            assert [horizons[n].backlog_records for n in "abc"] == [5, 2, 0]
            assert all(horizons[n].state == "Safe" for n in "abc"), horizons
            assert [[(lag.partition, lag.records) for lag in horizons[n].lag] for n in "abc"] == \
                [[(0, 5)], [(0, 2)], []]
            # Each stream's oldest unprocessed record is its own offset's (a and b need two rounds on partition 0):
            # b's was written 3 s after a's, so retention reaches it 3 s later.
            assert abs(horizons["b"].seconds_left - horizons["a"].seconds_left - 3.0) < 0.3, horizons
            assert horizons["c"].seconds_left is None
        finally:
            clients.close()
            admin.delete_topics([source], operation_timeout=30)


def test_a_ledger_made_after_the_first_read_is_seen_by_the_same_clients(stack_env):
    # The operator reads a stream's tip before its driver has made the ledger; the shared admin client then
    # caches "no such topic" (librdkafka keeps it for minutes), which must not hide the ledger once it exists.
    bootstrap = stack_env["KAFKA_BOOTSTRAP"]
    ledger = f"tips-late-{uuid.uuid4().hex[:8]}"
    conf = {"bootstrap.servers": bootstrap}
    clients = SharedClients()
    with contextlib.ExitStack() as admins:
        admin = None
        try:
            assert read_tips(conf, [ledger], timeout_s=20, clients=clients) == {ledger: Tip(0, None)}
            admin = admins.enter_context(_topics(bootstrap, [ledger]))
            _write_batches(bootstrap, ledger, [0, 1])
            tips = read_tips(conf, [ledger], timeout_s=20, clients=clients)
            assert tips[ledger].record is not None and tips[ledger].record.batch == 1, tips
        finally:
            clients.close()
            if admin is not None:
                admin.delete_topics([ledger], operation_timeout=30)
