"""The JVM slot writer (``sink.writer: jvm``, jvm/slot-writer) on the real broker, in a real local Spark: the
batch's slot tasks run in the executor JVM, called from the PySpark driver through py4j (``eos_job.jvm_writer``),
exactly as ``writer.BatchWriter`` calls it.

* the unique-id stream written by the JVM writer over two batches, the second with the answer to one slot's
  commit lost (the ``commit-returned`` fault: Spark retries the task, which fences, reads its own commit and
  skips), then the second replayed whole: read_committed, the set of ids equals the input with no duplicate,
  nothing left open, and ``kubectl eos verify``'s audit (``verify.audit_sink``) of the JVM's ledger exact;
* cross-writer, Python → JVM: a batch of which the Python reference committed one slot (and died), finished by
  the JVM writer, which skips that slot with the Python writer's count and digest; its negative control, the JVM
  writer with its ledger skip switched off, writes that slot again and the same id audit reports exactly that
  slot's ids twice;
* cross-writer, JVM → Python: a batch the JVM writer left partial (one slot's task failing on every attempt),
  finished by the Python writer's slot tasks, which skip what the JVM committed;
* ``sink.credentials`` and ``sink.tls``: the stack's secured listener (SASL_SSL, SCRAM, the stack's CA as inline
  PEM, hostname verification), a user with exactly a stream's ACLs: output exact; a wrong password refused by
  the broker; the password in no Spark setting nor JVM system property (the UI's environment page shows those)
  and in no error;
* dead letters, cross-writer: a batch with poison records (the transformation's ``error`` column) written whole by
  one writer and replayed by the other (both directions): the replay skips every slot with the first writer's
  count, digest and dead-letter count, the output holds every good id once, the dead-letter topic each poison
  record once with the Python writer's headers; the negative control (the replaying JVM writer's ledger skip off)
  puts every poison record in the dead-letter topic twice, which the same check reports.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow as pa
import pytest

from eos_job import jvm_writer, protocol, sink
from eos_job.verify import audit_ids, audit_sink, open_transactions, read_committed
from tests.stack.conftest import sink_and_ledger

pytestmark = pytest.mark.stack

SLOTS = 3
TIMEOUT = 60.0


@pytest.fixture(scope="module")
def spark(stack_env):
    """A local Spark with this checkout's writer jar (built by Maven if the stack has none for its sources)."""
    from eos_job.session import build_spark_session
    from eos_stack import slot_writer
    from eos_stack.common import Stack
    kafka_jars = stack_env["SPARK_JARS"].split(",")
    jar = str(slot_writer.ensure_jar(Stack(), [Path(j) for j in kafka_jars]))
    return build_spark_session("test-jvm-writer", jars=[*kafka_jars, jar])


@pytest.fixture
def topics(stack_env):
    bootstrap = stack_env["KAFKA_BOOTSTRAP"]
    for names in sink_and_ledger(bootstrap, "jvm", SLOTS):   # the topics go when the loop ends
        yield bootstrap, names["out"], names["ledger"], names["run"]


def config(bootstrap: str, out: str, ledger: str, run: str, batch: int, **kw) -> sink.SlotWriterConfig:
    return sink.SlotWriterConfig(**{
        "bootstrap": bootstrap, "producer_config": {}, "topic": out, "dead_letter_topic": None, "ledger_topic": ledger,
        "tx_prefix": f"eos-test-jvm-{run}", "generation": 0, "stream_uid": f"uid-{run}", "checkpoint_id": f"ckpt-{run}",
        "spec_hash": "h", "transaction_timeout_ms": 60000, "batch": batch, "slots": SLOTS, "input": f"in-{batch}",
        "output_hash": "o", **kw})


def batch_df(spark, ids):
    """The runtime's output shape (eos_job.contract): key, value and the record hash, xxhash64(key, value)."""
    from pyspark.sql import functions as F
    df = spark.createDataFrame([(str(i).encode(), str(i).encode()) for i in ids], "key binary, value binary")
    return df.withColumn(protocol.HASH_COL, F.xxhash64("key", "value"))


def slot_of(spark, ids, slot: int) -> pa.RecordBatch:
    """The rows of ``slot``: Spark's repartition(SLOTS, key) puts a row in pmod(murmur3 hash(key), SLOTS)."""
    rows = batch_df(spark, ids).where(f"pmod(hash(key), {SLOTS}) = {slot}").collect()
    return pa.RecordBatch.from_pydict({"key": [r.key for r in rows], "value": [r.value for r in rows],
                                       protocol.HASH_COL: [r[protocol.HASH_COL] for r in rows]})


