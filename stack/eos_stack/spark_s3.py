"""Hadoop's S3A connector for the installed PySpark (no daemon): jars resolved by Maven.

The list is ``stack/spark/s3a/pom.xml`` (the image's too: the Dockerfile resolves the same pom): hadoop-aws,
the AWS SDK v2 modules S3A uses (not the SDK's 654 MiB ``bundle``), and spark-hadoop-cloud. Every version is
derived here and given to Maven, nothing is pinned in this module:

* ``hadoop.version``: the version of PySpark's bundled ``hadoop-client-api-<H>.jar`` (S3A must match the
  Hadoop it plugs into); hadoop-aws brings ``analyticsaccelerator-s3`` (Hadoop 3.4.2+: without it S3A fails as
  the file system starts) at the version it names;
* ``aws-sdk.version``: the ``aws-java-sdk-v2.version`` of ``org.apache.hadoop:hadoop-project:<H>``'s pom;
* ``spark-hadoop-cloud.version`` (Spark's ``AbortableStreamBasedCheckpointFileManager`` and cloud commit
  protocol): PySpark's version, or, when Maven Central lacks it (4.2.0 is absent), the newest earlier release
  of the same major version, with a warning.

Maven resolves them once (its repository in the stack cache) into ``<cache>/spark-s3a-<H>/<pyspark>-<pom
digest>/jars``; what it resolved is kept in ``resolved.json`` beside them, so later runs need no network, and
a change of the pom resolves again. A resolved jar that PySpark's ``jars/`` already ships fails the
resolution (the pom must leave it out: a second copy of a library on the class path causes hard-to-read
linkage errors). The paths go to jobs as ``SPARK_S3_JARS``.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

from .common import REPO, Stack, StackError, log
from .maven import maven_copy_dependencies
from .pyspark_install import bundled_jar, pyspark_jars_dir, pyspark_version

POM = REPO / "stack" / "spark" / "s3a" / "pom.xml"
POM_NS = {"m": "http://maven.apache.org/POM/4.0.0"}
# The pom's properties this module derives (the rest of its properties are Maven's own settings).
VERSION_PROPERTIES = ("hadoop.version", "aws-sdk.version", "spark-hadoop-cloud.version")
CENTRAL = os.environ.get("EOS_MAVEN_CENTRAL", "https://repo1.maven.org/maven2").rstrip("/")
PROGRESS_EVERY = 100 << 20
CHUNK = 1 << 20


class NotOnCentral(StackError):
    """Maven Central answered 404."""


def hadoop_version() -> str:
    found = [m.group(1) for p in pyspark_jars_dir().glob("hadoop-client-api-*.jar")
             if (m := re.fullmatch(r"hadoop-client-api-(\d[^/]*)\.jar", p.name))]
    if len(found) != 1:
        raise StackError(f"expected one hadoop-client-api-<version>.jar in {pyspark_jars_dir()}, found {found}")
    return found[0]


def pom_digest(pom: Path = POM) -> str:
    return hashlib.sha256(pom.read_bytes()).hexdigest()[:12]


def base_dir(st: Stack) -> Path:
    """Hadoop's downloads (hadoop-project's pom). Not ``spark-s3-<H>``: that held the SDK bundle of earlier
    releases, and may be deleted."""
    return st.cache / f"spark-s3a-{hadoop_version()}"


def resolution_dir(st: Stack) -> Path:
    return base_dir(st) / f"{pyspark_version()}-{pom_digest()}"


def jars_dir(st: Stack) -> Path:
    return resolution_dir(st) / "jars"


def record_file(st: Stack) -> Path:
    return resolution_dir(st) / "resolved.json"


def pom_properties(pom: Path = POM) -> dict[str, str]:
    """The ``<properties>`` of a pom file: for :data:`POM`, the versions the image resolves with."""
    props = ET.parse(pom).getroot().find("m:properties", POM_NS)
    return {el.tag.split("}", 1)[1]: (el.text or "").strip() for el in (props if props is not None else [])}


# -- Maven Central ---------------------------------------------------------------
def _url(group: str, artifact: str, version: str, ext: str) -> str:
    return f"{CENTRAL}/{group.replace('.', '/')}/{artifact}/{version}/{artifact}-{version}.{ext}"


def _get(url: str, what: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=60) as resp:
            return resp.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise NotOnCentral(f"{what} is not on Maven Central ({url}: 404)") from None
        raise StackError(f"downloading {what} from {url} failed: HTTP {exc.code} "
                         "(is Maven Central reachable?)") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise StackError(f"downloading {what} from {url} failed: {exc} (is Maven Central reachable?)") from exc


def _sha1_of(url: str, what: str) -> str:
    text = _get(url + ".sha1", f"the checksum of {what}").decode().strip()
    digest = text.split()[0].lower() if text else ""
    if not re.fullmatch(r"[0-9a-f]{40}", digest):
        raise StackError(f"{url}.sha1 is not a SHA-1 checksum: {text[:80]!r}")
    return digest


def download(url: str, dest: Path, what: str) -> Path:
    """``url`` to ``dest``, verified against ``url.sha1``: written to a temporary name, renamed when complete
    and verified (a truncated or corrupt download never takes the final name)."""
    expected = _sha1_of(url, what)
    part = dest.with_name(f"{dest.name}.{os.getpid()}.part")  # two concurrent `up`s never share one
    sha, done, next_report, t0 = hashlib.sha1(), 0, PROGRESS_EVERY, time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=60) as resp, open(part, "wb") as out:
            total = int(resp.headers.get("Content-Length") or 0)
            if total > PROGRESS_EVERY:
                log(f"downloading {what} ({total >> 20} MiB) from Maven Central")
            while chunk := resp.read(CHUNK):
                out.write(chunk)
                sha.update(chunk)
                done += len(chunk)
                if done >= next_report and total > PROGRESS_EVERY:
                    rate = (done >> 20) / max(time.monotonic() - t0, 1e-3)
                    log(f"  {what}: {done >> 20} of {total >> 20} MiB ({rate:.0f} MiB/s)")
                    next_report += PROGRESS_EVERY
        if sha.hexdigest() != expected:
            raise StackError(f"{what}: SHA-1 {sha.hexdigest()} does not match Maven Central's {expected} ({url})")
        part.replace(dest)
    except (urllib.error.URLError, OSError) as exc:
        raise StackError(f"downloading {what} from {url} failed: {exc} (is Maven Central reachable?)") from exc
    finally:
        part.unlink(missing_ok=True)
    size = f"{done >> 20} MiB" if done >= 1 << 20 else f"{done >> 10} KiB"
    log(f"{what}: {size} in {time.monotonic() - t0:.1f}s, SHA-1 verified")
    return dest


def _exists(group: str, artifact: str, version: str) -> bool:
    try:
        _sha1_of(_url(group, artifact, version, "jar"), f"{artifact} {version}")
        return True
    except NotOnCentral:
        return False


def _vkey(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v))


def hadoop_project_properties(st: Stack, hadoop: str) -> dict[str, str]:
    """The ``<properties>`` of ``org.apache.hadoop:hadoop-project:<hadoop>``'s pom (downloaded once)."""
    pom = base_dir(st) / f"hadoop-project-{hadoop}.pom"
    if not pom.is_file():
        pom.parent.mkdir(parents=True, exist_ok=True)
        download(_url("org.apache.hadoop", "hadoop-project", hadoop, "pom"), pom, f"hadoop-project {hadoop} pom")
    return pom_properties(pom)


