"""The Spark UI Service (``job.metrics.uiService``, ``eos_operator.spark_ui``) in any state of the stream: made
when the option is on, made again when it went missing or changed, deleted when the option is off.

Applied after the state's branch has planned, and its actions are marked ``best_effort``: a Service the API
server refuses is reported (a Warning event) and never holds up a launch, a restart or a stop. The name is
recorded in ``status.uiService`` before the Service is created (the write-ahead log), so a stream whose option
is turned off later deletes exactly what it made; the status entry goes once the Service is seen gone. A
Service of that name the stream does not own is left alone, and said so.
"""
from __future__ import annotations

from eos_job.spec import ExactlyOnceStreamSpec

from .. import spark_ui
from ..actions import ApplyService, DeleteService, Event, Plan
from ..children import StreamRef
from ..observed import Observed
from .step import POLL_SECONDS

NOT_OURS = "SparkUiServiceNameTaken"


def plan_ui_service(observed: Observed, spec: ExactlyOnceStreamSpec, plan: Plan) -> Plan:
    """``plan`` (what the state's branch decided) with the UI Service's actions appended, its events and
    ``status.uiService``."""
    st, obs = plan.status, observed
    name = spark_ui.service_name(obs.name)
    seen = obs.ui_service
    ours = seen is not None and seen.owner_uid == obs.uid
    if spark_ui.wanted(spec.job.metrics):
        if seen is not None and not ours:
            plan.events.append(Event("Warning", NOT_OURS, f"Service {name} exists and is not this stream's: "
                                                          "job.metrics.uiService makes no Service; delete or "
                                                          "rename that Service"))
            return plan
        body = spark_ui.service(StreamRef(obs.name, obs.namespace, obs.uid), spec.job.metrics)
        st.ui_service = name
        if seen is None or not seen.same_shape(spark_ui.service_view(body)):
            plan.actions.append(ApplyService(body, best_effort=True))
            if seen is None:
                plan.events.append(Event("Normal", "SparkUiService", (
                    f"Service {name} (port {spark_ui.PORT_NAME}, {spec.job.metrics.port}) reaches the running "
                    "driver's Spark UI: kubectl eos ui forwards through it")))
        return plan
    if st.ui_service is None:
        return plan
    if ours:
        plan.actions.append(DeleteService(st.ui_service, obs.uid, best_effort=True))
        plan.events.append(Event("Normal", "SparkUiServiceDeleted",
                                 f"job.metrics.uiService is off: deleting Service {st.ui_service}"))
        # Look again soon: the status entry goes once the Service is seen gone.
        plan.requeue_after = min(plan.requeue_after or POLL_SECONDS, POLL_SECONDS)
    else:
        st.ui_service = None     # gone (or never ours): nothing left to delete
    return plan