def by_slot(commits: list[dict]) -> dict[int, dict]:
    assert sorted(c["slot"] for c in commits) == list(range(SLOTS)), commits
    return {c["slot"]: c for c in commits}


def test_the_unique_id_stream_written_by_the_jvm_writer_is_exact(spark, topics):
    bootstrap, out, ledger, run = topics
    first = by_slot(jvm_writer.run_slots(batch_df(spark, range(300)), config(bootstrap, out, ledger, run, 0)))
    assert not any(c["skipped"] for c in first.values()) and sum(c["count"] for c in first.values()) == 300
    assert sum(c["fences"] for c in first.values()) == SLOTS     # each slot's producer fenced once

    df1 = batch_df(spark, range(300, 600))
    # The answer to slot 1's commit is lost: Spark retries its task, which must find its own commit and skip.
    second = by_slot(jvm_writer.run_slots(df1, config(bootstrap, out, ledger, run, 1), {"commit_returned_slot": 1}))
    assert second[1]["attempt"] >= 1 and second[1]["skipped"] and second[1]["count"] > 0, second[1]
    assert sum(c["count"] for c in second.values()) == 300
    # A2: the slots whose producer stayed clean decided on their last commit, with no fence and no read.
    assert second[0]["trusted"] == second[2]["trusted"] == 1 and second[0]["fences"] == 0, second

    replay = by_slot(jvm_writer.run_slots(df1, config(bootstrap, out, ledger, run, 1)))
    assert all(c["skipped"] and not c["nondeterministic"] for c in replay.values()), replay
    assert {s: (c["count"], c["digest"]) for s, c in replay.items()} == \
           {s: (c["count"], c["digest"]) for s, c in second.items()}

    ids = audit_ids(bootstrap, out, set(range(600)), TIMEOUT)
    assert ids.violations() == [] and ids.records == 600, ids.violations()
    assert open_transactions(bootstrap, [out, ledger]) == set()
    verified = audit_sink(bootstrap, [out], ledger, timeout_s=TIMEOUT)   # kubectl eos verify's audit
    assert verified.exact and verified.slots_checked == 2 * SLOTS and verified.digests_checked == 2 * SLOTS, \
        verified.summary()


@pytest.mark.parametrize("safety", ["on", "off"], ids=["ledger-skip", "negative-control-without-it"])
def test_a_batch_the_python_writer_began_is_finished_by_the_jvm_writer(spark, topics, safety):
    bootstrap, out, ledger, run = topics
    ids = range(400)
    cfg = config(bootstrap, out, ledger, run, 0)
    part = slot_of(spark, ids, 0)
    try:
        py = sink.write_slot(cfg, 0, 0, iter([part]))    # the Python reference commits slot 0, then "dies"
    finally:
        sink._discard(cfg, 0)
    assert not py.skipped and py.count == part.num_rows > 0

    unsafe = frozenset() if safety == "on" else frozenset({"ledger-skip"})
    commits = by_slot(jvm_writer.run_slots(batch_df(spark, ids), config(bootstrap, out, ledger, run, 0, unsafe=unsafe)))
    audit = audit_ids(bootstrap, out, set(ids), TIMEOUT)
    assert open_transactions(bootstrap, [out, ledger]) == set()
    if safety == "on":
        # The JVM skipped the Python writer's slot, agreeing on its count and digest (not non-deterministic).
        assert commits[0]["skipped"] and not commits[0]["nondeterministic"], commits[0]
        assert (commits[0]["count"], commits[0]["digest"]) == (py.count, f"{py.digest:016x}")
        assert not commits[1]["skipped"] and not commits[2]["skipped"]
        assert audit.violations() == [] and audit.records == len(ids), audit.violations()
    else:
        slot0 = sorted(int(k) for k in part.column("key").to_pylist())
        assert not commits[0]["skipped"]
        assert not audit.missing and sorted(audit.duplicates) == slot0, audit.violations()


