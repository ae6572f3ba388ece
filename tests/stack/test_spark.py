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
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
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


def test_a_driver_jvm_maps_the_class_data_archive_the_stack_made(stack_env, tmp_path):
    """``-Xshare:on`` makes the JVM refuse to start unless it maps the archive: the archive the stack made
    (eos_job.cds) matches this JVM and PySpark, and the session builder passes it to the driver."""
    import subprocess
    import sys
    from pathlib import Path

    archive = stack_env.get("EOS_SPARK_CDS_ARCHIVE")
    assert archive and Path(archive).is_file(), f"no class-data archive in .stack/env: {archive!r}"
    script = ("from eos_job.session import build_spark_session\n"
              "s = build_spark_session('cds-check', conf={'spark.driver.extraJavaOptions': '-Xshare:on'})\n"
              "print(s.sparkContext.getConf().get('spark.driver.extraJavaOptions'))\n"
              "print(s.range(10).count())\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    options, count = proc.stdout.strip().splitlines()[-2:]
    assert options.endswith(f"-XX:SharedArchiveFile={archive} -Xshare:on") and count == "10", proc.stdout
