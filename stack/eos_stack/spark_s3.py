"""Hadoop's S3A connector for the installed PySpark (no daemon): jars downloaded from Maven Central.

Every version is derived, nothing is pinned here:

* ``org.apache.hadoop:hadoop-aws:<H>``, H the version of PySpark's bundled
  ``hadoop-client-api-<H>.jar`` (S3A must match the Hadoop it plugs into);
* ``software.amazon.awssdk:bundle:<V>`` (~690 MB), V the ``aws-java-sdk-v2.version``
  of ``org.apache.hadoop:hadoop-project:<H>``'s pom;
* ``software.amazon.s3.analyticsaccelerator:analyticsaccelerator-s3`` at that pom's
  ``amazon-s3-analyticsaccelerator-s3.version`` (Hadoop 3.4.2+; a compile dependency
  of hadoop-aws): without it S3A fails as the file system starts
  (``NoClassDefFoundError: .../analyticsaccelerator/request/ObjectClient``);
* ``org.apache.spark:spark-hadoop-cloud_2.13`` (Spark's
  ``AbortableStreamBasedCheckpointFileManager`` and cloud commit protocol) at
  PySpark's version, or, when Maven Central lacks that version (4.2.0 is absent),
  the newest earlier release of the same major version, with a warning.

Each jar is checked against Maven Central's ``.sha1``, downloaded to a temporary
name and renamed when complete, into ``<cache>/spark-s3-<H>/jars``; what was chosen
is kept in ``resolved-<pyspark version>.json`` there, so later runs need no network.
The paths go to jobs as ``SPARK_S3_JARS``.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

from .common import Stack, StackError, log
from .pyspark_install import pyspark_jars_dir, pyspark_version

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


def base_dir(st: Stack) -> Path:
    return st.cache / f"spark-s3-{hadoop_version()}"


def jars_dir(st: Stack) -> Path:
    return base_dir(st) / "jars"


def record_file(st: Stack) -> Path:
    return base_dir(st) / f"resolved-{pyspark_version()}.json"


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
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    props = ET.parse(pom).getroot().find("m:properties", ns)
    return {el.tag.split("}", 1)[1]: (el.text or "").strip() for el in (props if props is not None else [])}


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
def resolve(st: Stack) -> list[dict[str, str]]:
    """The artifacts (group, artifact, version, file) for this PySpark; needs Maven Central."""
    hadoop = hadoop_version()
    props = hadoop_project_properties(st, hadoop)
    sdk = props.get("aws-java-sdk-v2.version")
    if not sdk:
        raise StackError(f"hadoop-project {hadoop}'s pom has no aws-java-sdk-v2.version: S3A of Hadoop "
                         "before 3.4 (AWS SDK v1) is not supported")
    coords = [("org.apache.hadoop", "hadoop-aws", hadoop), ("software.amazon.awssdk", "bundle", sdk)]
    if props.get("amazon-s3-analyticsaccelerator-s3.version"):
        coords.append(("software.amazon.s3.analyticsaccelerator", "analyticsaccelerator-s3",
                       props["amazon-s3-analyticsaccelerator-s3.version"]))
    coords.append(("org.apache.spark", "spark-hadoop-cloud_2.13", hadoop_cloud_version(pyspark_version())))
    return [{"group": g, "artifact": a, "version": v, "file": f"{a}-{v}.jar"} for g, a, v in coords]


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
        artifacts = resolve(st)
        out = jars_dir(st)
        out.mkdir(parents=True, exist_ok=True)
        for a in artifacts:
            dest = out / a["file"]
            if not dest.is_file():
                download(_url(a["group"], a["artifact"], a["version"], "jar"), dest, f"{a['artifact']} {a['version']}")
            rf = record_file(st)
        tmp = rf.with_name(f"{rf.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"pyspark": pyspark_version(), "hadoop": hadoop_version(),
                                   "artifacts": artifacts}, indent=1))
        tmp.replace(rf)
        log(f"S3A jars ready in {time.monotonic() - t0:.0f}s: "
            + ", ".join(f"{a['artifact']} {a['version']}" for a in artifacts))
    return [jars_dir(st) / a["file"] for a in artifacts]


def status_detail(st: Stack) -> str | None:
    """A one-line summary of the S3A jars, or None when they are not downloaded yet."""
    try:
        artifacts = recorded(st)
    except StackError:
        return None
    if artifacts is None:
        return None
    size = sum((jars_dir(st) / a["file"]).stat().st_size for a in artifacts)
    return (f"S3A: {', '.join(a['artifact'] + ' ' + a['version'] for a in artifacts)} "
            f"({size >> 20} MiB in {jars_dir(st)})")
