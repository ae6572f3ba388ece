"""Resolution fences every transactional id of a 256-slot stream against the real broker, in parallel.

Before resolution, each of the stream's 512 ids (256 slots, generations 0 and 1)
opens a transaction with one record in the sink topic and its producer goes away
without finishing it, as a crashed driver's would. The transactions' timeout is
15 minutes, so within the test only a fence of its id can end each of them.
After ``resolve``: every one is aborted (the partition's last stable offset is
its end again and a read_committed reader sees none of the 512 records), a
producer still holding an old epoch of an id is fenced, and resolution left no
librdkafka thread and no fencing thread behind. With the dense connections
resolution uses on this one-broker cluster and with librdkafka's sparse ones.
The unit tests over a fake producer are tests/jobs/test_fencing.py.
"""
from __future__ import annotations

import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from confluent_kafka import IsolationLevel, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from eos_job.fencing import release
from eos_job.verify import read_committed
from eos_job.resolution import resolve
from eos_job.spec import ExactlyOnceStreamSpec, RunConfig, StreamIdentity

TIMEOUT = 60.0
SLOTS = 256
FENCED = ("PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH", "_FENCED")


def librdkafka_threads() -> int:
    """Threads of this process that librdkafka started (it names them rdk:main, rdk:broker..., ...)."""
    n = 0
    for task in os.listdir("/proc/self/task"):
        try:
            n += Path(f"/proc/self/task/{task}/comm").read_text().startswith("rdk:")
        except OSError:   # the thread ended meanwhile
            pass
    return n


def stream_config(bootstrap: str, topic: str, workdir: Path) -> RunConfig:
    spec = ExactlyOnceStreamSpec.model_validate({
        "job": {"module": "m", "parallelism": SLOTS},
        "source": {"bootstrapServers": bootstrap, "topics": ["unused"]},
        "sink": {"bootstrapServers": bootstrap, "topic": topic},
        "checkpoint": {"store": "local", "path": str(workdir)}})
    uid = uuid.uuid4().hex
    return RunConfig(stream=StreamIdentity(name=f"fence{uid[:6]}", namespace="default", uid=uid, generation=1),
                     spec=spec, checkpoint_dir=str(workdir / "live"))


def open_transaction(bootstrap: str, txid: str, topic: str) -> Producer:
    """A producer of ``txid`` with an open transaction holding one record of ``topic``."""
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txid, "transaction.timeout.ms": 900000,
                  "enable.sparse.connections": False})
    p.init_transactions(TIMEOUT)
    p.begin_transaction()
    p.produce(topic, key=txid.encode(), value=txid.encode())
    assert p.flush(TIMEOUT) == 0
    return p


def stable_and_end(bootstrap: str, topic: str) -> tuple[int, int]:
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        tp = TopicPartition(topic, 0)
        return tuple(admin.list_offsets({tp: OffsetSpec.latest()}, isolation_level=level)[tp].result(TIMEOUT).offset
                     for level in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED))


def committed_records(bootstrap: str, topic: str) -> list[bytes]:
    return [m.value() for m in read_committed(bootstrap, topic, TIMEOUT)]


@pytest.mark.parametrize("dense", [True, False], ids=["dense-connections", "sparse-connections"])
def test_resolution_fences_every_id_of_256_slots_and_leaves_no_client_thread(bootstrap, topic, tmp_path,
                                                                              dense):
    config = stream_config(bootstrap, topic, tmp_path)
    prefix = config.stream.transactional_prefix
    txids = [f"{prefix}-{g}-{s}" for g in (0, 1) for s in range(SLOTS)]
    kept = [txids[0], txids[SLOTS - 1], txids[SLOTS], txids[-1]]   # first and last slot of each generation
    with ThreadPoolExecutor(16) as pool:
        # Each producer but the kept ones goes away with its transaction open: the broker keeps it.
        holders = {t: p for t, p in zip(txids, pool.map(lambda t: open_transaction(bootstrap, t, topic),
                                                         txids)) if t in kept}
    stable, end = stable_and_end(bootstrap, topic)
    assert (stable, end) == (0, 2 * SLOTS), "each id should hold one record in an open transaction"

    threads, rdk = threading.active_count(), librdkafka_threads()
    report = resolve(config, timeout_s=TIMEOUT, dense_fences=dense)
    assert (librdkafka_threads(), threading.active_count()) == (rdk, threads), \
        "resolution left client (rdk:*) or fencing threads behind"
    assert (report.fenced_transactional_ids, report.generation, report.slots) == (2 * SLOTS + 1, 1, SLOTS)   # + driver
    assert report.open_transactions_aborted == 1          # the sink topic's one partition, held before, not after

    # Every id's transaction was aborted by its fence (nothing else ends it within 15 minutes): no open
    # transaction is left on the partition and none of the 512 records is visible.
    deadline = time.monotonic() + TIMEOUT
    while (now := stable_and_end(bootstrap, topic))[0] < now[1] and time.monotonic() < deadline:
        time.sleep(0.2)   # abort markers may trail the fence by a moment
    assert now[0] == now[1] >= 2 * SLOTS + 1, f"transactions still open after resolution: {now}"
    assert committed_records(bootstrap, topic) == []

    # A producer that still holds an old epoch of an id is fenced: it cannot commit.
    for txid, p in holders.items():
        with pytest.raises(KafkaException) as info:
            p.commit_transaction(TIMEOUT)
        err = info.value.args[0]
        assert err.name() in FENCED, f"{txid}: {err}"
        release(p)   # close() raises the fatal error again, and still destroys the client
