"""Jars resolved once by Maven into the stack's cache: the Kafka broker's (``eos_stack.kafka``), the Spark
Kafka connector's (``eos_stack.spark``) and Hadoop's S3A connector's (``eos_stack.spark_s3``)."""
from __future__ import annotations

import shutil
import time
from pathlib import Path

from .common import Stack, log, require_tool, run

JAVA_HINT = "Install a Java 17+ runtime (Debian: apt-get install openjdk-17-jre-headless)."
MVN_HINT = "Install Apache Maven 3.8+ (Debian: apt-get install maven); it resolves the Kafka broker's and the Spark connectors' jars once."


def maven_copy_dependencies(st: Stack, pom: Path, props: dict[str, str], out: Path, *, what: str,
                            repository_layout: bool = False) -> Path:
    """Resolve ``pom``'s runtime dependencies into ``out`` (once; atomically).

    The jars land in ``out.tmp`` first and are renamed to ``out`` only when Maven
    succeeded, so an interrupted download is never mistaken for a complete one.
    Maven's own repository lives in the stack cache too (``<cache>/m2``).
    """
    if out.is_dir() and any(out.iterdir()):
        return out
    mvn = require_tool("mvn", MVN_HINT)
    require_tool("java", JAVA_HINT)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.monotonic()
    log(f"resolving {what} with Maven (first run only)")
    argv = [mvn, "-B", "-q", "-f", str(pom), f"-Dmaven.repo.local={st.cache_dir('m2', 'repository')}",
            *(f"-D{k}={v}" for k, v in props.items()),
            "dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={tmp}"]
    if repository_layout:
        argv.append("-Dmdep.useRepositoryLayout=true")
    run(argv, what=f"resolving {what} with Maven (is Maven Central reachable?)", timeout=1800)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    log(f"resolved {what} in {time.monotonic() - t0:.1f}s")
    return out