def hadoop_cloud_version(pyspark: str) -> str:
    """PySpark's version if spark-hadoop-cloud_2.13 has it on Maven Central, else the newest earlier
    release of the same major version (Spark does not publish the module for every release)."""
    override = os.environ.get("EOS_SPARK_HADOOP_CLOUD_VERSION")
    if override:
        return override
    group, artifact = "org.apache.spark", "spark-hadoop-cloud_2.13"
    if _exists(group, artifact, pyspark):
        return pyspark
    meta = _get(f"{CENTRAL}/{group.replace('.', '/')}/{artifact}/maven-metadata.xml", f"{artifact} versions")
    versions = [v.text for v in ET.fromstring(meta).iter("version") if v.text and re.fullmatch(r"[\d.]+", v.text)]
    older = sorted((v for v in versions if v.split(".")[0] == pyspark.split(".")[0] and _vkey(v) < _vkey(pyspark)),
                   key=_vkey)
    if not older:
        raise StackError(f"{artifact} {pyspark} is not on Maven Central and no earlier {pyspark.split('.')[0]}.x "
                         f"release is (versions: {versions}); set EOS_SPARK_HADOOP_CLOUD_VERSION")
    log(f"WARNING: {artifact} {pyspark} is not on Maven Central; using {older[-1]} with pyspark {pyspark}")
    return older[-1]


