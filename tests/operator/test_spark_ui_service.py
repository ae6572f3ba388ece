"""job.metrics.uiService without a server: the Service's body and whom it selects, the pure planning in every
state (made, kept, changed, left alone when not ours, deleted when turned off), the validation, that a toggle
restarts nothing, and the reconcile loop over the fake API (best effort: a refused Service never holds up the
driver, with its negative control). The Service on the real nodes: tests/e2e/test_real_node_stream.py."""
from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from datetime import timedelta

from eos_job.driver_metrics import DriverMetrics
from eos_job.spec import ExactlyOnceStreamSpec
from eos_job.status import ExactlyOnceStreamStatus, PendingLaunch
from eos_operator import children, spark_ui, upgrades
from eos_operator.actions import ApplyService, DeletePod, DeleteService, Resolve
from eos_operator.children import StreamRef
from eos_operator.observed import Observed, PodView
from eos_operator.planner import plan
from eos_operator.planner import spark_ui as ui_planner
from eos_operator.planner.upgrade import overlay_spec
from eos_operator.reconciler import Deps, reconcile
from eos_operator.upgrades import spec_json
from eos_operator.validation import InvalidSpec, validate_spec

from .fakes import T0, FakeClock, FakeKube, FakeResolver, base_spec

UID = "0f6c2a1e-1111-2222-3333-444455556666"
REF = StreamRef("colors", "default", UID)
METRICS = {"enabled": True, "port": 4321}
UI = {**METRICS, "uiService": True}


def spec(metrics: dict | None = None, **job) -> ExactlyOnceStreamSpec:
    s = validate_spec(base_spec(job={"module": "m", **({"metrics": metrics} if metrics else {}), **job}))
    assert isinstance(s, ExactlyOnceStreamSpec), s
    return s


def observed(*pods: PodView, service: dict | None = None) -> Observed:
    return Observed(name="colors", namespace="default", uid=UID, generation=1, now=T0 + timedelta(seconds=1),
                    pods=pods, ui_service=None if service is None else spark_ui.service_view(service))


def running(s: ExactlyOnceStreamSpec, **kw) -> ExactlyOnceStreamStatus:
    return ExactlyOnceStreamStatus(lifecycle_state="Running", driver_pod="colors-driver-0",
                                   last_reconciled_spec=spec_json(s), observed_restart_nonce=0,
                                   running_since="2026-01-01T00:00:00Z", **kw)


def driver(phase: str = "Running") -> PodView:
    return PodView(name="colors-driver-0", phase=phase, attempt=0, owner_uid=UID)


def ui_actions(p) -> list:
    return [a for a in p.actions if isinstance(a, (ApplyService, DeleteService))
            and (a.body["metadata"]["name"] if isinstance(a, ApplyService) else a.name) == "colors-ui"]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


# ------------------------------------------------------------------ the Service
def test_the_service_is_a_clusterip_owned_by_the_stream_with_one_port_to_the_ui():
    body = spark_ui.service(REF, spec(UI).job.metrics)
    assert body["kind"] == "Service" and body["metadata"]["name"] == "colors-ui"
    assert body["metadata"]["ownerReferences"] == [REF.owner_reference()]
    assert body["metadata"]["ownerReferences"][0]["uid"] == UID and body["metadata"]["ownerReferences"][0]["controller"]
    assert body["spec"]["type"] == "ClusterIP" and "clusterIP" not in body["spec"]
    # Nothing else exposed: one port, named spark-ui, to the container port named metrics (the UI's).
    assert body["spec"]["ports"] == [{"name": "spark-ui", "protocol": "TCP", "port": 4321, "targetPort": "metrics"}]
    assert spark_ui.service_name("colors") != children.driver_service_name("colors")


def test_it_selects_the_streams_ui_serving_drivers_only():
    sel = spark_ui.service(REF, spec(UI).job.metrics)["spec"]["selector"]
    for attempt in (0, 7):   # any attempt: the current driver, whichever it is
        pod = children.driver_pod(REF, spec(UI), attempt=attempt, tx_generation=0)
        assert selects(sel, pod["metadata"]["labels"])
        port = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
        assert port["metrics"] == 4321      # the named target port exists on the Pod
    # Not the pre-flight, drain or probe Pods (same image and spec), not another stream's driver, not a driver
    # started without the UI.
    for component in children.AUX_COMPONENTS:
        aux = children.aux_pod(REF, spec(UI), component=component, attempt=1, tx_generation=0, args=["x"])
        assert not selects(sel, aux["metadata"]["labels"]), component
    other = children.driver_pod(StreamRef("colors2", "default", "u2"), spec(UI), attempt=0, tx_generation=0)
    assert not selects(sel, other["metadata"]["labels"])
    dark = children.driver_pod(REF, spec(), attempt=0, tx_generation=0)
    assert not selects(sel, dark["metadata"]["labels"])


