"""Removes from the image's Python environment what neither the operator nor a stream's driver or executors use
(issue 31: the image at about half its size). Run once, in the Dockerfile's `deps` stage, in the same step as the
install: a file removed in a later layer still weighs in the image.

    python prune.py SITE_PACKAGES

Each group says why it can go. What a stream may still ask for stays: Spark SQL and Structured Streaming, the
RocksDB state store (its native library for this machine's architecture), Parquet and ORC files,
Kubernetes cluster mode, Arrow (the sink's batches), pandas (pandas UDFs in a user's transform). A user who
needs a removed part (Hive tables, MLlib, Spark Connect) adds it in their own image (docs/job-image.md).
`tests/stack/test_image.py` checks the list against the built image: every pruned path gone, every kept
feature still importable.
"""
from __future__ import annotations

import platform
import shutil
import sys
import zipfile
from pathlib import Path

# PySpark's jars/: (glob, why it is not needed). Hive: the runtime's session never enables Hive support (the
# in-memory catalog); MLlib and its linear algebra: no ML in a streaming sink; Connect: the driver runs classic
# Spark in its own JVM; YARN, the REPL, GraphX, Declarative Pipelines: other deployments and APIs.
JARS = (
    ("hive-*.jar", "Hive metastore and SerDes (enableHiveSupport is never called)"),
    ("spark-hive*.jar", "Spark's Hive integration and Thrift server"),
    ("derby-*.jar", "the embedded Hive metastore's database"),
    ("datanucleus-*.jar", "the Hive metastore's ORM"),
    ("jdo-api-*.jar", "the Hive metastore's ORM API"),
    ("javax.jdo-*.jar", "the Hive metastore's ORM API"),
    ("javolution-*.jar", "Hive"),
    ("jpam-*.jar", "the Thrift server's PAM authentication"),
    ("libthrift-*.jar", "the Hive metastore's and Thrift server's RPC"),
    ("libfb303-*.jar", "the Hive metastore's RPC"),
    ("transaction-api-*.jar", "the Hive metastore's ORM"),
    ("ST4-*.jar", "Hive's templates"),
    ("super-csv-*.jar", "Hive's CSV SerDe"),
    ("spark-mllib*.jar", "MLlib"),
    ("breeze*.jar", "MLlib's linear algebra"),
    ("spire*.jar", "MLlib's numerics (via breeze)"),
    ("algebra_*.jar", "MLlib's numerics (via spire)"),
    ("cats-kernel*.jar", "MLlib's numerics (via spire)"),
    ("arpack*.jar", "MLlib's native linear algebra"),
    ("lapack-*.jar", "MLlib's native linear algebra"),
    ("blas-*.jar", "MLlib's native linear algebra"),
    ("JTransforms-*.jar", "MLlib's FFT"),
    ("JLargeArrays-*.jar", "MLlib's FFT"),
    ("jts-core-*.jar", "MLlib's geometry"),
    ("spark-graphx*.jar", "GraphX"),
    ("spark-connect_*.jar", "the Spark Connect server"),
    ("spark-pipelines*.jar", "Declarative Pipelines"),
    ("spark-yarn*.jar", "YARN deployments"),
    ("spark-repl*.jar", "the Scala shell"),
)
# Netty's natives for other systems: only this architecture's Linux ones are ever loaded.
ARCH = {"x86_64": "x86_64", "aarch64": "aarch_64"}[platform.machine()]
ROCKSDB_NATIVE = {"x86_64": "librocksdbjni-linux64.so", "aarch64": "librocksdbjni-linux-aarch64.so"}[
    platform.machine()]
# pyarrow: Flight (Arrow's RPC), its C++ test module, headers and Cython sources (building extensions).
PYARROW = ("libarrow_flight.so*", "libarrow_python_flight.so*", "_flight.cpython-*.so", "flight.py",
           "_pyarrow_cpp_tests.cpython-*.so", "include", "tests", "*.pyx", "*.pxd", "*.pxi", "src")
# The Kubernetes client's asyncio copy (kubernetes.aio): kopf talks to the API through aiohttp itself, the
# operator's adapters through the synchronous client.
OTHER = ("kubernetes/aio",)


def remove(path: Path) -> int:
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    return size


def natives_of_other_systems(jars: Path) -> list[Path]:
    """Netty's tcnative/epoll/kqueue jars built for another OS or architecture."""
    found = []
    for jar in jars.glob("netty-*.jar"):
        name = jar.stem
        if any(os_ in name for os_ in ("-osx-", "-windows-")) or (
                "-linux-" in name and not name.endswith(f"-linux-{ARCH}")):
            found.append(jar)
    return found


def rocksdb_for_this_arch(jars: Path) -> int:
    """Rewrites rocksdbjni's jar with only this architecture's glibc native library (it ships 14 of them)."""
    saved = 0
    for jar in jars.glob("rocksdbjni-*.jar"):
        before = jar.stat().st_size
        tmp = jar.with_suffix(".tmp")
        with zipfile.ZipFile(jar) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
            for item in src.infolist():
                native = item.filename.startswith("librocksdbjni-")
                if native and item.filename != ROCKSDB_NATIVE:
                    continue
                dst.writestr(item, src.read(item.filename))
        tmp.replace(jar)
        saved += before - jar.stat().st_size
    return saved


def main(site: Path) -> int:
    jars = site / "pyspark" / "jars"
    if not (jars / "..").resolve().is_dir() or not any(jars.glob("spark-core_*.jar")):
        print(f"prune: no PySpark jars under {jars}", file=sys.stderr)
        return 2
    total = 0
    for pattern, why in JARS:
        for jar in sorted(jars.glob(pattern)):
            total += remove(jar)
            print(f"prune: {jar.name} ({why})")
    for jar in natives_of_other_systems(jars):
        total += remove(jar)
        print(f"prune: {jar.name} (another system's native library)")
    total += rocksdb_for_this_arch(jars)
    for pattern in PYARROW:
        for path in sorted((site / "pyarrow").glob(pattern)):
            total += remove(path)
    for rel in OTHER:
        if (site / rel).exists():
            total += remove(site / rel)
    print(f"prune: {total / 2**20:.0f} MiB removed")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
