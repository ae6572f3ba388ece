# syntax=docker/dockerfile:1
# One image for the operator and the job runtime (the driver Pod runs `python -m eos_job run`).

# OFFLINE (empty by default): set, no RUN step uses the network. The wheels, the connector and S3A jars and the
# Debian packages then come from the build context's docker/offline/{wheels,jars,s3jars,debs}, which those steps
# bind-mount (nothing of it lands in a layer). `make image` (stack/eos_stack/image.py) fills that folder from the
# stack's caches and passes a digest of its files as the value, so a change of them rebuilds what uses them.
# SLOT_WRITER, likewise, for the JVM slot writer's jar alone (stage 3b).
ARG OFFLINE=

# --- stage 1: the Spark Kafka connector jars, from Maven Central --------------------------
FROM maven:3.9.9-eclipse-temurin-17 AS connector
ARG OFFLINE
WORKDIR /build
COPY stack/spark/pom.xml pom.xml
RUN --mount=type=bind,source=docker,target=/mnt/docker \
    if [ -n "$OFFLINE" ]; then mkdir /jars && cp /mnt/docker/offline/jars/*.jar /jars/; \
    else mvn -q -B dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=/jars; fi \
 && ls /jars
# Hadoop's S3A connector for checkpoint.store s3: hadoop-aws, the AWS SDK modules it uses (not the SDK's 654 MiB
# bundle) and spark-hadoop-cloud, the one list of stack/spark/s3a/pom.xml at its default versions (PySpark's
# Hadoop; `make image` checks them against the ones stack/eos_stack/spark_s3.py derives). The pom leaves out what
# PySpark's jars/ already has. OFFLINE: the same jars, resolved by the stack, from docker/offline/s3jars.
COPY stack/spark/s3a/pom.xml s3a/pom.xml
RUN --mount=type=bind,source=docker,target=/mnt/docker \
    if [ -n "$OFFLINE" ]; then mkdir /s3jars && cp /mnt/docker/offline/s3jars/*.jar /s3jars/; \
    else mvn -q -B -f s3a/pom.xml dependency:copy-dependencies -DoutputDirectory=/s3jars; fi \
 && ls /s3jars

# --- stage 1b: the Java runtime, only the modules Spark and the clients use -----------------
# jlink of the build JDK (Maven's base has one; its jmods come with it), instead of Debian's whole JRE and the
# desktop, sound and printing libraries it pulls in: 65 MB instead of about 280. java.se (the standard API:
# java.desktop for java.beans, java.sql, java.management, SASL, JNDI...) and what Spark, Hadoop and the Kafka
# client reach beyond it: jdk.unsupported (sun.misc.Unsafe), jdk.incubator.vector (Spark adds the module on its
# command line), jdk.management (com.sun.management, Spark's executor metrics), the crypto providers (TLS,
# PKCS#11), JAAS and Kerberos (SASL), DNS for JNDI, zip file systems, every charset and locale, and for a
# platform team's debugging JFR, JMX and jcmd. Java debug attributes are stripped; native symbols are left
# (stripping them needs binutils' objcopy). The JDK's base class-data archive is made (the image's archive of
# Spark's classes, below, extends it). tests/stack/test_image.py runs a stateful stream on it.
FROM maven:3.9.9-eclipse-temurin-17 AS jre
RUN jlink --add-modules java.se,jdk.unsupported,jdk.incubator.vector,jdk.management,jdk.management.agent,\
jdk.crypto.ec,jdk.crypto.cryptoki,jdk.security.auth,jdk.security.jgss,jdk.naming.dns,jdk.zipfs,jdk.charsets,\
jdk.localedata,jdk.net,jdk.jfr,jdk.jcmd,jdk.attach \
      --strip-java-debug-attributes --no-man-pages --no-header-files --compress=2 --generate-cds-archive \
      --output /jre \
 && /jre/bin/java -version

# --- stage 2: the Python environment: the dependencies alone -------------------------------
# The project's own code is installed last, in the final stage, as a wheel (stage 3), so a code change rebuilds
# neither this 2 GB environment nor the layers and the class-data archive made from it.
FROM python:3.11.11-slim-bookworm AS deps
ARG OFFLINE
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml docker/prune.py ./
# OFFLINE: pip takes the wheels of docker/offline/wheels and no index. prune.py then removes, in the same layer,
# what no Pod of the project loads (Hive, MLlib, Spark Connect, other systems' natives, Arrow Flight, the
# Kubernetes client's asyncio copy: the list and why in docker/prune.py), and setuptools goes (pip stays: a job
# image adds its requirements with /opt/eos/bin/pip, examples/job-image; pip builds an sdist in its own isolated
# environment with the setuptools it fetches).
RUN --mount=type=bind,source=docker,target=/mnt/docker \
    if [ -n "$OFFLINE" ]; then export PIP_NO_INDEX=1 PIP_FIND_LINKS=/mnt/docker/offline/wheels; fi \
 && python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
      > requirements.txt \
 && python -m venv /opt/eos && /opt/eos/bin/pip install -r requirements.txt \
 && /opt/eos/bin/python prune.py /opt/eos/lib/python3.11/site-packages \
 && site=/opt/eos/lib/python3.11/site-packages \
 && rm -rf "$site"/setuptools* "$site"/pkg_resources "$site"/_distutils_hack "$site"/distutils-precedence.pth

# --- stage 3: the project's wheel --------------------------------------------------------------
FROM python:3.11.11-slim-bookworm AS build
ARG OFFLINE
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator operator
COPY jobs jobs
# OFFLINE: the build requirements (setuptools, wheel) from docker/offline/wheels.
RUN --mount=type=bind,source=docker,target=/mnt/docker \
    if [ -n "$OFFLINE" ]; then export PIP_NO_INDEX=1 PIP_FIND_LINKS=/mnt/docker/offline/wheels; fi \
 && python -m venv /tmp/venv && /tmp/venv/bin/pip wheel --no-deps --wheel-dir /wheel .

# --- stage 3b: the JVM slot writer's jar (sink.writer: jvm; jvm/slot-writer) ------------------
# SLOT_WRITER (a digest of the jar; `make image` sets it): the jar the stack built (eos_stack.slot_writer: `mvn
# package` with its golden-vector test, keyed by its sources, the vectors, PySpark's and kafka-clients' versions)
# from docker/offline/slotwriter, so the build compiles nothing and fetches no Maven plugin again. An argument of
# its own, not OFFLINE: a change of the writer rebuilds this stage and one small layer of the final one, never
# the Python environment. Unset: the same `mvn package` here, against the deps stage's PySpark jars
# (compile-time only: nothing of them lands in a layer).
FROM maven:3.9.9-eclipse-temurin-17 AS slotwriter
ARG SLOT_WRITER=
WORKDIR /build
COPY jvm/slot-writer slot-writer
COPY tests/conformance/vectors.json vectors.json
RUN --mount=type=bind,source=docker,target=/mnt/docker \
    --mount=type=bind,from=deps,source=/opt/eos/lib/python3.11/site-packages/pyspark/jars,target=/pyjars \
    mkdir /out \
 && if [ -n "$SLOT_WRITER" ]; then cp /mnt/docker/offline/slotwriter/eos-slot-writer.jar /out/; \
    else mvn -q -B -f slot-writer/pom.xml -Dpyspark.jars=/pyjars -Deos.vectors=/build/vectors.json package \
      && cp slot-writer/target/eos-slot-writer-0.jar /out/eos-slot-writer.jar; fi \
 && ls -l /out

# --- stage 4: runtime ------------------------------------------------------------------------
FROM python:3.11.11-slim-bookworm
LABEL org.opencontainers.image.title="spark-eos-operator" \
      org.opencontainers.image.description="Kubernetes operator and runtime for exactly-once Spark Structured Streaming jobs" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/spark-eos/spark-eos-operator"
# The base image is pinned; Debian packages follow bookworm's security updates, so they are
# not pinned to versions that the archive drops (hadolint DL3008).
# OFFLINE: the packages and their dependencies as .deb files (docker/offline/debs), no package lists.
ARG OFFLINE
# hadolint ignore=DL3008
RUN --mount=type=bind,source=docker,target=/mnt/docker \
    if [ -n "$OFFLINE" ]; then apt-get install -y --no-install-recommends /mnt/docker/offline/debs/*.deb; \
    else apt-get update && apt-get install -y --no-install-recommends procps tini; fi \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 10001 eos && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin eos
COPY --from=jre /jre /opt/java
COPY --from=deps /opt/eos /opt/eos
# Only the connector jars PySpark does not ship (the same filter as stack/eos_stack/spark.py).
COPY --from=connector /jars/spark-sql-kafka-0-10_2.13-*.jar /jars/spark-token-provider-kafka-0-10_2.13-*.jar \
     /jars/kafka-clients-*.jar /jars/commons-pool2-*.jar /opt/spark-kafka/
COPY --from=connector /s3jars/ /opt/spark-s3/
ENV PATH=/opt/eos/bin:/opt/java/bin:$PATH \
    JAVA_HOME=/opt/java \
    SPARK_HOME=/opt/eos/lib/python3.11/site-packages/pyspark \
    EOS_JARS_DIR=/opt/spark-kafka EOS_S3_JARS_DIR=/opt/spark-s3 \
    PYSPARK_PYTHON=/opt/eos/bin/python PYSPARK_DRIVER_PYTHON=/opt/eos/bin/python \
    PYTHONPATH=/app PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HOME=/tmp
# A class-data archive of Spark's classes for this JVM and class path: drivers start about twice as fast
# (eos_job.cds; the JVM runs without it if it does not match). It needs only the session's code (session.py
# imports nothing else of the project), so it is made before the project is installed: a code change elsewhere
# does not make it again.
COPY jobs/eos_job/__init__.py jobs/eos_job/session.py jobs/eos_job/cds.py /opt/eos-cds/eos_job/
RUN PYTHONPATH=/opt/eos-cds /opt/eos/bin/python -m eos_job.cds /opt/eos/spark.jsa
ENV EOS_SPARK_CDS_ARCHIVE=/opt/eos/spark.jsa
# The JVM slot writer (sink.writer: jvm): session.writer_jars puts it on spark.jars. After the class-data archive,
# which it is not part of, so a change of the writer's Java sources rebuilds only this small layer.
COPY --from=slotwriter /out/eos-slot-writer.jar /opt/eos-slot-writer/eos-slot-writer.jar
ENV EOS_SLOT_WRITER_JAR=/opt/eos-slot-writer/eos-slot-writer.jar
# The project itself: one small layer.
COPY --from=build /wheel/ /opt/eos-wheel/
RUN /opt/eos/bin/pip install --no-deps --no-index --no-cache-dir --disable-pip-version-check /opt/eos-wheel/*.whl
COPY examples /app/examples
# Spark's conventions for executor Pods (argument `executor`), else the command as given.
COPY docker/entrypoint.sh /opt/eos/entrypoint.sh
WORKDIR /app
USER 10001:10001
# The entrypoint lists the jars into SPARK_JARS / SPARK_S3_JARS at start (comma-separated, as Spark takes them).
ENTRYPOINT ["/usr/bin/tini", "--", "/opt/eos/entrypoint.sh"]
CMD ["python", "-m", "eos_operator", "run", "--all-namespaces"]
# Outside Kubernetes only (the chart's probes use the operator's liveness endpoint): the
# runtime imports. Exec form: no shell, and the absolute path does not depend on PATH.
HEALTHCHECK --interval=30s --timeout=5s CMD ["/opt/eos/bin/python", "-c", "import eos_operator, eos_job"]
