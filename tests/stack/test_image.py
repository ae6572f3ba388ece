"""The image `make image` builds from the Dockerfile (stack/eos_stack/image.py), run for real with podman
(runc, the host's network): who it runs as, its two entry points, the connector jars and the JVM slot
writer's jar where Spark takes them from, a read-only root with the scratch volume the Pods mount, and Spark's ``executor`` argument reaching the
entrypoint's executor branch. Quick: no Spark job runs.

It needs the image (``EOS_TEST_IMAGE``, else the chart's default): without it every test fails (never skips) and
says to run ``make image``.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
import zipfile
from dataclasses import dataclass

import pytest

from eos_stack import image
from eos_stack.common import Stack, free_port
from eos_stack.pyspark_install import bundled_jar

pytestmark = pytest.mark.image   # make image-test (make test deselects it: docs/testing.md)

UID = 10001
SCRATCH = "/var/run/eos-scratch"   # eos_job.pod_template.SCRATCH_DIR: TMPDIR and HOME of every job container
EXECUTOR_MAIN = "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend"


@dataclass
class Image:
    st: Stack
    tag: str
    config: dict

    def run(self, *cmd: str, env: dict[str, str] | None = None, read_only: bool = False,
            opts: tuple[str, ...] = (), timeout: float = 120) -> subprocess.CompletedProcess:
        name = f"eos-image-test-{uuid.uuid4().hex[:8]}"
        argv = [*image.run_argv(read_only=read_only), "--name", name, *opts,
                *(f"--env={k}={v}" for k, v in (env or {}).items()), self.tag, *cmd]
        try:
            return subprocess.run(argv, env=image.engine_env(self.st), capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            image.podman(self.st, "rm", "--force", name, check=False)
            raise

    def ok(self, *cmd: str, **kw) -> str:
        proc = self.run(*cmd, **kw)
        assert proc.returncode == 0, f"{' '.join(cmd)}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        return proc.stdout


@pytest.fixture(scope="module")
def img() -> Image:
    missing = [t for t in ("podman", "runc") if not shutil.which(t)]
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed: run `make image` (it installs them and builds the image)",
                    pytrace=False)
    if os.geteuid() != 0:
        pytest.fail("the image lives in rootful podman storage: run the tests as root (as `make image` was)",
                    pytrace=False)
    st, tag = Stack(), image.image_under_test()
    proc = image.podman(st, "image", "inspect", tag, check=False)
    if proc.returncode != 0:
        pytest.fail(f"no image {tag} in the project's container storage ({image.home(st)}): run `make image`",
                    pytrace=False)
    return Image(st, tag, json.loads(proc.stdout)[0]["Config"])


def scratch_opts() -> tuple[str, ...]:
    """The scratch volume as a Pod has it: a writable folder at SCRATCH, TMPDIR and HOME pointing at it."""
    return ("--tmpfs", f"{SCRATCH}:rw,size=256m,mode=1777")


SCRATCH_ENV = {"TMPDIR": SCRATCH, "HOME": SCRATCH}


def test_the_entrypoint_runs_as_uid_10001(img):
    assert img.config["User"] == f"{UID}:{UID}"
    assert img.config["Entrypoint"] == ["/usr/bin/tini", "--", "/opt/eos/entrypoint.sh"]
    assert img.config["Cmd"] == ["python", "-m", "eos_operator", "run", "--all-namespaces"]
    out = img.ok("sh", "-c", 'id -u; id -g; tr "\\0" " " < /proc/1/cmdline')
    uid, gid, init = out.splitlines()
    assert (uid, gid) == (str(UID), str(UID))
    assert init.startswith("/usr/bin/tini -- /opt/eos/entrypoint.sh"), f"PID 1 is {init!r}, not tini"


@pytest.mark.parametrize("module", ["eos_job", "eos_operator"])
def test_both_entry_points_start(img, module):
    out = img.ok("python", "-m", module, "--help")
    assert "usage:" in out and "run" in out, out
    where = img.ok("python", "-c", f"import {module}; print({module}.__file__)").strip()
    assert where.startswith("/opt/eos/lib/python3.11/site-packages/"), where


def test_a_job_image_can_add_its_requirements_with_the_images_pip(img):
    """examples/job-image installs a job's requirements with /opt/eos/bin/pip: it is there and it is the
    environment's (docker/prune.py and the Dockerfile remove setuptools, not pip)."""
    out = img.ok("/opt/eos/bin/pip", "--version", env=SCRATCH_ENV)
    assert "/opt/eos/lib/python3.11/site-packages/pip" in out, out