def test_a_batch_the_jvm_writer_left_partial_is_finished_by_the_python_writer(spark, topics):
    from eos_job.sink import COMMIT_SCHEMA, slot_task
    bootstrap, out, ledger, run = topics
    ids = range(400)
    df = batch_df(spark, ids)
    cfg = config(bootstrap, out, ledger, run, 0)
    # Slot 2's task fails on every attempt before it writes: the batch fails, partly committed by the JVM.
    with pytest.raises(Exception, match="fault: slot 2"):
        jvm_writer.run_slots(df, cfg, {"fail_slot": 2})
    rows = df.repartition(SLOTS, "key").mapInArrow(slot_task(cfg), COMMIT_SCHEMA).collect()
    commits = by_slot([r.asDict() for r in rows])
    jvm_done = [s for s in (0, 1) if commits[s]["skipped"]]
    assert jvm_done, f"the JVM writer committed no slot before the batch failed: {commits}"
    assert not commits[2]["skipped"] and not any(c["nondeterministic"] for c in commits.values()), commits
    audit = audit_ids(bootstrap, out, set(ids), TIMEOUT)
    assert audit.violations() == [] and audit.records == len(ids), audit.violations()
    assert open_transactions(bootstrap, [out, ledger]) == set()
    verified = audit_sink(bootstrap, [out], ledger, timeout_s=TIMEOUT)
    assert verified.exact and verified.slots_checked == SLOTS, verified.summary()


def test_source_partition_slots_follow_the_drivers_slot_map(spark, topics):
    """job.slotsFrom sourcePartitions: no repartition; task i writes slot slot_map[i] (eos_job.source_slots)."""
    bootstrap, out, ledger, run = topics
    ids = range(300)
    df = batch_df(spark, ids).repartition(SLOTS)   # the batch's own tasks, as a map-only plan has them
    per_task = [len(p) for p in df.rdd.glom().collect()]
    slot_map = (2, 0, 1)
    commits = by_slot(jvm_writer.run_slots(df, config(bootstrap, out, ledger, run, 0, slot_map=slot_map)))
    assert {slot_map[t]: n for t, n in enumerate(per_task)} == {s: c["count"] for s, c in commits.items()}
    audit = audit_ids(bootstrap, out, set(ids), TIMEOUT)
    assert audit.violations() == [] and audit.records == len(ids), audit.violations()
    verified = audit_sink(bootstrap, [out], ledger, timeout_s=TIMEOUT)
    assert verified.exact and verified.slots_checked == SLOTS, verified.summary()


def test_the_jvm_writer_commits_over_sasl_ssl_and_keeps_the_password_out_of_sparks_settings(spark, topics):
    import uuid

    from eos_job.kafka_security import KafkaCredentials, KafkaSecrets, KafkaTls, SecretKeyRef
    from eos_job.ledger import sink_java_security
    from eos_job.spec import SinkSpec
    from eos_stack import kafka_security as ks
    from eos_stack.common import Stack

    bootstrap, out, ledger, run = topics
    st = Stack()
    user, password = f"jvm-{run}", uuid.uuid4().hex
    ks.create_user(st, user, password)
    ks.grant_stream(st, user, source_topics=[], write_topics=[out], ledger_topic=ledger,
                    transactional_prefix=f"eos-test-jvm-{run}", group_prefix=None)
    ref = lambda key: SecretKeyRef(name="kafka", key=key)   # noqa: E731
    sink_spec = SinkSpec(bootstrapServers=ks.secure_bootstrap(st), topic=out, writer="jvm",
                         credentials=KafkaCredentials(mechanism="SCRAM-SHA-512", securityProtocol="SASL_SSL",
                                                      username=ref("user"), password=ref("password")),
                         tls=KafkaTls(ca=ref("ca.crt")))

    def security(pw: str) -> dict[str, str]:
        return sink_java_security(sink_spec, KafkaSecrets({"username": user, "password": pw, "ca": ks.ca_pem(st)}))

    try:
        secure = config(ks.secure_bootstrap(st), out, ledger, run, 0)
        commits = by_slot(jvm_writer.run_slots(batch_df(spark, range(300)), secure, security=security(password)))
        assert sum(c["count"] for c in commits.values()) == 300 and not any(c["skipped"] for c in commits.values())
        audit = audit_ids(bootstrap, out, set(range(300)), TIMEOUT)     # read back over PLAINTEXT, read_committed
        assert audit.violations() == [] and audit.records == 300, audit.violations()
        assert open_transactions(bootstrap, [out, ledger]) == set()
        verified = audit_sink(bootstrap, [out], ledger, timeout_s=TIMEOUT)
        assert verified.exact and verified.slots_checked == SLOTS, verified.summary()

        # Another transactional id (within the user's prefix): the slots' held producers, authenticated when they
        # connected, would not connect again.
        wrong = "not-" + password
        other = dataclasses.replace(config(ks.secure_bootstrap(st), out, ledger, run, 1), tx_prefix=f"{secure.tx_prefix}-b")
        with pytest.raises(Exception) as refused:
            jvm_writer.run_slots(batch_df(spark, range(300, 310)), other, security=security(wrong))
        assert "Authentication failed" in str(refused.value), str(refused.value)[-3000:]
        assert wrong not in str(refused.value) and password not in str(refused.value)
        assert len(read_committed(bootstrap, out)) == 300, "the refused batch wrote something"

        settings = str(spark.sparkContext.getConf().getAll())
        props = str(spark.sparkContext._jvm.System.getProperties())
        assert password not in settings and password not in props
    finally:
        ks.revoke_user(st, user)
        ks.delete_user(st, user)


