"""Spark reads the local broker through the Kafka connector jars the stack resolved."""
from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from eos_job.session import build_spark_session

ROWS = 50


@pytest.fixture(scope="module")
def spark(stack_env):
    session = build_spark_session("test-stack-spark", jars=stack_env["SPARK_JARS"].split(","))
    yield session
    session.stop()


def make_topic(bootstrap: str, partitions: int) -> str:
    name = f"test-spark-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)],
                                   operation_timeout=30).values():
        fut.result(timeout=60)
    return name


def test_streaming_query_reads_kafka_into_a_file_sink(stack_env, spark, tmp_path):
    bootstrap = stack_env["KAFKA_BOOTSTRAP"]
    topic = make_topic(bootstrap, partitions=2)
    produced = {(f"k{i}", f"v{i}") for i in range(ROWS)}
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for k, v in produced:
        p.produce(topic, key=k.encode(), value=v.encode())
    assert p.flush(60) == 0

    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    source = (spark.readStream.format("kafka")
              .option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic)
              .option("startingOffsets", "earliest")
              .load()
              .selectExpr("CAST(key AS STRING) AS k", "CAST(value AS STRING) AS v", "partition", "offset"))
    query = (source.writeStream.format("parquet")
             .option("path", str(out))
             .option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True)
             .start())
    assert query.awaitTermination(180), "the availableNow query did not finish within 180 s"
    assert query.exception() is None

    rows = spark.read.parquet(str(out)).collect()
    assert len(rows) == ROWS  # no duplicates
    assert {(r.k, r.v) for r in rows} == produced
    assert {r.partition for r in rows} == {0, 1}
    assert (checkpoint / "offsets" / "0").is_file()
    assert (checkpoint / "commits" / "0").is_file()