def test_the_connector_jars_are_where_spark_takes_them_from(img):
    """The entrypoint lists /opt/spark-kafka and /opt/spark-s3 into SPARK_JARS and SPARK_S3_JARS (which the
    session gives Spark as spark.jars): the stack's connector and S3A jars (the S3A ones resolved by the
    Dockerfile from the same pom), real jars that register Spark's `kafka` source and S3A, no second copy of a
    jar PySpark ships, and not the AWS SDK bundle (the S3A jars are a few MiB)."""
    from eos_stack import spark, spark_s3

    out = img.ok("sh", "-c", 'echo "$SPARK_JARS"; echo "$SPARK_S3_JARS"; echo "$SPARK_HOME"')
    kafka_line, s3_line, spark_home = out.splitlines()
    kafka_jars, s3_jars = kafka_line.split(","), s3_line.split(",")
    expected_kafka = sorted(p.name for p in spark.jars_dir(Stack()).glob("*.jar"))
    assert sorted(os.path.basename(j) for j in kafka_jars) == expected_kafka
    assert all(j.startswith("/opt/spark-kafka/") for j in kafka_jars), kafka_jars
    assert sorted(os.path.basename(j) for j in s3_jars) == sorted(p.name for p in spark_s3.ensure_jars(Stack()))
    assert all(j.startswith("/opt/spark-s3/") for j in s3_jars), s3_jars

    # Read the jars out of the image (the test's own zipfile, not the image's Python): the Kafka source is
    # registered for Spark's ServiceLoader, and S3A's file system class is there.
    mount = image.podman(img.st, "image", "mount", img.tag).stdout.strip()
    try:
        root = os.path.join(mount, "")
        [kafka] = [j for j in kafka_jars if os.path.basename(j).startswith("spark-sql-kafka-0-10_2.13-")]
        with zipfile.ZipFile(root + kafka.lstrip("/")) as z:
            services = z.read("META-INF/services/org.apache.spark.sql.sources.DataSourceRegister").decode()
        assert "org.apache.spark.sql.kafka010.KafkaSourceProvider" in services
        [aws] = [j for j in s3_jars if os.path.basename(j).startswith("hadoop-aws-")]
        with zipfile.ZipFile(root + aws.lstrip("/")) as z:
            assert "org/apache/hadoop/fs/s3a/S3AFileSystem.class" in z.namelist()
        bundled = sorted(os.listdir(root + spark_home.lstrip("/") + "/jars"))
        assert not any(os.path.basename(j) in bundled for j in kafka_jars), "a connector jar duplicates PySpark's"
        artifacts = [re.fullmatch(r"(.+?)-\d[^-]*\.jar", os.path.basename(j)).group(1) for j in s3_jars]
        assert not {a: d for a in artifacts if (d := bundled_jar(a, bundled))}, "an S3A jar duplicates PySpark's"
        s3_size = sum(os.path.getsize(root + j.lstrip("/")) for j in s3_jars)
        assert s3_size < 40 << 20, f"the S3A jars are {s3_size >> 20} MiB: the AWS SDK bundle is back?"
        assert any(n.startswith("spark-kubernetes_2.13-") for n in bundled), "PySpark's jars lack spark-kubernetes"
    finally:
        image.podman(img.st, "image", "unmount", img.tag, check=False)


def test_the_jvm_slot_writers_jar_is_where_the_runtime_takes_it_from(img):
    """sink.writer jvm in the image: EOS_SLOT_WRITER_JAR (the Dockerfile's ENV) names the jar the stack built for
    these sources and versions, byte for byte (the slotwriter stage copies it; make image builds none of its
    own), it holds the py4j entry point, and the image's runtime puts it on spark.jars (session.writer_jars)."""
    from eos_stack import slot_writer, spark

    built = slot_writer.ensure_jar(Stack(), spark.ensure_jars(Stack()))
    path = dict(e.split("=", 1) for e in img.config["Env"]).get(slot_writer.ENV, "")
    assert path, f"the image sets no {slot_writer.ENV}: built from a Dockerfile without the slotwriter stage?"
    out = img.ok("python", "-c", "from eos_job.session import writer_jars; print(','.join(writer_jars()))",
                 env=SCRATCH_ENV)
    assert out.strip() == path, (out, path)
    mount = image.podman(img.st, "image", "mount", img.tag).stdout.strip()
    try:
        inside = os.path.join(mount, path.lstrip("/"))
        with open(inside, "rb") as f:
            assert f.read() == built.read_bytes(), f"{path} in the image is not the stack's {built}"
        with zipfile.ZipFile(inside) as z:
            assert "eos/slotwriter/SparkEntry.class" in z.namelist()
    finally:
        image.podman(img.st, "image", "unmount", img.tag, check=False)


