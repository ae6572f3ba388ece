"""The checkpoint probe: for ``checkpoint.store: pvc``, a launch reads the checkpoint where it is mounted.

The operator mounts no claim, so before resolution a short-lived Pod of the stream, ``<stream>-probe-<n>``
(same image, ServiceAccount and claim as the driver, on any node: every driver is gone by then, so the
ReadWriteOnce claim is free), runs ``python -m eos_job probe`` on the launch's run config and reports the
checkpoint's batches in its termination message. The launch records them (``PendingLaunch.checkpointFacts``)
and resolution reads the ledger against them, as it does for a checkpoint it can read itself (local, S3):
``status.resolution`` then names the checkpoint's last committed batch and the batch a restart replays.

An upgrade on a pvc checkpoint reads the old driver's snapshot manifest and the checkpoint's state the same
way once that driver is gone (``<stream>-check-<n>``, ``eos-job probe --snapshot``): the snapshot is then
verified and the fallback decided as for a store the operator reads itself.

A probe that fails or does not start within ``job.driver.startTimeoutSeconds`` is a failed start under the
restart strategy (reason ProbeFailed), as a failed resolution is.
"""
from __future__ import annotations

import json
from typing import Callable

from eos_job.spec import ExactlyOnceStreamSpec, RunConfig
from eos_job.status import CheckpointFacts, PendingLaunch
from pydantic import ValidationError

from .. import children
from ..actions import ApplyConfigMap, CreatePod, DeletePod, Plan
from ..observed import PodView
from ..start_failures import report_blocked
from .restarts import aux_failed
from .step import POLL_SECONDS, Cond, StreamStep, not_starting

PROBE_BLOCKED = "ProbeStartBlocked"   # Ready=False: a probe Pod cannot start (a missing claim, an image...)


def needs_probe(spec: ExactlyOnceStreamSpec, launch: PendingLaunch, config: RunConfig) -> bool:
    """A pvc checkpoint whose facts this launch has not read yet (or read for another location)."""
    facts = launch.checkpoint_facts
    return spec.checkpoint.store == "pvc" and (facts is None or facts.checkpoint_dir != config.checkpoint_dir)


def probe(step: StreamStep, spec: ExactlyOnceStreamSpec, launch: PendingLaunch, config: RunConfig,
          ready_reason: str, degraded_cond: Cond, *, component: str = children.PROBE, snapshot: str | None = None,
          record: Callable[[CheckpointFacts], None] | None = None) -> Plan:
    """One step of a probe Pod ``<stream>-<component>-<attempt>``: create it, wait for it, hand what it read to
    ``record`` (default: the launch's ``checkpointFacts``), or count its failure."""
    st, obs = step.st, step.obs
    ref = children.StreamRef(obs.name, obs.namespace, obs.uid)
    name = children.aux_pod_name(obs.name, component, launch.attempt)
    pod = obs.aux_pod(name)
    where = f"claim {spec.checkpoint.claim_name}"
    if pod is None:
        step.act(ApplyConfigMap(children.run_config_map(ref, config, children.aux_config_name(obs.name, component))))
        step.act(CreatePod(children.aux_pod(ref, spec, component=component, attempt=launch.attempt,
                                            tx_generation=st.tx_generation,
                                            args=["probe", "--config-env", children.RUN_CONFIG_ENV,
                                                  *(["--snapshot", snapshot] if snapshot else [])])))
        step.conditions(("False", ready_reason, f"reading the checkpoint on {where}"),
                        ("True", "Resolving", f"{name} reads {config.checkpoint_dir} on {where}"), degraded_cond)
        return step.done(requeue_after=POLL_SECONDS)
    if pod.deleting:
        return step.done(requeue_after=POLL_SECONDS)
    if pod.phase == "Succeeded":
        facts, failure = parse_facts(pod)
        step.act(DeletePod(pod.name, 0))
        if facts is not None and facts.checkpoint_dir == config.checkpoint_dir:
            if record is None:
                st.pending_launch = launch.model_copy(update={"checkpoint_facts": facts})
            else:
                record(facts)
            return step.done(again=True)
        if facts is not None:   # a probe of an earlier plan's location: read again
            return step.done(requeue_after=POLL_SECONDS)
    else:
        failure = not_starting(pod, spec, obs.now) or (pod.failure_text() if pod.phase == "Failed" else None)
        if failure:
            step.act(DeletePod(pod.name, 0))
    if failure:
        return aux_failed(step, spec, launch, f"checkpoint probe: {failure}", failed_reason="ProbeFailed",
                          progressing="Resolving", what="the probe", ready_reason=ready_reason,
                          degraded_cond=degraded_cond)
    if pod.blocked:
        # Its claim does not exist or is not bound, its image cannot be pulled...: the first Pod of the stream
        # that needs them says why, as a driver would (one event per cause).
        message = report_blocked(step, st.conditions, PROBE_BLOCKED, "probe", pod,
                                 spec.job.driver.start_timeout_seconds)
        step.conditions(("False", PROBE_BLOCKED, message), ("True", "Resolving", f"waiting for {name}"),
                        degraded_cond)
        return step.done(requeue_after=POLL_SECONDS)
    step.conditions(("False", ready_reason, f"reading the checkpoint on {where}"),
                    ("True", "Resolving", f"{name} is {pod.phase}"), degraded_cond)
    return step.done(requeue_after=POLL_SECONDS)


def parse_facts(pod: PodView) -> tuple[CheckpointFacts | None, str | None]:
    """The facts a successful probe wrote as its termination message, or why there are none."""
    text = (pod.message or "").strip()
    if not text:
        return None, f"{pod.name} left no termination message"
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.get("reason") != "Probed":
            return None, f"{pod.name} reported {text[:200]!r}"
        return CheckpointFacts.model_validate({k: v for k, v in doc.items() if k != "reason"}), None
    except (ValueError, ValidationError) as exc:
        return None, f"{pod.name}'s termination message is not a probe result ({exc.__class__.__name__}): {text[:200]!r}"
