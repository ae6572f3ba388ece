"""The JVM slot writer's jar (``jvm/slot-writer``, issue 29 part 2), built from source by Maven into the cache.

Keyed by a digest of the module's sources, the golden vectors its test reads, the installed PySpark's version
and the Kafka client version the Spark connector ships: ``<cache>/slot-writer/<key>/eos-slot-writer.jar``.
An up-to-date jar is never rebuilt (no Maven run at all); a change of any of those builds again. The build
(``mvn package``) runs in a copy of the module under the cache, so the work tree gets no ``target/``; it compiles
against kafka-clients (Maven's repository in the cache, ``<cache>/m2``) and PySpark's own Spark, Scala and
Jackson jars (system scope), and runs the JUnit golden-vector test, so a jar whose protocol pieces drifted from
the Python reference is never made. The path goes to jobs as ``EOS_SLOT_WRITER_JAR`` (``spark.jars``).
"""
from __future__ import annotations

import hashlib
import shutil
import time
from pathlib import Path

from .common import REPO, Stack, StackError, keep_newest, log, require_tool, run
from .maven import JAVA_HINT, MVN_HINT
from .pyspark_install import pyspark_jars_dir, pyspark_version

MODULE = REPO / "jvm" / "slot-writer"
VECTORS = REPO / "tests" / "conformance" / "vectors.json"
JAR = "eos-slot-writer.jar"
ENV = "EOS_SLOT_WRITER_JAR"


def sources_key(kafka_version: str) -> str:
    h = hashlib.sha256()
    for p in sorted([*MODULE.rglob("*.java"), MODULE / "pom.xml", VECTORS]):
        h.update(str(p.relative_to(REPO)).encode() + b"\0" + p.read_bytes() + b"\0")
    h.update(f"pyspark {pyspark_version()} kafka-clients {kafka_version}".encode())
    return h.hexdigest()[:16]


def jar_path(st: Stack, kafka_version: str) -> Path:
    return st.cache / "slot-writer" / sources_key(kafka_version) / JAR


def _jar_version(jars: Path, prefix: str) -> str:
    found = [p.name[len(prefix):-len(".jar")] for p in jars.glob(f"{prefix}*.jar")
             if p.name[len(prefix):][:1].isdigit()]
    if len(found) != 1:
        raise StackError(f"expected one {prefix}<version>.jar in {jars}, found {found}")
    return found[0]


def ensure_jar(st: Stack, kafka_jars: list[Path]) -> Path:
    """The writer's jar for this PySpark and the connector's kafka-clients (``kafka_jars``: SPARK_JARS)."""
    clients = [p for p in kafka_jars if p.name.startswith("kafka-clients-")]
    if len(clients) != 1:
        raise StackError(f"expected one kafka-clients jar among the connector's jars, found {clients}")
    kafka_version = clients[0].name[len("kafka-clients-"):-len(".jar")]
    jar = jar_path(st, kafka_version)
    if jar.is_file():
        return jar
    mvn = require_tool("mvn", MVN_HINT)
    require_tool("java", JAVA_HINT)
    pyjars = pyspark_jars_dir()
    build = jar.parent / "build"
    shutil.rmtree(build, ignore_errors=True)
    shutil.copytree(MODULE, build, ignore=shutil.ignore_patterns("target"))
    t0 = time.monotonic()
    log("building the JVM slot writer with Maven (once per change of its sources)")
    run([mvn, "-B", "-q", "-f", str(build / "pom.xml"), f"-Dmaven.repo.local={st.cache_dir('m2', 'repository')}",
         f"-Dpyspark.jars={pyjars}", f"-Dspark.version={pyspark_version()}", f"-Dkafka.version={kafka_version}",
         f"-Dscala.version={_jar_version(pyjars, 'scala-library-')}",
         f"-Djackson.version={_jar_version(pyjars, 'jackson-databind-')}",
         f"-Djackson-annotations.version={_jar_version(pyjars, 'jackson-annotations-')}",
         f"-Deos.vectors={VECTORS}", "package"],
        what="building the JVM slot writer (jvm/slot-writer; its golden-vector test included)", timeout=900)
    built = build / "target" / "eos-slot-writer-0.jar"
    tmp = jar.with_name(f"{JAR}.tmp")
    shutil.copy2(built, tmp)
    tmp.replace(jar)
    shutil.rmtree(build, ignore_errors=True)
    log(f"JVM slot writer built in {time.monotonic() - t0:.1f}s: {jar}")
    # Each source change makes another (about 40 KiB): keep the newest three, as the class-data archives, and
    # always the one the running stack names (another checkout's build, a test's, must not pull it from under it).
    in_use = Path(st.read_env().get(ENV, "")).parent
    keep_newest([p for p in jar.parent.parent.iterdir() if (p / JAR).is_file() and p != in_use],
                mtime=lambda p: (p / JAR).stat().st_mtime)
    return jar