def test_read_only_root_with_the_scratch_volume(img):
    """As the chart and the job Pods run it: a read-only root (its /tmp too), writes only to the scratch volume."""
    script = r"""
for d in / /opt/eos /app /tmp; do touch "$d/.probe" 2>/dev/null && echo "WRITABLE $d"; done
python -c 'import tempfile, eos_job, eos_operator; print("TEMP", tempfile.mkstemp()[1])'
python -m eos_job --help >/dev/null && echo JOB-HELP
java -XshowSettings:properties -version 2>&1 | grep -E "java.io.tmpdir|user.home"
java -Djava.io.tmpdir="$TMPDIR" -version 2>&1 | head -1
"""
    out = img.ok("sh", "-c", script, read_only=True, opts=scratch_opts(), env=SCRATCH_ENV)
    assert "WRITABLE" not in out, out
    assert f"TEMP {SCRATCH}/" in out and "JOB-HELP" in out, out
    assert 'openjdk version "17' in out, out
    # The operator's Deployment: read-only root, an emptyDir at /tmp (HOME=/tmp from the image's ENV).
    out = img.ok("sh", "-c", "touch /tmp/.probe && python -m eos_operator --help >/dev/null && echo OP-OK",
                 read_only=True, opts=("--tmpfs", "/tmp:rw,size=64m,mode=1777"))
    assert "OP-OK" in out, out


def test_spark_executor_argument_reaches_the_executor_branch(img):
    """`executor` (Spark's argument for its executor Pods) runs Spark's executor backend with the SPARK_*
    settings: -XshowSettings:properties (one SPARK_JAVA_OPT_<n>) makes the JVM print its main class and arguments,
    class path, temporary folder and the other options before it tries the driver, which is not there."""
    port = free_port()
    env = {**SCRATCH_ENV,
           "SPARK_DRIVER_URL": f"spark://CoarseGrainedScheduler@127.0.0.1:{port}", "SPARK_EXECUTOR_ID": "7",
           "SPARK_EXECUTOR_CORES": "1", "SPARK_APPLICATION_ID": "spark-eos-image-test",
           "SPARK_EXECUTOR_POD_IP": "127.0.0.1", "SPARK_EXECUTOR_MEMORY": "512m", "SPARK_EXECUTOR_POD_NAME": "exec-7",
           "SPARK_JAVA_OPT_0": "-XshowSettings:properties", "SPARK_JAVA_OPT_1": "-Deos.image.test=second",
           "SPARK_JAVA_OPT_10": "-Deos.image.order=tenth"}
    proc = img.run("executor", read_only=True, opts=scratch_opts(), env=env, timeout=180)
    out = proc.stdout + proc.stderr
    command = next((ln.split("=", 1)[1].strip() for ln in out.splitlines()
                    if ln.strip().startswith("sun.java.command =")), None)
    assert command is not None, f"the JVM printed no settings: the executor branch did not run java\n{out[-3000:]}"
    assert command.split()[0] == EXECUTOR_MAIN, command
    args = command.split()[1:]
    assert args[args.index("--driver-url") + 1] == env["SPARK_DRIVER_URL"]
    for flag, key in (("--executor-id", "SPARK_EXECUTOR_ID"), ("--cores", "SPARK_EXECUTOR_CORES"),
                      ("--app-id", "SPARK_APPLICATION_ID"), ("--hostname", "SPARK_EXECUTOR_POD_IP"),
                      ("--podName", "SPARK_EXECUTOR_POD_NAME")):
        assert args[args.index(flag) + 1] == env[key], (flag, command)
    assert args[args.index("--resourceProfileId") + 1] == "0"
    assert f"java.io.tmpdir = {SCRATCH}" in out, "TMPDIR did not become the JVM's temporary folder"
    assert "eos.image.test = second" in out and "eos.image.order = tenth" in out
    assert "/opt/eos/lib/python3.11/site-packages/pyspark/jars/" in out, "Spark's jars are not on the class path"
    # Then Spark's executor backend itself ran: it looked for the driver, which does not exist, and gave up.
    assert "CoarseGrainedExecutorBackend" in out or "KubernetesExecutorBackend" in out, out[-3000:]
    assert f"127.0.0.1:{port}" in out, f"the executor never tried the driver's address\n{out[-3000:]}"
    assert proc.returncode != 0, "an executor without a driver must fail"


