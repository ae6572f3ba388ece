"""The S3A jars the stack provides (``SPARK_S3_JARS``, resolved from ``stack/spark/s3a/pom.xml``): hadoop-aws of
PySpark's Hadoop, the AWS SDK modules of that Hadoop's SDK version (not the SDK's 654 MiB bundle), no second copy
of a library PySpark ships, and every class they use there, on PySpark's class path, but the optional features
named in ``KNOWN_ABSENT``. The class check (``jdeps``, the JDK's class-dependency tool) is shown to see a
missing jar: the same check without two of the jars reports their classes. And S3A runs with them (no Spark: a
JVM with PySpark's jars and these), through the SDK's sync and async (Netty) clients."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
import zipfile
from pathlib import Path

import pytest

from eos_stack import spark_s3
from eos_stack.common import Stack, StackError
from eos_stack.pyspark_install import bundled_jar, pyspark_jars_dir

# Classes hadoop-aws, analyticsaccelerator-s3 or an SDK module refers to that nothing here provides, each for a
# feature this project does not use (all but the last three are missing with the SDK bundle too).
KNOWN_ABSENT = {
    "software.amazon.awssdk.crt.": "AWS CRT, the SDK's optional native HTTP client and signer",
    "org.apache.hc.": "httpclient 5, in analyticsaccelerator-s3's optional code",
    "software.amazon.s3.shaded.com.google.errorprone.": "an annotation of analyticsaccelerator-s3",
    "software.amazon.encryption.s3.": "S3A's client-side encryption (amazon-s3-encryption-client-java)",
    "com.amazonaws.": "AWS SDK v1: S3A's adapter for v1 credential providers",
    "software.amazon.awssdk.services.kms.": "the KMS client: client-side encryption only",
    "software.amazon.awssdk.s3accessgrants.": "S3 Access Grants (fs.s3a.s3accessgrants.enabled)",
    "software.amazon.awssdk.thirdparty.org.apache.http.":
        "the bundle's shaded httpclient: fs.s3a.ssl.channel.mode's socket factory, skipped by S3A without it",
}
SDK_MODULES = ("s3", "s3-transfer-manager", "sts", "apache-client", "netty-nio-client", "sdk-core", "aws-core",
               "auth", "regions", "http-client-spi")
MAX_MIB = 40   # the bundle alone was 654 MiB
ROUND_TRIP = Path(__file__).with_name("s3a") / "S3ARoundTrip.java"


@pytest.fixture(scope="module")
def jars(stack_env) -> list[Path]:
    if not stack_env.get("SPARK_S3_JARS"):
        pytest.fail("the local stack started but .stack/env has no SPARK_S3_JARS", pytrace=False)
    return [Path(p) for p in stack_env["SPARK_S3_JARS"].split(",")]


def by_artifact(jars: list[Path]) -> dict[str, Path]:
    return {re.fullmatch(r"(.+?)-(\d[^-]*)\.jar", j.name).group(1): j for j in jars}


def test_s3a_jars_match_pysparks_hadoop(jars):
    missing = [j for j in jars if not j.is_file()]
    assert not missing, f"SPARK_S3_JARS lists files that do not exist: {missing}"
    found = by_artifact(jars)
    assert "bundle" not in found, "the AWS SDK bundle is back: the pom resolves the SDK's modules instead"

    hadoop = spark_s3.hadoop_version()
    assert found["hadoop-aws"].name == f"hadoop-aws-{hadoop}.jar"
    # The AWS SDK is the one this Hadoop release was built and tested with (its hadoop-project pom).
    sdk = spark_s3.hadoop_project_properties(Stack(), hadoop)["aws-java-sdk-v2.version"]
    assert {m: found[m].name for m in SDK_MODULES if m in found} == {m: f"{m}-{sdk}.jar" for m in SDK_MODULES}

    expected_classes = {
        "hadoop-aws": "org/apache/hadoop/fs/s3a/S3AFileSystem.class",
        "s3": "software/amazon/awssdk/services/s3/S3Client.class",
        "sts": "software/amazon/awssdk/services/sts/StsClient.class",
        "s3-transfer-manager": "software/amazon/awssdk/transfer/s3/S3TransferManager.class",
        "spark-hadoop-cloud_2.13": "org/apache/spark/internal/io/cloud/AbortableStreamBasedCheckpointFileManager.class",
    }
    if "amazon-s3-analyticsaccelerator-s3.version" in spark_s3.hadoop_project_properties(Stack(), hadoop):
        # A compile dependency of hadoop-aws 3.4.2+: S3A does not start without it.
        expected_classes["analyticsaccelerator-s3"] = "software/amazon/s3/analyticsaccelerator/request/Constants.class"
    for artifact, cls in expected_classes.items():
        assert artifact in found, f"no {artifact} jar among {sorted(found)}"
        with zipfile.ZipFile(found[artifact]) as z:
            assert cls in z.namelist(), f"{found[artifact]} has no {cls}"

    bundled = sorted(p.name for p in pyspark_jars_dir().glob("*.jar"))
    dups = {a: d for a in found if (d := bundled_jar(a, bundled))}
    assert not dups, f"S3A jars that PySpark ships already: {dups}"
    size = sum(j.stat().st_size for j in jars)
    assert size < MAX_MIB << 20, f"the S3A jars are {size >> 20} MiB"

    record = json.loads(spark_s3.record_file(Stack()).read_text())
    assert record["hadoop"] == hadoop and record["properties"]["aws-sdk.version"] == sdk
    assert sorted(a["file"] for a in record["artifacts"]) == sorted(j.name for j in jars)


def missing_classes(jars: list[Path], analysed: list[Path] | None = None) -> dict[str, set[str]]:
    """Each class the ``analysed`` jars (default: all of ``jars``) refer to that neither ``jars`` nor PySpark's
    jars hold (``jdeps``), by jar name."""
    jdeps = shutil.which("jdeps")
    if not jdeps:
        pytest.fail("jdeps (the JDK's) is not installed: apt-get install openjdk-17-jdk-headless", pytrace=False)
    classpath = ":".join(str(p) for p in [*sorted(pyspark_jars_dir().glob("*.jar")), *jars])
    proc = subprocess.run([jdeps, "-verbose:class", "--multi-release", "17", "-cp", classpath,
                           *map(str, analysed or jars)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    missing: dict[str, set[str]] = {}
    jar = "?"
    for line in proc.stdout.splitlines():
        if not line.startswith(" "):
            jar = line.split(" ", 1)[0]
        elif m := re.search(r"->\s+(\S+)\s+not found", line):
            missing.setdefault(jar, set()).add(m.group(1))
    return missing


def unexplained(missing: dict[str, set[str]]) -> dict[str, list[str]]:
    out = {jar: sorted(c for c in classes if not c.startswith(tuple(KNOWN_ABSENT))) for jar, classes in missing.items()}
    return {jar: classes for jar, classes in out.items() if classes}


def test_every_class_the_s3a_jars_use_is_on_pysparks_class_path(jars):
    """What the pom leaves out because PySpark has it (Netty 4.2 for the SDK's 4.1, httpclient, slf4j, ...) must
    serve the SDK: no class the S3A jars refer to is missing, but the optional features of KNOWN_ABSENT.
    Negative control: the same check without apache-client and sts names their classes."""
    assert unexplained(missing_classes(jars)) == {}

    control = [j for j in jars if by_artifact([j]).keys() & {"apache-client", "sts"} == set()]
    assert len(control) == len(jars) - 2
    hadoop_aws = [j for j in jars if j.name.startswith("hadoop-aws-")]
    seen = {c for classes in unexplained(missing_classes(control, hadoop_aws)).values() for c in classes}
    assert "software.amazon.awssdk.http.apache.ApacheHttpClient" in seen, sorted(seen)[:20]
    assert "software.amazon.awssdk.services.sts.StsClient" in seen, sorted(seen)[:20]


def test_a_pom_that_keeps_what_pyspark_ships_is_refused(stack_env, tmp_path):
    """The guard behind the pom's exclusions: the same pom without its excludeGroupIds resolves Netty,
    httpclient, slf4j, ... beside PySpark's, and the resolution fails naming them (no jars folder made)."""
    text = spark_s3.POM.read_text()
    stripped = re.sub(r"\s*<excludeGroupIds>[^<]*</excludeGroupIds>", "", text)
    assert stripped != text
    pom = tmp_path / "pom.xml"
    pom.write_text(stripped)
    props = spark_s3.recorded_properties(Stack())
    assert props, "the stack has not resolved the S3A jars"
    with pytest.raises(StackError) as err:
        spark_s3.resolve(Stack(), props, tmp_path / "jars", pom=pom)
    assert "io.netty:netty-codec-http:" in str(err.value) and "org.slf4j:slf4j-api:" in str(err.value), err.value
    assert not (tmp_path / "jars").exists()


def s3a_round_trip(jars: list[Path], env: dict[str, str]) -> subprocess.CompletedProcess:
    """``S3ARoundTrip.java`` in a JVM with PySpark's jars, then ``jars``, on its class path (the order Spark's class
    loaders give them), against the stack's S3 server, under a prefix of its own."""
    java = shutil.which("java")
    assert java, "no java on PATH"
    classpath = ":".join(str(p) for p in [*sorted(pyspark_jars_dir().glob("*.jar")), *jars])
    prefix = f"/s3a-round-trip-{uuid.uuid4().hex[:8]}"
    keys = {"AWS_ACCESS_KEY_ID": env["S3_ACCESS_KEY"], "AWS_SECRET_ACCESS_KEY": env["S3_SECRET_KEY"]}
    return subprocess.run([java, "-cp", classpath, str(ROUND_TRIP), env["S3_ENDPOINT"], env["S3_BUCKET"], prefix,
                           env["S3_REGION"]], env={**os.environ, **keys}, capture_output=True, text=True, timeout=300)


def test_s3a_writes_renames_uploads_and_reads_with_the_sdk_modules(jars, stack_env):
    """S3A for real against the stack's S3 server, with these jars on PySpark's class path: a write, a rename
    (a copy), an upload of a local file (S3A's transfer manager, on the SDK's Netty client, on PySpark's Netty 4.2
    rather than the 4.1 the SDK was built with), reads and a delete. Negative control: the same run without
    netty-nio-client fails at the upload, so the upload did go through the Netty client (seen 2026-11-28: the
    rename, a plain CopyObject on the sync client, passes without it)."""
    proc = s3a_round_trip(jars, stack_env)
    out = proc.stdout
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out}\n{proc.stderr[-4000:]}"
    assert out.splitlines() == ["WROTE 11", "RENAMED false true", "READ through S3A",
                                "READ uploaded from a local file", "DELETED true"], out

    control = [j for j in jars if not j.name.startswith("netty-nio-client-")]
    assert len(control) == len(jars) - 1
    proc = s3a_round_trip(control, stack_env)
    assert proc.returncode != 0, proc.stdout
    assert proc.stdout.splitlines() == ["WROTE 11", "RENAMED false true"], (proc.stdout, proc.stderr[:3000])
