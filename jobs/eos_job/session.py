"""One place that builds the job's local SparkSession."""
from __future__ import annotations

import os
import sys

from pathlib import Path

from pyspark.sql import SparkSession

# Names an archive of Spark's classes made by ``python -m eos_job.cds`` (the stack and the image make one).
ARCHIVE_ENV = "EOS_SPARK_CDS_ARCHIVE"
# The image's folders of each jar list (Dockerfile ENV; docker/entrypoint.sh reads them too).
JAR_DIRS = {"SPARK_JARS": "EOS_JARS_DIR", "SPARK_S3_JARS": "EOS_S3_JARS_DIR"}


def jar_list(key: str, env=os.environ) -> list[str]:
    """The jars of ``key`` (``SPARK_JARS``: the Kafka connector; ``SPARK_S3_JARS``: S3A): its comma-separated
    paths, else every ``*.jar`` of the folder the image names in ``EOS_JARS_DIR`` / ``EOS_S3_JARS_DIR``. The
    image's entrypoint lists those folders into the variables, but a Pod whose ``command`` is set (the driver,
    ``python -m eos_job run``) replaces the entrypoint, as Kubernetes does: the runtime must find them itself."""
    listed = [j for j in env.get(key, "").split(",") if j]
    if listed:
        return listed
    folder = env.get(JAR_DIRS[key], "")
    return sorted(str(p) for p in Path(folder).glob("*.jar")) if folder else []


def writer_jars(env=os.environ) -> list[str]:
    """The JVM slot writer's jar (``sink.writer: jvm``; ``EOS_SLOT_WRITER_JAR``, which ``eos_stack up spark``
    builds), when there is one: on ``spark.jars`` of every job, so the driver can call it (``jvm_writer``)."""
    jar = env.get("EOS_SLOT_WRITER_JAR", "")
    return [jar] if jar and Path(jar).is_file() else []


def shared_archive_options(env=os.environ) -> str:
    """The driver JVM options that map the class-data archive, or "" when there is none."""
    archive = env.get(ARCHIVE_ENV, "")
    if archive and Path(archive).is_file():
        return f"-XX:SharedArchiveFile={archive}"
    return ""


def s3a_conf(s3) -> dict[str, str]:
    """Spark settings for a checkpoint in bucket ``s3`` (a ``checkpoint.s3``): Hadoop's S3A connector.

    * ``spark.jars`` gains ``SPARK_S3_JARS`` (hadoop-aws, the AWS SDK modules it uses and spark-hadoop-cloud, local
      files that ``eos_stack up spark`` and the image provide), after the usual ``SPARK_JARS``.
    * per-bucket S3A settings (``fs.s3a.bucket.<b>.*``): endpoint, region, path-style addressing, TLS as the
      endpoint's scheme says. Credentials: S3A's default chain, which reads ``AWS_ACCESS_KEY_ID`` and
      ``AWS_SECRET_ACCESS_KEY`` (the operator maps them from the stream's Secret) or the Pod's own identity.
    * ``checkpointFileManagerClass``: Spark's abortable-stream manager, which writes each checkpoint file
      straight to its name and aborts the upload on failure; an object store has no atomic rename, and
      the default manager's write-then-rename is a copy there.
    """
    listed = [*jar_list("SPARK_JARS"), *writer_jars(), *jar_list("SPARK_S3_JARS")]
    if not jar_list("SPARK_S3_JARS"):
        raise RuntimeError("checkpoint.store is s3 but SPARK_S3_JARS (or EOS_S3_JARS_DIR) names no jars: the image "
                           "(or `make stack-up`) "
                           "provides hadoop-aws and the AWS SDK; without them Spark cannot write to S3")
    b = f"spark.hadoop.fs.s3a.bucket.{s3.bucket}"
    conf = {
        "spark.jars": ",".join(listed),
        "spark.hadoop.fs.s3a.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        f"{b}.endpoint.region": s3.region,
        f"{b}.path.style.access": str(bool(s3.path_style_access)).lower(),
        "spark.sql.streaming.checkpointFileManagerClass":
            "org.apache.spark.internal.io.cloud.AbortableStreamBasedCheckpointFileManager",
    }
    if s3.endpoint:
        conf[f"{b}.endpoint"] = s3.endpoint.rstrip("/")
        conf[f"{b}.connection.ssl.enabled"] = str(s3.endpoint.startswith("https://")).lower()
    return conf


def temp_dir_option(env=os.environ) -> str:
    """``-Djava.io.tmpdir=$TMPDIR`` when TMPDIR names a folder, else "". In a Pod TMPDIR is the scratch volume
    (its root filesystem is read-only): the JVM's temporary files (native libraries unpacked, Spark's local
    dir in local mode) go where Python's do."""
    tmp = env.get("TMPDIR", "")
    return f"-Djava.io.tmpdir={tmp}" if tmp and Path(tmp).is_dir() else ""


def kubernetes_master(env=os.environ) -> str | None:
    """``EOS_SPARK_MASTER=k8s`` (cluster deploy mode): the API server as an in-cluster Pod reaches it. Spark's
    Kubernetes client then authenticates with the Pod's ServiceAccount token (mounted by the kubelet)."""
    if env.get("EOS_SPARK_MASTER") != "k8s":
        return None
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise RuntimeError("deployMode cluster: KUBERNETES_SERVICE_HOST/PORT are not set; the driver must run in a "
                           "Pod of the cluster (the kubelet sets them)")
    host = f"[{host}]" if ":" in host else host
    return f"k8s://https://{host}:{port}"


