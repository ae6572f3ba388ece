"""The offline inputs of ``make image`` (step 4, see :mod:`eos_stack.image`) and the build context they go
into: the Python wheels of ``pyproject.toml``'s dependencies and build requirements (``pip wheel``), the
Spark Kafka connector and S3A jars of the stack's cache (checked against the versions the Dockerfile resolves),
the JVM slot writer's jar the stack builds,
the Debian packages of the final stage's ``apt-get install`` (worked out against the final base image's own
package list by the host's apt), and the context folder holding exactly what the Dockerfile reads, the
inputs hard-linked under ``docker/offline/``.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from . import slot_writer
from .common import REPO, Stack, StackError, log
from .image_common import DOCKERFILE, copied_sources, home, podman, qualified

POM = REPO / "stack" / "spark" / "pom.xml"
OFFLINE_DIR = "docker/offline"      # in the build context; the Dockerfile's RUN steps bind-mount docker/


# -- offline inputs ------------------------------------------------------------------
def link_or_copy(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.unlink(missing_ok=True)
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def python_requirements() -> list[str]:
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    return [*meta["build-system"]["requires"], *meta["project"]["dependencies"]]


def ensure_wheels(st: Stack, base_python: str) -> list[Path]:
    """Wheels of the project's dependencies and build requirements for the image's Python: once per set of
    requirements (``pip wheel`` with the project's pip cache; PyPI only the first time)."""
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if here != base_python:
        raise StackError(f"the wheels are made with this Python ({sys.executable}, {here}) for the image's "
                         f"Python {base_python}: run `make image` (the project's {base_python} venv)")
    reqs = python_requirements()
    key = hashlib.sha256(json.dumps([reqs, here, sys.platform, os.uname().machine]).encode()).hexdigest()[:12]
    root = home(st) / "wheels"
    out = root / key
    if not (out / ".complete").is_file():
        t0 = time.monotonic()
        log(f"making wheels of {len(reqs)} requirements for the image (pip wheel; from the pip cache when it has them)")
        tmp = root / f"{key}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check",
                               "--wheel-dir", str(tmp), *reqs], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=3600)
        if proc.returncode != 0:
            raise StackError(f"pip wheel failed (exit {proc.returncode}; is PyPI reachable?):\n{proc.stdout[-3000:]}")
        (tmp / ".complete").write_text("\n".join(reqs) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
        size = sum(p.stat().st_size for p in out.glob("*.whl"))
        log(f"{len(list(out.glob('*.whl')))} wheels ({size >> 20} MiB) in {time.monotonic() - t0:.0f}s")
    for old in root.iterdir():          # one set is kept: the disk is small
        if old != out:
            shutil.rmtree(old, ignore_errors=True)
    return sorted(out.glob("*.whl"))


def pom_spark_version() -> str:
    m = re.search(r"<spark\.version>([^<]+)</spark\.version>", POM.read_text())
    if not m:
        raise StackError(f"{POM} names no spark.version")
    return m[1]


def ensure_jars(st: Stack) -> tuple[list[Path], list[Path]]:
    """The Kafka connector and S3A jars of the stack's cache (fetched by the stack first if missing), checked to
    be the versions the Dockerfile resolves (its poms' defaults)."""
    from . import spark, spark_s3

    if spark.connector_version() != pom_spark_version():
        raise StackError(f"the stack's Spark Kafka connector is {spark.connector_version()} (for pyspark "
                         f"{spark.pyspark_version()}), the Dockerfile's {POM.relative_to(REPO)} pins "
                         f"{pom_spark_version()}: make them agree")
    kafka = spark.ensure_jars(st)
    s3 = spark_s3.ensure_jars(st)
    derived = spark_s3.recorded_properties(st) or spark_s3.versions(st)
    pinned = {k: v for k, v in spark_s3.pom_properties().items() if k in spark_s3.VERSION_PROPERTIES}
    if derived != pinned:
        raise StackError(f"the stack's S3A jars are resolved with {derived} (derived from pyspark "
                         f"{spark.pyspark_version()}), the defaults of the Dockerfile's "
                         f"{spark_s3.POM.relative_to(REPO)} are {pinned}: make them agree")
    return kafka, s3


def ensure_slot_writer(st: Stack, kafka_jars: list[Path]) -> Path:
    """The JVM slot writer's jar the stack builds (:mod:`eos_stack.slot_writer`; nothing is built when the stack
    already has it for these sources and versions), for the Dockerfile's ``slotwriter`` stage."""
    return slot_writer.ensure_jar(st, kafka_jars)


def add_slot_writer(ctx: Path, jar: Path) -> str:
    """The jar into the context's ``docker/offline/slotwriter``; returns a digest of its bytes, the value of the
    ``SLOT_WRITER`` build argument (apart from OFFLINE's: a change of the writer rebuilds only its stage and the
    one layer that copies it, not the Python environment)."""
    link_or_copy(jar, ctx / OFFLINE_DIR / "slotwriter" / slot_writer.JAR)
    return hashlib.sha256(jar.read_bytes()).hexdigest()[:16]


def dpkg_status_of(st: Stack, ref: str) -> str:
    mount = podman(st, "image", "mount", ref).stdout.strip()
    try:
        return (Path(mount) / "var" / "lib" / "dpkg" / "status").read_text()
    finally:
        podman(st, "image", "unmount", ref, check=False)


def ensure_debs(st: Stack, base: str, packages: list[str]) -> list[Path]:
    """The .deb files ``apt-get install packages`` would add to image ``base``: worked out by this machine's apt
    against the base's own package list, downloaded into ``<cache>/image/debs`` (kept: a later build finds
    them there)."""
    h = home(st)
    archives = h / "debs"
    (archives / "partial").mkdir(parents=True, exist_ok=True)
    work = h / "apt"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    (work / "status").write_text(dpkg_status_of(st, qualified(base)))
    (work / "extended_states").write_text("")
    (work / "plan" / "partial").mkdir(parents=True)
    opts = ["-o", f"Dir::State::status={work / 'status'}", "-o", f"Dir::State::extended_states={work / 'extended_states'}",
            "-o", "Dir::Cache::pkgcache=", "-o", "Dir::Cache::srcpkgcache=",
            "-o", "Debug::NoLocking=1", "-o", "APT::Sandbox::User=root", "-o", "Acquire::Retries=3"]
    argv = ["apt-get", "install", "--yes", "--no-install-recommends", *opts]

    def plan() -> subprocess.CompletedProcess:
        # Against an empty archive folder: --print-uris leaves out what the archive folder already holds.
        return subprocess.run([*argv, "-o", f"Dir::Cache::archives={work / 'plan'}/", "--print-uris", "-qq",
                               *packages], capture_output=True, text=True, timeout=300)

    proc = plan()
    if proc.returncode != 0:
        log("apt could not plan the image's Debian packages with this machine's package lists; apt-get update")
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, text=True, timeout=600)
        proc = plan()
    if proc.returncode != 0:
        raise StackError(f"apt cannot work out {' '.join(packages)} for {base}:\n{proc.stderr[-2000:]}")
    files = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("'")]
    if not files:
        raise StackError(f"{base} already has {' '.join(packages)}: nothing for the offline apt-get install")
    if any(not (archives / f).is_file() for f in files):
        t0 = time.monotonic()
        proc = subprocess.run([*argv, "-o", f"Dir::Cache::archives={archives}/", "--download-only", "-q", *packages],
                              capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            raise StackError(f"apt-get could not download {' '.join(packages)} (is Debian's mirror reachable?):\n"
                             f"{proc.stderr[-2000:]}")
        log(f"downloaded {len(files)} Debian packages for the final stage in {time.monotonic() - t0:.0f}s")
    return [archives / f for f in files]


# -- the build context ---------------------------------------------------------------
def assemble_context(st: Stack, offline: dict[str, list[Path]]) -> tuple[Path, str]:
    """A build context with exactly what the Dockerfile reads, and the offline inputs under docker/offline/.
    Returns it and a digest of the offline files (the value of the OFFLINE build argument: a change rebuilds
    the steps that use them)."""
    ctx = home(st) / "context"
    shutil.rmtree(ctx, ignore_errors=True)
    ctx.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".pytest_cache")
    for source in copied_sources():
        src = REPO / source
        if source in (".", "./"):
            raise StackError("the Dockerfile copies or mounts the whole context: not supported by eos_stack.image")
        if src.is_dir():
            shutil.copytree(src, ctx / source, ignore=ignore, symlinks=True)
        elif src.is_file():
            (ctx / source).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, ctx / source)
        elif not any(ch in source for ch in "*?["):
            raise StackError(f"the Dockerfile reads {source} from the context, and {src} does not exist")
    shutil.copy2(DOCKERFILE, ctx / "Dockerfile")
    digest = hashlib.sha256()
    for kind, files in sorted(offline.items()):
        for f in sorted(files, key=lambda p: p.name):
            link_or_copy(f, ctx / OFFLINE_DIR / kind / f.name)
            s = f.stat()
            digest.update(f"{kind}/{f.name} {s.st_size} {s.st_mtime_ns}\n".encode())
    return ctx, digest.hexdigest()[:16]
