"""The opt-in Spark UI Service of a stream (``job.metrics.uiService``): its name, its body, and what of an
observed one matters. Pure: the planner (``planner/spark_ui.py``) decides, the loop applies.

``<stream>-ui``, a ClusterIP Service owned by the stream (collected with it), with one port, ``spark-ui``, to
the driver's UI port. It selects the stream's driver Pods serving the UI (``children.stream_selector`` and the
``driver-metrics`` label), never the pre-flight, drain or snapshot Pods, whose labels differ. The operator
never runs two drivers of a stream; a failed driver kept for its log is not Ready and a terminating one is
taken out of the endpoints, so the Service reaches whichever driver runs now, and follows a restart without
being changed. Its target port is the container port's name (``metrics``), so a port change needs only the
new driver. Nothing else is exposed: not the driver's RPC or block-manager ports (cluster mode), not the
executors.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eos_job.driver_metrics import PORT_NAME as METRICS_PORT_NAME, DriverMetrics

from .children import (LABEL_COMPONENT, LABEL_DRIVER_METRICS, LABEL_MANAGED_BY, LABEL_STREAM, MANAGED_BY,
                       StreamRef, stream_selector)

PORT_NAME = "spark-ui"
COMPONENT = "spark-ui"


def service_name(stream: str) -> str:
    """``<stream>-ui``: never another child's name (``<stream>-driver`` is the cluster-mode headless Service),
    and within a DNS label for every stream name the CRD admits (at most 56 characters)."""
    return f"{stream}-ui"


def wanted(metrics: DriverMetrics | None) -> bool:
    return metrics is not None and bool(metrics.enabled) and bool(metrics.ui_service)


def selector(stream: str) -> dict[str, str]:
    return {**stream_selector(stream), LABEL_DRIVER_METRICS: "true"}


def service(ref: StreamRef, metrics: DriverMetrics) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": service_name(ref.name), "namespace": ref.namespace,
                         "labels": {LABEL_MANAGED_BY: MANAGED_BY, LABEL_STREAM: ref.name, LABEL_COMPONENT: COMPONENT},
                         "ownerReferences": [ref.owner_reference()]},
            "spec": {"type": "ClusterIP", "selector": selector(ref.name),
                     "ports": [{"name": PORT_NAME, "protocol": "TCP", "port": metrics.port,
                                "targetPort": METRICS_PORT_NAME}]}}


@dataclass(frozen=True)
class ServiceView:
    """What of a Service the planner compares with the one it wants: who owns it, whom it selects, its ports."""
    name: str
    owner_uid: str | None
    selector: tuple[tuple[str, str], ...]
    ports: tuple[tuple[Any, ...], ...]
    type: str

    def same_shape(self, other: "ServiceView") -> bool:
        return (self.selector, self.ports, self.type) == (other.selector, other.ports, other.type)


def service_view(obj: dict[str, Any]) -> ServiceView:
    """A ServiceView of a Service as the API returns it, or as :func:`service` builds it."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    owner = next((o.get("uid") for o in meta.get("ownerReferences") or [] if o.get("controller")), None)
    ports = tuple((p.get("name"), p.get("protocol", "TCP"), p.get("port"), p.get("targetPort"))
                  for p in spec.get("ports") or [])
    return ServiceView(name=meta.get("name", ""), owner_uid=owner,
                       selector=tuple(sorted((spec.get("selector") or {}).items())), ports=ports,
                       type=spec.get("type", "ClusterIP"))