def build_spark_session(app_name: str, *, jars: list[str] | None = None, conf: dict[str, str] | None = None,
                        master: str | None = None) -> SparkSession:
    """Build (or return the already running) SparkSession for a job or a test.

    Why each setting:

    * ``spark.jars``: the Kafka connector and the dependencies PySpark lacks, as
      local paths (``jars``, else ``jar_list("SPARK_JARS")``: the comma-separated ``SPARK_JARS``
      written by ``eos_stack up spark``, or the image's ``EOS_JARS_DIR``). Local files, never
      ``spark.jars.packages``: no
      network or Ivy resolution when a job starts.
    * ``PYSPARK_PYTHON`` / ``PYSPARK_DRIVER_PYTHON``: Python workers must run this
      interpreter, or they import from the system Python and miss pyarrow and the
      project's packages. Set only when the caller has not chosen one.
    * ``spark.sql.shuffle.partitions=2``: the default 200 means 200 tiny tasks per
      shuffle in local mode on two cores.
    * ``spark.ui.enabled=false``: no web UI port to collide with parallel runs;
      ``showConsoleProgress=false``: progress bars would fill the driver's log.
    * master ``local[*,4]`` (``EOS_SPARK_LOCAL_MASTER``): all cores of the Pod, and a
      failed task is retried up to 4 times before the query fails, as on a cluster.
      Cluster deploy mode (``EOS_SPARK_MASTER=k8s``): ``kubernetes_master()``, and the
      loopback and memory settings below are left to spark-submit's arguments; only
      ``spark.driver.host`` is set, to the driver's headless Service name (``EOS_DRIVER_HOST``, resolved by
      cluster DNS), else to the Pod's IP (``EOS_POD_IP``).
    * ``spark.driver.memory``: ``EOS_DRIVER_HEAP``, the heap the operator sized for the driver container
      (``eos_job.memory``), else ``1g``: modest, leaves room for the broker and the API server on a small
      machine (honoured because it is set before the JVM starts; it does nothing for an already running session).
    * ``spark.driver.host/bindAddress=127.0.0.1``: everything is on loopback; avoids
      hostname lookups that fail or are slow in containers.
    * ``spark.sql.session.timeZone=UTC``: timestamps mean the same on every machine.
    * ``spark.sql.streaming.forceDeleteTempCheckpointLocation=true``: queries
      without an explicit checkpoint (debugging, tests) clean up their temporary one.
    * log level WARN: Spark's INFO output drowns the job's own messages.
    * ``spark.driver.extraJavaOptions`` starts with ``-XX:SharedArchiveFile=...`` when
      ``EOS_SPARK_CDS_ARCHIVE`` names an archive of Spark's classes (``eos_job.cds``): the
      driver JVM starts about twice as fast; then ``-Djava.io.tmpdir`` when TMPDIR is set
      (``temp_dir_option``, with Hadoop's ``hadoop.tmp.dir`` under it: S3A buffers uploads there). Options
      given in ``conf`` follow them.

    ``conf`` entries override all of these. ``getOrCreate`` means a session that
    already runs in this process is returned as is: static settings (jars,
    memory) then come from whoever created it.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    k8s = kubernetes_master()
    if jars is None:
        jars = [*jar_list("SPARK_JARS"), *writer_jars()]
    settings = {
        "spark.sql.shuffle.partitions": "2",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    }
    if k8s is None:   # local mode: everything on loopback
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # no hostname lookup, no warning about it
        # The heap the operator sized for the container (eos_job.memory.DRIVER_HEAP_ENV; named here, as this
        # module imports nothing else of the project), else 1g.
        settings.update({"spark.driver.memory": os.environ.get("EOS_DRIVER_HEAP") or "1g",
                         "spark.driver.host": "127.0.0.1",
                         "spark.driver.bindAddress": "127.0.0.1"})
    elif os.environ.get("EOS_DRIVER_HOST") or os.environ.get("EOS_POD_IP"):
        # Cluster mode: spark-submit's arguments (the operator's) stand; only the address executors dial back to
        # is set here: the driver's headless Service name (cluster DNS), else (an older operator) the Pod's IP.
        settings["spark.driver.host"] = os.environ.get("EOS_DRIVER_HOST") or os.environ["EOS_POD_IP"]
    if jars:
        settings["spark.jars"] = ",".join(jars)
    settings.update(conf or {})
    shared = shared_archive_options()
    if "-XX:ArchiveClassesAtExit" in settings.get("spark.driver.extraJavaOptions", ""):
        shared = ""
    tmp = temp_dir_option()
    if tmp:
        # Hadoop's own temporary folder (/tmp/hadoop-<user> by default): S3A buffers its uploads there.
        settings.setdefault("spark.hadoop.hadoop.tmp.dir", f"{os.environ['TMPDIR'].rstrip('/')}/hadoop")
    if shared or tmp:
        settings["spark.driver.extraJavaOptions"] = " ".join(
            o for o in (shared, tmp, settings.get("spark.driver.extraJavaOptions", "")) if o)
    builder = SparkSession.builder.appName(app_name)
    if "--master" not in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
        builder = builder.master(master or k8s or os.environ.get("EOS_SPARK_LOCAL_MASTER", "local[*,4]"))
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
