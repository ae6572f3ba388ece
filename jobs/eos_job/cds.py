"""A class-data-sharing archive of Spark's classes: a driver JVM that maps it starts about twice as fast.

A Spark driver's cold start is mostly class loading and verification (tens of thousands of classes from
PySpark's ``jars/``). Java 17 can dump the classes a run loaded into an archive
(``-XX:ArchiveClassesAtExit``) and map that archive into later JVMs (``-XX:SharedArchiveFile``), which
then skip parsing and verifying those classes. On this project's two-core machine kind a session plus its
first job went from about 13 s to about 7 s: a restart, an upgrade and every recovery gain that.

The archive is only valid for the exact JVM and class path it was made with (the JVM checks, and quietly
runs without it otherwise), so it is made where it is used: by ``eos_stack up`` into the cache for the
local stack, or by the image build (``python -m eos_job.cds <file>``). ``EOS_SPARK_CDS_ARCHIVE`` names it;
``session.shared_archive_options`` is what the session builder adds to the driver's JVM options when the file exists.

The training run is a small streaming query shaped like a real job (Kafka-free: the rate source, a
stateful aggregation, ``foreachBatch`` with ``mapInArrow`` over a repartition), so the archive holds the
classes a driver loads on its way to its first batch.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from .session import ARCHIVE_ENV, build_spark_session


def train(archive: Path, batches: int = 3) -> Path:
    """Run the training query in this process's new SparkSession and dump its classes to ``archive``
    (written when the JVM exits: call this in a process of its own, see :func:`main`)."""
    from pyspark.sql import functions as F

    spark = build_spark_session("eos-cds-training", conf={
        "spark.driver.extraJavaOptions": f"-XX:ArchiveClassesAtExit={archive}",
        "spark.sql.shuffle.partitions": "2", "spark.sql.adaptive.enabled": "false"})
    done: list[int] = []

    def write(df, batch_id):
        def passthrough(it):
            for b in it:
                yield b
        df.repartition(2, "bucket").mapInArrow(passthrough, df.schema).count()
        done.append(batch_id)

    with tempfile.TemporaryDirectory() as ckpt:
        counts = (spark.readStream.format("rate").option("rowsPerSecond", 200).load()
                  .withColumn("bucket", F.col("value") % 7)
                  .groupBy("bucket").agg(F.count("*").alias("n")))
        query = (counts.writeStream.foreachBatch(write).outputMode("update")
                 .trigger(processingTime="200 milliseconds").option("checkpointLocation", ckpt).start())
        deadline = time.monotonic() + 120
        while len(done) < batches and time.monotonic() < deadline and query.isActive:
            time.sleep(0.2)
        query.stop()
    spark.stop()
    if len(done) < batches:
        raise RuntimeError(f"the training query ran {len(done)} of {batches} batches")
    # The JVM writes the archive as it exits, which it does when its standard input closes.
    from pyspark import SparkContext
    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    if proc is not None:
        gateway.shutdown()
        proc.stdin.close()
        proc.wait(300)
    if not archive.is_file():
        raise RuntimeError(f"the JVM exited without writing {archive}")
    return archive


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m eos_job.cds <archive file>", file=sys.stderr)
        return 2
    os.environ.pop(ARCHIVE_ENV, None)     # the training JVM must not map an older archive
    archive = Path(argv[0]).resolve()
    archive.parent.mkdir(parents=True, exist_ok=True)
    tmp = archive.with_name(archive.name + ".tmp")
    tmp.unlink(missing_ok=True)
    started = time.monotonic()
    train(tmp)
    tmp.rename(archive)                  # never a half-written archive under the real name
    print(f"class-data archive {archive} ({archive.stat().st_size >> 20} MiB) in "
          f"{time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