# -- the jars --------------------------------------------------------------------
def versions(st: Stack) -> dict[str, str]:
    """The pom's version properties for this PySpark (:data:`VERSION_PROPERTIES`); needs Maven Central the
    first time (hadoop-project's pom, spark-hadoop-cloud's releases)."""
    hadoop = hadoop_version()
    sdk = hadoop_project_properties(st, hadoop).get("aws-java-sdk-v2.version")
    if not sdk:
        raise StackError(f"hadoop-project {hadoop}'s pom has no aws-java-sdk-v2.version: S3A of Hadoop "
                         "before 3.4 (AWS SDK v1) is not supported")
    return {"hadoop.version": hadoop, "aws-sdk.version": sdk,
            "spark-hadoop-cloud.version": hadoop_cloud_version(pyspark_version())}


def resolve(st: Stack, props: dict[str, str], out: Path, pom: Path = POM) -> list[dict[str, str]]:
    """Maven resolves ``pom`` with ``props`` into ``out`` (flat); returns the artifacts (group, artifact,
    version, file). Fails if a jar is one PySpark ships."""
    layout = maven_copy_dependencies(st, pom, props, out.parent / "maven", what="the S3A jars",
                                     repository_layout=True)
    bundled = sorted(p.name for p in pyspark_jars_dir().glob("*.jar"))
    artifacts, dups = [], []
    for jar in sorted(layout.rglob("*.jar")):
        version_dir = jar.parent   # <group path>/<artifactId>/<version>/<file>.jar
        artifact, version = version_dir.parent.name, version_dir.name
        group = ".".join(version_dir.parent.parent.relative_to(layout).parts)
        if dup := bundled_jar(artifact, bundled):
            dups.append(f"{group}:{artifact}:{version} (pyspark has {dup})")
        artifacts.append({"group": group, "artifact": artifact, "version": version, "file": jar.name})
    if dups:
        shutil.rmtree(layout, ignore_errors=True)
        raise StackError(f"{pom} resolves jars PySpark already ships: {', '.join(dups)}; leave "
                         "them out there (its excludeGroupIds, or an exclusion), checking that PySpark's "
                         "version serves the SDK")
    names = [a["file"] for a in artifacts]
    if len(set(names)) != len(names):
        raise StackError(f"two of the S3A jars have the same file name: {sorted(names)}")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for a in artifacts:
        shutil.copy2(next(layout.rglob(a["file"])), tmp / a["file"])
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    shutil.rmtree(layout, ignore_errors=True)
    return artifacts


def recorded(st: Stack) -> list[dict[str, str]] | None:
    rf = record_file(st)
    if not rf.is_file():
        return None
    artifacts = json.loads(rf.read_text())["artifacts"]
    return artifacts if all((jars_dir(st) / a["file"]).is_file() for a in artifacts) else None


def ensure_jars(st: Stack) -> list[Path]:
    artifacts = recorded(st)
    if artifacts is None:
        t0 = time.monotonic()
        props = versions(st)
        artifacts = resolve(st, props, jars_dir(st))
        rf = record_file(st)
        tmp = rf.with_name(f"{rf.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"pyspark": pyspark_version(), "hadoop": props["hadoop.version"],
                                   "properties": props, "pom": pom_digest(), "artifacts": artifacts}, indent=1))
        tmp.replace(rf)
        size = sum((jars_dir(st) / a["file"]).stat().st_size for a in artifacts)
        log(f"S3A jars ready in {time.monotonic() - t0:.0f}s: {len(artifacts)} jars, {size >> 20} MiB ("
            + ", ".join(f"{k} {v}" for k, v in props.items()) + ")")
    return [jars_dir(st) / a["file"] for a in artifacts]


def recorded_properties(st: Stack) -> dict[str, str] | None:
    """The version properties the recorded resolution used, or None before the first."""
    rf = record_file(st)
    return json.loads(rf.read_text())["properties"] if rf.is_file() else None


def status_detail(st: Stack) -> str | None:
    """A one-line summary of the S3A jars, or None when they are not resolved yet."""
    try:
        artifacts = recorded(st)
    except StackError:
        return None
    if artifacts is None:
        return None
    size = sum((jars_dir(st) / a["file"]).stat().st_size for a in artifacts)
    props = recorded_properties(st) or {}
    return (f"S3A: {len(artifacts)} jars, hadoop-aws {props.get('hadoop.version')}, AWS SDK "
            f"{props.get('aws-sdk.version')} modules ({size >> 20} MiB in {jars_dir(st)})")