# ------------------------------------------------------------------ planning
def test_off_by_default_nothing_made_nothing_read():
    for s in (spec(), spec(METRICS), spec({**METRICS, "uiService": False})):
        p = plan(s, running(s), observed(driver()))
        assert ui_actions(p) == [] and p.status.ui_service is None
    assert spark_ui.wanted(spec(METRICS).job.metrics) is False


def test_on_it_is_recorded_then_made_in_any_state():
    s = spec(UI)
    states = {"running": (running(s), observed(driver())),
              "created": (ExactlyOnceStreamStatus(), observed()),
              "suspended": (running(s), observed())}
    for what, (st, obs) in states.items():
        sp = spec(UI, state="suspended") if what == "suspended" else s
        p = plan(sp, st, obs)
        (act,) = ui_actions(p)
        assert isinstance(act, ApplyService) and act.best_effort, what
        assert act.body == spark_ui.service(REF, s.job.metrics), what
        assert p.status.ui_service == "colors-ui", what           # written before the Service is made
        assert "SparkUiService" in [e.reason for e in p.events], what
    # A running driver keeps running: no stop, no resolution, no new Pod for the Service.
    p = plan(s, running(s), observed(driver()))
    assert not [a for a in p.actions if isinstance(a, (DeletePod, Resolve))]


def test_it_is_made_after_what_the_state_decided():
    # The launch's own actions come first: a refused Service (best effort) cannot stand in front of them.
    s = spec(UI)
    st = ExactlyOnceStreamStatus(lifecycle_state="Deploying", observed_restart_nonce=0, last_reconciled_spec=None,
                                 pending_launch=PendingLaunch(attempt=0, pod="colors-driver-0", reason="Create",
                                                              resolved_spec_hash=s.spec_hash()))
    p = plan(s, st, observed())
    kinds = [type(a).__name__ for a in p.actions]
    assert kinds[-1] == "ApplyService" and "CreatePod" in kinds[:-1], kinds


def test_kept_when_there_and_applied_again_when_changed():
    s = spec(UI)
    there = spark_ui.service(REF, s.job.metrics)
    p = plan(s, running(s, ui_service="colors-ui"), observed(driver(), service=there))
    assert ui_actions(p) == [] and p.status.ui_service == "colors-ui"
    assert "SparkUiService" not in [e.reason for e in p.events]
    changed = json.loads(json.dumps(there))
    changed["spec"]["ports"][0]["port"] = 4040     # edited by hand, or made for another port
    p = plan(s, running(s, ui_service="colors-ui"), observed(driver(), service=changed))
    (act,) = ui_actions(p)
    assert isinstance(act, ApplyService) and act.body["spec"]["ports"][0]["port"] == 4321


def test_a_service_of_that_name_the_stream_does_not_own_is_left_alone():
    s = spec(UI)
    foreign = spark_ui.service(StreamRef("colors", "default", "someone-else"), s.job.metrics)
    p = plan(s, running(s), observed(driver(), service=foreign))
    assert ui_actions(p) == [] and p.status.ui_service is None
    (warning,) = [e for e in p.events if e.reason == ui_planner.NOT_OURS]
    assert warning.type == "Warning" and "delete or rename that Service" in warning.message


def test_turned_off_it_is_deleted_then_forgotten_once_gone():
    s = spec(METRICS)
    ours = spark_ui.service(REF, spec(UI).job.metrics)
    p = plan(s, running(s, ui_service="colors-ui"), observed(driver(), service=ours))
    (act,) = ui_actions(p)
    assert isinstance(act, DeleteService) and act.owner_uid == UID and act.best_effort
    assert p.status.ui_service == "colors-ui"                  # kept until it is seen gone
    assert p.requeue_after is not None and p.requeue_after <= 2.0
    p = plan(s, running(s, ui_service="colors-ui"), observed(driver()))
    assert ui_actions(p) == [] and p.status.ui_service is None
    # metrics off altogether (a restart of its own) deletes it too
    p = plan(spec(), running(spec(METRICS), ui_service="colors-ui"), observed(driver(), service=ours))
    assert [type(a) for a in ui_actions(p)] == [DeleteService]


def test_the_streams_deletion_deletes_it_by_name_and_uid():
    p = plan(spec(UI), running(spec(UI), ui_service="colors-ui"), replace(observed(), deleting=True))
    assert DeleteService("colors-ui", UID) in p.actions


# ------------------------------------------------------------------ validation and upgrades
def test_without_the_ui_it_is_refused_naming_the_field_and_the_fix():
    for metrics in ({"uiService": True}, {"enabled": False, "uiService": True}):
        res = validate_spec(base_spec(job={"module": "m", "metrics": metrics}))
        assert isinstance(res, InvalidSpec), metrics
        (err,) = [e for e in res.errors if "uiService" in e]
        assert err.startswith("spec.job.metrics.uiService:") and "set job.metrics.enabled: true" in err, err
    # The CRD says the same to the API server (the invalid corpus has the file: ui-service-without-metrics).
    rules = DriverMetrics.model_config["json_schema_extra"]["x-kubernetes-validations"]
    assert rules[0]["fieldPath"] == ".uiService" and rules[0]["message"].startswith("spec.job.metrics.uiService:")


