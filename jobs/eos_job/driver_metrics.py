"""Driver metrics for Prometheus (``job.metrics``): Spark's own metrics system, served by its Prometheus servlet.

Spark serves ``/metrics/prometheus`` on the driver's UI port (a servlet of the UI's Jetty server), so the UI
must be on while metrics are: ``spark.ui.enabled=true`` on ``job.metrics.port``. What each setting is for:

* ``spark.metrics.conf.*.sink.prometheusServlet.*``: the servlet sink, at :data:`METRICS_PATH`.
* ``spark.metrics.namespace=eos``: Spark prefixes every name with the application id otherwise (a new one
  per driver), and no dashboard or relabeling could name the series; with it a name reads
  ``metrics_eos_driver_<source>_<metric>_Value``.
* ``spark.sql.streaming.metricsEnabled``: the query's source, ``spark.streaming.<query name>``: batch duration
  (``latency``, ms), ``inputRate-total`` and ``processingRate-total`` (rows per second), ``states-rowsTotal``
  and ``states-usedBytes`` (stateful queries), ``eventTime-watermark``.
* ``spark.metrics.conf.driver.source.jvm.class``: the JVM's heap, non-heap and GC (``jvm_heap_used``, ...).
* ``spark.ui.killEnabled=false``: the UI is now reachable by whoever reaches the Pod's port; it may show the
  job but not kill its stages (a kill fails the batch and restarts the driver).
* ``spark.metrics.staticSources.enabled`` stays on (Spark's default): code generation and the hive catalog.

The chart's PodMonitor (``monitoring.driverPodMonitor``) renames these to ``spark_streaming_*`` with a
``query`` label and ``spark_driver_*`` (``charts/spark-eos-operator/templates/driver-podmonitor.yaml``).

The UI binds to ``SPARK_LOCAL_IP`` when set, else to every address. The runtime sets ``SPARK_LOCAL_IP=127.0.0.1``
in local mode (everything on loopback), so a Pod with metrics on sets it to ``0.0.0.0``, every address of the
Pod (``eos_operator.children``): the servlet is reachable at the Pod's IP, the UI through ``kubectl port-forward``
at loopback (``kubectl eos ui``), RPC stays on loopback (``spark.driver.bindAddress``).
"""
from __future__ import annotations

from pydantic import ConfigDict, Field

from .model import Model

METRICS_PATH = "/metrics/prometheus"
METRICS_NAMESPACE = "eos"
DEFAULT_PORT = 4040
PORT_NAME = "metrics"
UI_SERVICE_FIX = ("the Service forwards to Spark's UI, which the driver serves only with job.metrics.enabled: "
                  "true; set job.metrics.enabled: true (a restart of the driver) or remove uiService")


class DriverMetrics(Model):
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "!has(self.uiService) || self.uiService != true || (has(self.enabled) && self.enabled == true)",
         "fieldPath": ".uiService", "message": f"spec.job.metrics.uiService: {UI_SERVICE_FIX}"}]})

    enabled: bool = Field(False, description=(
        "Serve the driver's Spark metrics (batch duration, input and processed rows per second, state rows and "
        "memory, JVM heap) for Prometheus at /metrics/prometheus on the port, named metrics on the driver Pod, "
        "which then carries the label streaming.eos.dev/driver-metrics=true for the chart's PodMonitor. Turns "
        "on Spark's UI (the servlet is part of it). A change restarts the driver."))
    port: int = Field(DEFAULT_PORT, ge=1024, le=65535, description=(
        "The driver's UI and metrics port (spark.ui.port); in cluster mode not 7078 or 7079 (the driver's RPC)."))
    # None, not False, when unset: the run ConfigMap leaves it out, so existing specs hash the same.
    ui_service: bool | None = Field(None, description=(
        "A ClusterIP Service <stream>-ui, owned by the stream, whose one port, named spark-ui, is the driver's "
        "UI port on whichever driver Pod of the stream runs now (kubectl eos ui forwards through it). Needs "
        "enabled: true. Turning it on or off creates or deletes the Service, without a restart."))


def spark_conf(metrics: DriverMetrics | None) -> dict[str, str]:
    """The Spark settings of ``job.metrics`` ({} when off)."""
    if metrics is None or not metrics.enabled:
        return {}
    return {
        "spark.ui.enabled": "true",
        "spark.ui.killEnabled": "false",
        "spark.ui.port": str(metrics.port),
        "spark.metrics.namespace": METRICS_NAMESPACE,
        "spark.metrics.conf.*.sink.prometheusServlet.class": "org.apache.spark.metrics.sink.PrometheusServlet",
        "spark.metrics.conf.*.sink.prometheusServlet.path": METRICS_PATH,
        "spark.metrics.conf.driver.source.jvm.class": "org.apache.spark.metrics.source.JvmSource",
        "spark.sql.streaming.metricsEnabled": "true",
    }


def owned_conf_errors(spec, field: str, keys, why: str) -> list[str]:
    """``job.sparkConf`` keys among ``keys`` that ``field`` (on) sets for the runtime: each refused, named."""
    return [f"job.sparkConf.{k}: set from {field} while {field}.enabled is true ({why}); remove it"
            for k in dict.fromkeys(keys) if k in spec.job.spark_conf]


def metrics_errors(spec) -> list[str]:
    """With ``job.metrics.enabled`` the settings the servlet and the chart's relabeling rely on are the
    runtime's: sparkConf may not set them. ``uiService`` needs the UI on (the CRD's rule says so too)."""
    metrics = spec.job.metrics
    if metrics is not None and metrics.ui_service and not metrics.enabled:
        return [f"job.metrics.uiService: {UI_SERVICE_FIX}"]
    if metrics is None or not metrics.enabled:
        return []
    return owned_conf_errors(spec, "job.metrics", spark_conf(metrics),
                             "the driver's metrics and the chart's PodMonitor rely on it")
