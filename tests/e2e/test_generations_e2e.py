"""The ledger's generation history on the real broker (no Spark): resolution fences every generation that
ever wrote, so a transaction a generation-0 slot left open is ended even while generation 2 runs (before,
only the current and the previous generation were fenced, and the open transaction held the partition's
read_committed view); and a re-created stream, whose status starts at generation 0 again, continues the
ledger's history instead of reusing generation 0's transactional ids for other slots."""
from __future__ import annotations

import pytest
from confluent_kafka import Producer

from eos_job import epoch, protocol
from eos_job.ledger import sink_security
from eos_job.resolution import resolve
from eos_job.runtime import preflight
from eos_job.spec import StreamIdentity
from eos_job.verify import open_transactions
from tests.e2e.job_runs import run_config

pytestmark = pytest.mark.stack


def _config(run, generation: int, slots: int):
    cfg = run_config(run)
    spec = cfg.spec.model_copy(update={"job": cfg.spec.job.model_copy(update={"parallelism": slots})})
    stream = StreamIdentity(**{**cfg.stream.model_dump(), "generation": generation})
    return cfg.model_copy(update={"spec": spec, "stream": stream})


def test_resolution_fences_every_generation_and_a_re_created_stream_continues_them(colors_run):
    run = colors_run()
    run.setup()
    cfg = _config(run, 0, 2)
    preflight(_config(run, 0, 3))        # a ledger with room for three slots
    ledger, uid = cfg.ledger_topic(), cfg.stream.uid
    sec = sink_security(cfg.spec.sink)
    # The stream's life so far: generation 0 with 2 slots, 1 with 3 (a parallelism change), 2 with 2.
    for gen, slots, first in ((0, 2, 0), (1, 3, 40), (2, 2, 90)):
        assert epoch.generation(run.bootstrap, sec, ledger, uid, gen, slots, first) == gen

    # A generation-0 slot left a transaction open on its ledger partition (a driver that died long ago).
    hanging = Producer({"bootstrap.servers": run.bootstrap, "transactional.id":
                        protocol.transactional_id(cfg.stream.transactional_prefix, 0, 1),
                        "transaction.timeout.ms": 600_000})
    hanging.init_transactions(30)
    hanging.begin_transaction()
    hanging.produce(ledger, key=f"{uid}/x".encode(), value=b"{}", partition=protocol.ledger_partition(1))
    assert hanging.flush(30) == 0
    assert (ledger, protocol.ledger_partition(1)) in open_transactions(run.bootstrap, [ledger])

    report = resolve(_config(run, 2, 2), timeout_s=60)
    assert report.generation == 2
    assert report.fenced_transactional_ids == 2 + 3 + 2 + 1    # every slot of every generation that wrote, the driver
    assert report.open_transactions_aborted >= 1
    assert open_transactions(run.bootstrap, [ledger, run.counts]) == set()

    # Re-created: the resource's status says generation 0 again.
    assert resolve(_config(run, 0, 2), timeout_s=60).generation == 2    # same slots: continue generation 2
    assert resolve(_config(run, 0, 4), timeout_s=60).generation == 3    # other slots: above every one
    assert epoch.generation(run.bootstrap, sec, ledger, uid, 0, 4, 120) == 3
    history = epoch.read_generations(_consumer(run), ledger, uid)
    assert history.generations == [[0, 2, 0], [1, 3, 40], [2, 2, 90], [3, 4, 120]]


def _consumer(run):
    from eos_job.ledger import ledger_consumer
    return ledger_consumer(run.bootstrap)