def test_a_toggle_restarts_nothing_and_reaches_no_runtime():
    off, on = spec(METRICS), spec(UI)
    assert upgrades.run_affecting_changes(spec_json(off), on) == []
    assert upgrades.run_affecting_changes(spec_json(on), off) == []
    assert upgrades.classify("job.metrics.uiService") == "ignore"
    # Negative control: the same comparison sees a real metrics change.
    assert upgrades.run_affecting_changes(spec_json(off), spec({"enabled": True, "port": 4040})) == ["job.metrics.port"]
    # The driver Pod is the same with and without it, and the runtime's config never carries it.
    pods = [children.driver_pod(REF, s, attempt=0, tx_generation=0) for s in (off, on)]
    for pod in pods:
        pod["metadata"]["annotations"].pop(children.ANNOTATION_SPEC_HASH)
    assert pods[0] == pods[1]
    data = children.run_config_map(REF, children.run_config(REF, on, 0))["data"][children.RUN_CONFIG_KEY]
    assert "uiService" not in data and json.loads(data)["spec"]["job"]["metrics"]["port"] == 4321
    # Unset, a spec hashes as before the field existed.
    assert "uiService" not in json.dumps(off.wire())


def test_a_rejected_specs_overlay_does_not_invent_metrics():
    stable = spec()                            # the last stable spec had no job.metrics
    current = spec(UI)
    assert overlay_spec(spec_json(stable), current).job.metrics is None
    assert upgrades.run_affecting_changes(spec_json(stable), overlay_spec(spec_json(stable), current)) == []
    with_metrics = spec(METRICS)               # ... it had them: the option follows the current spec
    assert overlay_spec(spec_json(with_metrics), current).job.metrics.ui_service is True


# ------------------------------------------------------------------ the reconcile loop
def make(metrics: dict):
    kube, clock = FakeKube(), FakeClock()
    kube.add_stream("colors", base_spec(job={"module": "m", "metrics": metrics}))
    return kube, Deps(kube=kube, resolver=FakeResolver(kube=kube), clock=clock)


def rec(deps):
    return asyncio.run(reconcile("default", "colors", deps))


def test_made_with_the_driver_deleted_when_off_made_again_when_on():
    kube, deps = make(UI)
    rec(deps)
    uid = kube.stream("colors")["metadata"]["uid"]
    svc = kube.services[("default", "colors-ui")]
    assert svc["metadata"]["ownerReferences"][0]["uid"] == uid
    assert kube.created_pods == ["colors-driver-0"]
    assert kube.stream("colors")["status"]["uiService"] == "colors-ui"
    kube.set_pod_phase("colors-driver-0", "Running")
    rec(deps)
    del kube.services[("default", "colors-ui")]          # deleted by hand: made again on the next pass
    rec(deps)
    assert ("default", "colors-ui") in kube.services
    kube.update_spec("colors", lambda sp: sp["job"]["metrics"].update(uiService=False))
    rec(deps)
    rec(deps)
    assert ("default", "colors-ui") not in kube.services
    assert kube.stream("colors")["status"].get("uiService") is None
    kube.update_spec("colors", lambda sp: sp["job"]["metrics"].update(uiService=True))
    rec(deps)
    assert ("default", "colors-ui") in kube.services
    assert kube.created_pods == ["colors-driver-0"] and kube.deleted_pods == []   # no restart all along


def test_a_refused_service_is_reported_and_holds_up_nothing():
    kube, deps = make(UI)
    kube.fail_apply_service = 10
    rec(deps)
    assert kube.created_pods == ["colors-driver-0"]
    assert "SparkUiServiceFailed" in kube.reasons()
    assert "services is forbidden" in kube.messages_for("ExactlyOnceStream", "SparkUiServiceFailed")[0]
    kube.fail_apply_service = 0
    rec(deps)
    assert ("default", "colors-ui") in kube.services


def test_negative_control_the_same_refusal_not_best_effort_stops_the_launch(monkeypatch):
    # The safety switched off: the Service's apply as an ordinary action. The same refusal now counts as the
    # launch's own (Refused, retried every 30 s) and no driver is created.
    monkeypatch.setattr(ui_planner, "ApplyService", lambda body, best_effort: ApplyService(body))
    kube, deps = make(UI)
    kube.fail_apply_service = 10
    rec(deps)
    rec(deps)
    assert kube.created_pods == []
    assert "Refused" in kube.reasons() and "SparkUiServiceFailed" not in kube.reasons()
