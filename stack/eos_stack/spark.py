"""Spark's Kafka connector jars for the installed PySpark (no daemon).

Spark runs in local mode inside the job's own Python process; the only thing the
stack provides is ``spark-sql-kafka-0-10`` and the runtime dependencies PySpark's
own ``jars/`` folder lacks (kafka-clients, spark-token-provider-kafka-0-10,
commons-pool2). They are resolved once by Maven from ``stack/spark/pom.xml`` into
``<cache>/spark-kafka-<version>/jars`` and handed to jobs as local paths in
``SPARK_JARS`` (``spark.jars``), so nothing is downloaded when a job starts.

Hadoop's S3A connector (hadoop-aws, the AWS SDK modules it uses, analyticsaccelerator-s3,
spark-hadoop-cloud) comes from :mod:`eos_stack.spark_s3` as ``SPARK_S3_JARS``.

It also makes a class-data-sharing archive of Spark's classes for this JVM and
PySpark (``eos_job.cds``; ``EOS_SPARK_CDS_ARCHIVE``), which halves a driver's
cold start.

Jars PySpark already ships (spark-core, spark-tags, scala-library, hadoop-client,
snappy, lz4, slf4j, ...) are dropped whatever their version: a second copy of
those on the classpath causes hard-to-read linkage errors.

Connector version: the installed PySpark's, unless ``EOS_SPARK_KAFKA_VERSION``
overrides it or :data:`CONNECTOR_FALLBACK` names a substitute because that
version was never published to Maven Central.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import slot_writer, spark_s3
from .pyspark_install import bundled_jar, pyspark_jars_dir, pyspark_version
from .common import REPO, Stack, StackError, keep_newest, log
from .maven import maven_copy_dependencies

POM = REPO / "stack" / "spark" / "pom.xml"

# PySpark versions whose spark-sql-kafka-0-10_2.13 is not on Maven Central, and the
# nearest earlier connector that is. Checked 2026-11: Central's maven-metadata for
# the connector lists 4.2.0 as the newest release; 4.3.0 (on PyPI) is absent.
CONNECTOR_FALLBACK = {"4.3.0": "4.2.0"}


def connector_version() -> str:
    override = os.environ.get("EOS_SPARK_KAFKA_VERSION")
    if override:
        return override
    v = pyspark_version()
    return CONNECTOR_FALLBACK.get(v, v)


def jars_dir(st: Stack) -> Path:
    return st.cache / f"spark-kafka-{connector_version()}" / "jars"


def ensure_jars(st: Stack) -> list[Path]:
    out = jars_dir(st)
    if not (out.is_dir() and any(out.glob("*.jar"))):
        ver = connector_version()
        if ver != pyspark_version():
            log(f"WARNING: spark-sql-kafka-0-10 {pyspark_version()} is not on Maven Central; "
                f"using connector {ver} with pyspark {pyspark_version()}")
        bundled = sorted(p.name for p in pyspark_jars_dir().glob("*.jar"))
        resolved = maven_copy_dependencies(
            st, POM, {"spark.version": ver}, st.cache / f"spark-kafka-{ver}" / "resolved",
            what=f"spark-sql-kafka-0-10 {ver}", repository_layout=True)
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        kept, dropped = [], []
        for jar in sorted(resolved.rglob("*.jar")):
            artifact_id = jar.parent.parent.name  # <group path>/<artifactId>/<version>/<file>.jar
            dup = bundled_jar(artifact_id, bundled)
            if dup:
                dropped.append(f"{jar.name} (pyspark has {dup})")
            else:
                shutil.copy2(jar, tmp / jar.name)
                kept.append(jar.name)
        (tmp.parent / "MANIFEST.txt").write_text(
            f"spark-sql-kafka-0-10 {ver} for pyspark {pyspark_version()}\n\nkept:\n"
            + "".join(f"  {k}\n" for k in kept) + "\ndropped (already in pyspark/jars):\n"
            + "".join(f"  {d}\n" for d in dropped))
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
        log(f"Spark Kafka connector jars: {', '.join(kept)}")
    jars = sorted(out.glob("*.jar"))
    if not any(j.name.startswith("spark-sql-kafka-0-10") for j in jars):
        raise StackError(f"{out} has no spark-sql-kafka-0-10 jar; delete the folder and run `up spark` again")
    return jars


def cds_archive(st: Stack) -> Path:
    """Where the class-data archive for this JVM and this PySpark installation goes: the archive is valid
    only for the exact class path (PySpark's jars, by path, size and time) and JVM it was made with."""
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    jars = sorted(pyspark_jars_dir().glob("*.jar"))
    key = hashlib.sha256("\n".join([java, pyspark_version(), str(pyspark_jars_dir()),
                                     *(f"{j.name} {j.stat().st_size} {j.stat().st_mtime_ns}" for j in jars)])
                         .encode()).hexdigest()[:16]
    return st.cache / "spark-cds" / f"spark-{pyspark_version()}-{key}.jsa"


def ensure_cds_archive(st: Stack, jars: list[Path]) -> Path:
    """The archive of Spark's classes (``eos_job.cds``), made by a training run the first time (about 40 s)."""
    archive = cds_archive(st)
    if archive.is_file():
        return archive
    log(f"making Spark's class-data archive {archive.name} with a training run (first run only, about 40 s)")
    started = time.monotonic()
    out = st.dir("logs") / "spark-cds.log"
    env = {**os.environ, "SPARK_JARS": ",".join(str(j) for j in jars),
           "PYTHONPATH": os.pathsep.join([str(REPO / "jobs"), str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("EOS_SPARK_CDS_ARCHIVE", None)
    with open(out, "wb") as f:
        proc = subprocess.run([sys.executable, "-m", "eos_job.cds", str(archive)], env=env, stdout=f,
                              stderr=subprocess.STDOUT, cwd=str(REPO), timeout=600)
    if proc.returncode != 0 or not archive.is_file():
        raise StackError(f"the training run for Spark's class-data archive failed (exit {proc.returncode}); "
                         f"see {out}")
    log(f"class-data archive ready in {time.monotonic() - started:.0f}s ({archive.stat().st_size >> 20} MiB)")
    # Each is ~150 MiB and another PySpark path (another clone) makes another: keep the newest three.
    keep_newest(archive.parent.glob("*.jsa"))
    return archive


def up(st: Stack) -> dict[str, str]:
    jars = ensure_jars(st)
    s3a = spark_s3.ensure_jars(st)
    return {"SPARK_JARS": ",".join(str(j) for j in jars), "SPARK_KAFKA_VERSION": connector_version(),
            "SPARK_S3_JARS": ",".join(str(j) for j in s3a),
            slot_writer.ENV: str(slot_writer.ensure_jar(st, jars)),
            "EOS_SPARK_CDS_ARCHIVE": str(ensure_cds_archive(st, jars))}


def down(st: Stack, purge: bool = False) -> None:
    # Nothing runs; the jars and the class-data archive are a cache (kept even with purge, like Kafka's jars).
    if purge:
        st.drop_env(["SPARK_JARS", "SPARK_KAFKA_VERSION", "SPARK_S3_JARS", "EOS_SPARK_CDS_ARCHIVE", slot_writer.ENV])


def status(st: Stack) -> tuple[str, str]:
    try:
        out = jars_dir(st)
    except StackError as exc:
        return "missing", str(exc)
    jars = sorted(out.glob("*.jar")) if out.is_dir() else []
    if not jars:
        return "missing", f"connector jars not resolved ({out})"
    s3a = spark_s3.status_detail(st)
    if s3a is None:
        return "missing", f"S3A jars not downloaded ({spark_s3.jars_dir(st)})"
    return "ready", f"spark-sql-kafka-0-10 {connector_version()}: {len(jars)} jars in {out}; {s3a}"
