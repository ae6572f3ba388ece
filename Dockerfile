# syntax=docker/dockerfile:1
# One image for the operator and the job runtime (the driver Pod runs `python -m eos_job run`).

# --- stage 1: the Spark Kafka connector jars, from Maven Central --------------------------
FROM maven:3.9.9-eclipse-temurin-17 AS connector
WORKDIR /build
COPY stack/spark/pom.xml pom.xml
RUN mvn -q -B dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=/jars \
 && ls /jars

# --- stage 2: the Python environment ---------------------------------------------------------
FROM python:3.11.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator operator
COPY jobs jobs
RUN python -m venv /opt/eos && /opt/eos/bin/pip install .

# --- stage 3: runtime ------------------------------------------------------------------------
FROM python:3.11.11-slim-bookworm
LABEL org.opencontainers.image.title="spark-eos-operator" \
      org.opencontainers.image.description="Kubernetes operator and runtime for exactly-once Spark Structured Streaming jobs" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/spark-eos/spark-eos-operator"
# The base image is pinned; Debian packages follow bookworm's security updates, so they are
# not pinned to versions that the archive drops (hadolint DL3008).
# The JDK's folder name carries the architecture: /usr/lib/jvm/java-17 is the same on every one.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps tini \
 && rm -rf /var/lib/apt/lists/* \
 && ln -s "/usr/lib/jvm/java-17-openjdk-$(dpkg --print-architecture)" /usr/lib/jvm/java-17 \
 && groupadd --gid 10001 eos && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin eos
COPY --from=build /opt/eos /opt/eos
# Only the connector jars PySpark does not ship (the same filter as stack/eos_stack/spark.py).
COPY --from=connector /jars/spark-sql-kafka-0-10_2.13-*.jar /jars/spark-token-provider-kafka-0-10_2.13-*.jar \
     /jars/kafka-clients-*.jar /jars/commons-pool2-*.jar /opt/spark-kafka/
COPY examples /app/examples
ENV PATH=/opt/eos/bin:$PATH \
    JAVA_HOME=/usr/lib/jvm/java-17 \
    PYSPARK_PYTHON=/opt/eos/bin/python PYSPARK_DRIVER_PYTHON=/opt/eos/bin/python \
    PYTHONPATH=/app PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HOME=/tmp
# A class-data archive of Spark's classes for this JVM and class path: drivers start about twice as fast
# (eos_job.cds; the JVM runs without it if it does not match).
RUN /opt/eos/bin/python -m eos_job.cds /opt/eos/spark.jsa
ENV EOS_SPARK_CDS_ARCHIVE=/opt/eos/spark.jsa
# SPARK_JARS is a comma-separated list; the shell form resolves the globbed names at start.
WORKDIR /app
USER 10001:10001
ENTRYPOINT ["/usr/bin/tini", "--", "/bin/sh", "-c", "export SPARK_JARS=$(ls /opt/spark-kafka/*.jar | paste -sd, -); exec \"$@\"", "--"]
CMD ["python", "-m", "eos_operator", "run", "--all-namespaces"]
# Outside Kubernetes only (the chart's probes use the operator's liveness endpoint): the
# runtime imports. Exec form: no shell, and the absolute path does not depend on PATH.
HEALTHCHECK --interval=30s --timeout=5s CMD ["/opt/eos/bin/python", "-c", "import eos_operator, eos_job"]