def _prune_list():
    """docker/prune.py, the list the Dockerfile's deps stage runs (read as a module, not run)."""
    import importlib.util

    from eos_stack.common import REPO
    spec = importlib.util.spec_from_file_location("eos_prune", REPO / "docker" / "prune.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_what_prune_removed_is_gone_and_what_streams_use_stays(img):
    """docker/prune.py's jars, natives and files are not in the image; what a stream still uses is: the Kafka
    source and sink's jars, cluster mode's, one RocksDB native (this machine's, glibc), pyarrow's S3 file system,
    pandas, the Kubernetes client. Then a streaming aggregation runs in the image on the RocksDB state store
    (its native library loaded from the rewritten jar) with the pruned jars gone from the class path."""
    import fnmatch

    prune = _prune_list()
    site = "opt/eos/lib/python3.11/site-packages"
    mount = image.podman(img.st, "image", "mount", img.tag).stdout.strip()
    try:
        jars = sorted(os.listdir(os.path.join(mount, site, "pyspark", "jars")))
        left = [(j, why) for j in jars for pattern, why in prune.JARS if fnmatch.fnmatch(j, pattern)]
        assert left == [], f"pruned jars still in the image: {left}"
        foreign = [j for j in jars if j.startswith("netty-") and ("-osx-" in j or "-windows-" in j)]
        assert foreign == [], foreign
        for needed in ("spark-core_2.13-", "spark-sql_2.13-", "spark-kubernetes_2.13-", "spark-streaming_2.13-",
                       "rocksdbjni-", "kubernetes-client-", "netty-transport-native-epoll-"):
            assert any(j.startswith(needed) for j in jars), f"{needed}* was pruned"
        [rocks] = [j for j in jars if j.startswith("rocksdbjni-")]
        with zipfile.ZipFile(os.path.join(mount, site, "pyspark", "jars", rocks)) as z:
            natives = [n for n in z.namelist() if n.startswith("librocksdbjni-")]
        assert natives == [prune.ROCKSDB_NATIVE], natives
        for gone in ("kubernetes/aio", "pyarrow/include", "pyarrow/tests"):
            assert not os.path.exists(os.path.join(mount, site, gone)), gone
    finally:
        image.podman(img.st, "image", "unmount", img.tag, check=False)
    out = img.ok("python", "-c", "import pandas, pyarrow.fs, kubernetes.client, confluent_kafka; "
                 "print(pyarrow.fs.S3FileSystem.__name__, pandas.__version__)", env=SCRATCH_ENV,
                 read_only=True, opts=scratch_opts())
    assert out.startswith("S3FileSystem "), out
    script = r"""
import json, os, pathlib
from pyspark.sql import SparkSession, functions as F
src = pathlib.Path(os.environ["TMPDIR"], "in"); src.mkdir()
(src / "a.json").write_text("\n".join(json.dumps({"k": k % 3}) for k in range(30)))
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.sql.streaming.stateStore.providerClass",
                 "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider").getOrCreate())
q = (spark.readStream.schema("k INT").json(str(src)).groupBy("k").count().writeStream.outputMode("complete")
     .format("memory").queryName("counts").option("checkpointLocation", os.environ["TMPDIR"] + "/ckpt")
     .trigger(availableNow=True).start())
q.awaitTermination()
print("COUNTS", sorted(tuple(r) for r in spark.table("counts").collect()))
print("STORE", any(k.startswith("rocksdb") for k in q.lastProgress["stateOperators"][0]["customMetrics"]))
"""
    out = img.ok("python", "-c", script, env=SCRATCH_ENV, opts=scratch_opts(), timeout=240)
    assert "COUNTS [(0, 10), (1, 10), (2, 10)]" in out, out[-3000:]
    assert "STORE True" in out, f"the aggregation did not run on the RocksDB state store\n{out[-3000:]}"
