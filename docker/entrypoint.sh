#!/usr/bin/env bash
# The image's entrypoint (under tini). Spark's Kubernetes conventions: Spark creates executor Pods with this
# image and the single argument `executor`, their settings in SPARK_* variables; `driver` runs spark-submit
# as a client-mode driver. Anything else runs as given: the operator (`python -m eos_operator run`) and the
# stream's driver (`python -m eos_job run`, which starts Spark itself).
#
# Paths come from the image's ENV (SPARK_HOME: PySpark's folder; EOS_JARS_DIR: the Kafka connector jars;
# EOS_S3_JARS_DIR: Hadoop's S3A jars).
set -euo pipefail

: "${SPARK_HOME:?SPARK_HOME must name the Spark installation, the folder of PySpark}"
jars_of() { [ -d "${1:-}" ] && ls "$1"/*.jar 2>/dev/null | paste -sd, - || true; }
export SPARK_JARS="${SPARK_JARS:-$(jars_of "${EOS_JARS_DIR:-/opt/spark-kafka}")}"
export SPARK_S3_JARS="${SPARK_S3_JARS:-$(jars_of "${EOS_S3_JARS_DIR:-/opt/spark-s3}")}"

classpath="${SPARK_HOME}/jars/*"
if [ -n "${SPARK_EXTRA_CLASSPATH:-}" ]; then classpath="${classpath}:${SPARK_EXTRA_CLASSPATH}"; fi
if [ -n "${SPARK_CONF_DIR:-}" ]; then classpath="${SPARK_CONF_DIR}:${classpath}"; fi

case "${1:-}" in
  executor)
    shift
    # SPARK_JAVA_OPT_<n>: one JVM option each, in order of n (what the driver passes to its executors).
    opts=()
    while IFS= read -r opt; do opts+=("$opt"); done < <(
      env | grep '^SPARK_JAVA_OPT_' | sort -t_ -k4 -n | sed 's/^[^=]*=//')
    java="${JAVA_HOME:+${JAVA_HOME}/bin/}java"
    # TMPDIR (the scratch volume: the root filesystem is read-only) is the JVM's temporary folder too.
    if [ -n "${TMPDIR:-}" ]; then opts=("-Djava.io.tmpdir=${TMPDIR}" "${opts[@]}"); fi
    exec "$java" "${opts[@]}" -Xms"${SPARK_EXECUTOR_MEMORY}" -Xmx"${SPARK_EXECUTOR_MEMORY}" -cp "$classpath" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "${SPARK_DRIVER_URL}" --executor-id "${SPARK_EXECUTOR_ID}" --cores "${SPARK_EXECUTOR_CORES}" \
      --app-id "${SPARK_APPLICATION_ID}" --hostname "${SPARK_EXECUTOR_POD_IP}" \
      --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" --podName "${SPARK_EXECUTOR_POD_NAME:-}"
    ;;
  driver)
    shift
    exec "${SPARK_HOME}/bin/spark-submit" --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS:-0.0.0.0}" \
      --deploy-mode client "$@"
    ;;
  *)
    exec "$@"
    ;;
esac