def batch_with_poison(spark, ids, poison: set[int]):
    """``batch_df`` with the transformation's ``error`` column (eos_job.contract): set for the ids of ``poison``."""
    from pyspark.sql import functions as F
    df = batch_df(spark, ids)
    bad = F.col("key").cast("string").isin([str(i) for i in sorted(poison)])
    return df.withColumn("error", F.when(bad, F.lit("poison: rejected by the job")))


def write_python(df, cfg) -> list[dict]:
    from eos_job.sink import COMMIT_SCHEMA, slot_task
    return [r.asDict() for r in df.repartition(SLOTS, "key").mapInArrow(slot_task(cfg), COMMIT_SCHEMA).collect()]


def dead_letters_of(bootstrap: str, dlq: str) -> list[tuple[int, dict[str, bytes]]]:
    return [(int(m.key()), dict(m.headers())) for m in read_committed(bootstrap, dlq)]


@pytest.mark.parametrize("first,safety", [("python", "on"), ("jvm", "on"), ("python", "off")],
                         ids=["python-then-jvm", "jvm-then-python", "negative-control-jvm-without-ledger-skip"])
def test_poison_records_are_dead_letters_once_whichever_writer_replays_the_batch(spark, topics, first, safety):
    from confluent_kafka.admin import AdminClient, NewTopic
    bootstrap, out, ledger, run = topics
    dlq = f"test-jvm-dlq-{run}"
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(dlq, num_partitions=1, replication_factor=1)])[dlq].result(timeout=60)
        try:
            ids, poison = range(300), {i for i in range(300) if i % 10 == 3}
            df = batch_with_poison(spark, ids, poison)
            cfg = config(bootstrap, out, ledger, run, 0, dead_letter_topic=dlq)
            written = by_slot(write_python(df, cfg) if first == "python" else jvm_writer.run_slots(df, cfg))
            assert sum(c["dead_letters"] for c in written.values()) == len(poison) and \
                not any(c["skipped"] for c in written.values()), written

            unsafe = frozenset() if safety == "on" else frozenset({"ledger-skip"})
            again = config(bootstrap, out, ledger, run, 0, dead_letter_topic=dlq, unsafe=unsafe)
            replay = by_slot(jvm_writer.run_slots(df, again) if first == "python" else write_python(df, again))
            letters = dead_letters_of(bootstrap, dlq)
            audit = audit_ids(bootstrap, out, set(ids) - poison, TIMEOUT)
            assert open_transactions(bootstrap, [out, ledger, dlq]) == set()
            if safety == "off":
                # The same checks see the replay's second copy: every poison record twice, every good id twice.
                assert sorted(k for k, _ in letters) == sorted(list(poison) * 2), letters
                assert sorted(audit.duplicates) == sorted(set(ids) - poison), audit.violations()
                return
            # Skipped whole, agreeing with the first writer on count, digest and dead letters (the slot record).
            assert all(c["skipped"] and not c["nondeterministic"] for c in replay.values()), replay
            assert {s: (c["count"], c["digest"], c["dead_letters"]) for s, c in replay.items()} == \
                   {s: (c["count"], c["digest"], c["dead_letters"]) for s, c in written.items()}
            assert sorted(k for k, _ in letters) == sorted(poison), letters     # each poison record once
            for key, headers in letters:
                assert headers["eos.error"] == b"poison: rejected by the job" and headers["eos.topic"] == out.encode()
                assert headers["eos.batch"] == b"0" and headers["eos.slot"].startswith(b"ckpt-"), headers
            assert audit.violations() == [] and audit.records == len(ids) - len(poison), audit.violations()
            verified = audit_sink(bootstrap, [out], ledger, dead_letter_topic=dlq, timeout_s=TIMEOUT)
            assert verified.exact and verified.slots_checked == SLOTS, verified.summary()
        finally:
            admin.delete_topics([dlq])[dlq].result(timeout=60)
