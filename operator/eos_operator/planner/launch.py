"""A launch in flight, one idempotent step at a time:

    wait for the restart delay -> stop every other driver Pod and see it gone -> (upgrade: the old
    driver's snapshot or the fallback; drain) -> (pvc: probe the checkpoint on the claim) -> resolve
    (record the report) -> apply the run
    ConfigMap and create the Pod -> see the Pod -> clear PendingLaunch

An operator killed between any two steps re-reads the status and continues the same launch: the
Pod name is fixed when the launch is recorded, so a repeated create is a 409 and never a second
driver. Also here: what resolution's result does to the status, and the deletion of a stream.
"""
from __future__ import annotations

from datetime import timedelta

from eos_job.spec import ExactlyOnceStreamSpec, RunConfig
from eos_job.status import ExactlyOnceStreamStatus, PendingLaunch, ResolutionReport, UpgradeCheck, UpgradeProgress

from .. import children
from ..actions import (ApplyConfigMap, ApplyService, CreatePod, CreateSnapshot, DeleteConfigMap, DeleteService,
                       Event, Plan, Resolve)
from ..conditions import DEGRADED, get_condition
from ..observed import Observed
from ..start_failures import REFUSED_FIX, REFUSED_REASON, REFUSED_RETRY_SECONDS, refusal_text
from ..timeutil import fmt, fmt_ceil, parse, seconds_between
from ..upgrades import current_checkpoint_dir, run_affecting_changes, spec_json
from .housekeeping import snapshot_resource_for
from .step import POLL_SECONDS, Cond, StreamStep, abandon_upgrade, degraded, kept, stop_pods

DELETION_SLACK_SECONDS = 60.0   # past the driver's grace period: a deletion that waits says so
from .upgrade import after_stop, drain, needs_drain, restore_source_missing, restore_text, spec_changed
from .probe import needs_probe, probe
from .node_loss import replaceable


def continue_launch(step: StreamStep, spec: ExactlyOnceStreamSpec, launch: PendingLaunch) -> Plan:
    st, obs = step.st, step.obs
    progressing_reason = {"Restart": "Restarting", "SpecChange": "Upgrading",
                          "RestartRequested": "Restarting"}.get(launch.reason, "Launching")
    recorded = get_condition(st.conditions, DEGRADED)
    degraded_cond: Cond = (recorded.status, recorded.reason, recorded.message) if recorded else degraded(st)
    ready_reason = "Deploying" if progressing_reason == "Launching" else progressing_reason

    # 1. The restart delay.
    not_before = parse(launch.not_before)
    if not_before is not None and obs.now < not_before:
        wait = seconds_between(obs.now, not_before)
        step.conditions(("False", ready_reason, st.last_error or f"restart at {launch.not_before}"),
                        ("True", progressing_reason, f"{launch.pod} starts at {launch.not_before}"),
                        degraded_cond)
        return step.done(requeue_after=max(wait, 0.1))

    # 1b. The API server refused a Pod or object of this launch: say why, and retry after a pause (a
    # namespace's policy, a quota or a name can change; a tight loop of refused creates helps nobody).
    refused_at = parse(launch.refused_at)
    if launch.refused and refused_at is not None and seconds_between(refused_at, obs.now) < REFUSED_RETRY_SECONDS:
        wait = REFUSED_RETRY_SECONDS - seconds_between(refused_at, obs.now)
        step.conditions(("False", launch.refused_reason or REFUSED_REASON, launch.refused),
                        ("True", progressing_reason, f"retrying {launch.pod} in {wait:.0f}s"), degraded_cond)
        return step.done(requeue_after=max(wait, 0.1))

    # 2. Never two drivers: every other driver Pod of the stream must be gone first, but one on a node lost
    # for NODE_LOSS_GRACE_SECONDS (deleted, it stays until the node's kubelet returns): the new driver's epoch
    # fences it (node_loss.py).
    others = [p for p in obs.pods if (p.name != launch.pod or p.owner_uid not in (None, obs.uid))
              and not kept(step, p)]
    lost = [p for p in others if replaceable(obs, p)]
    stop_pods(step, lost)
    others = [p for p in others if p not in lost]
    if others:
        stop_pods(step, others)
        names = ", ".join(p.name for p in others)
        up = st.upgrade
        if up is not None and up.step == "Stopping" and up.snapshot_path:
            names += f" (it writes snapshot {up.snapshot_name} at a clean batch boundary)"
        step.conditions(("False", ready_reason, f"stopping {names}"),
                        ("True", "StoppingDriver", f"waiting for {names} to be gone before starting {launch.pod}"),
                        degraded_cond)
        # A finished Pod is removed at once; look again right away instead of at the next tick.
        return step.done(requeue_after=POLL_SECONDS, again=all(p.terminal and not p.deleting for p in others))

    # 3. The Pod exists: the launch happened (maybe by an operator that died right after).
    if obs.pod(launch.pod) is not None:
        st.pending_launch = None
        st.driver_pod = launch.pod
        st.driver_attempt = launch.attempt
        st.next_restart_time = None
        st.running_since = None
        step.event("Normal", "Submitted", f"driver Pod {launch.pod} created (attempt {launch.attempt}, "
                                          f"{launch.reason})")
        if st.lifecycle_state not in ("Restarting", "Upgrading"):
            st.lifecycle_state = "Deploying"
        step.conditions(("False", ready_reason, f"driver Pod {launch.pod} submitted"),
                        ("True", progressing_reason, f"waiting for {launch.pod} to run"), degraded_cond)
        return step.done(again=True)

    # 3b. An upgrade: the old driver is gone; its snapshot, or the fallback, decides where the new one starts.
    if st.upgrade is not None and st.upgrade.step == "Stopping":
        return after_stop(step, spec, st.upgrade, ready_reason, degraded_cond)

    # 3b'. The spec changed again while this upgrade was on its way and the old driver is gone: decide the
    # upgrade afresh for the spec now wanted, or the change would launch with the old plan and be lost
    # (a restoreFrom never restored, a parallelism change without its drain).
    up = st.upgrade
    if (up is not None and not up.rollback and up.step == "Stopped" and st.last_reconciled_spec
            and spec.spec_hash() != up.target_spec_hash and all(p.terminal for p in obs.aux_pods)):
        abandon_upgrade(st)
        return spec_changed(step, spec, run_affecting_changes(st.last_reconciled_spec, spec),
                            not_before=launch.not_before)

    # 3c. A first start with spec.restoreFrom: a new checkpoint location seeded from that snapshot.
    if st.upgrade is None and spec.restore_from and st.last_reconciled_spec is None:
        src = obs.restore_source
        if src is None or src.path is None:
            return restore_source_missing(step, spec)
        st.upgrade = UpgradeProgress(mode="snapshot", step="Stopped", target_spec_hash=spec.spec_hash(),
                                     checkpoint_dir=children.upgrade_checkpoint_dir(spec, obs.uid, launch.attempt),
                                     restore_from=src.path, previous_tx_generation=st.tx_generation,
                                     requested_at=fmt(obs.now), note=f"restoring from {spec.restore_from}")
        return step.done(again=True)

    # 3d. An upgrade that does not start from a clean-boundary snapshot first finishes, with the old
    # spec, any batch the old driver left uncommitted (a partially committed batch must not be
    # re-run under another slot count or another job).
    if st.upgrade is not None and needs_drain(st, st.upgrade):
        return drain(step, spec, st.upgrade, launch, ready_reason, degraded_cond)

    # 4. Resolution, before every start, for exactly this spec.
    ref = children.StreamRef(obs.name, obs.namespace, obs.uid)
    spec_hash = spec.spec_hash()
    config = launch_config(ref, spec, st)
    if launch.resolved_spec_hash != spec_hash:
        if needs_probe(spec, launch, config):   # a claim: read the checkpoint where it is mounted
            return probe(step, spec, launch, config, ready_reason, degraded_cond)
        step.act(Resolve(config, launch.attempt, spec_hash, launch.checkpoint_facts))
        step.conditions(("False", ready_reason, "resolving transactions before the start"),
                        ("True", "Resolving", f"fencing and reading the ledger before starting {launch.pod}"),
                        degraded_cond)
        return step.done(again=True)

    # 5. Submit. The status written first names the Pod, the spec it runs and its checkpoint location;
    # the same write closes the upgrade record.
    st.last_reconciled_spec = spec_json(spec)
    st.driver_pod = launch.pod
    st.driver_attempt = launch.attempt
    st.checkpoint_dir = config.checkpoint_dir
    st.restore_from = config.restore_from
    st.replay_offsets_from = config.replay_offsets_from
    st.snapshot_on_stop = children.snapshot_path(ref, spec, launch.attempt)
    if st.upgrade is not None and st.upgrade.note.startswith("restoring from") and spec.restore_from:
        step.event("Normal", "Restored", restore_text(step, spec, st.upgrade))
        st.restored_from_snapshot = spec.restore_from
    if (st.upgrade is not None and not st.upgrade.rollback and st.upgrade.restore_from
            and st.upgrade.restore_from == st.upgrade.snapshot_path):
        up = st.upgrade
        snap = next((r for r in st.snapshots if r.path == up.snapshot_path), None)
        st.upgrade_check = UpgradeCheck(
            target_spec_hash=spec_hash, pod=launch.pod,
            deadline=fmt_ceil(obs.now + timedelta(seconds=spec.upgrade_readiness_timeout_seconds)),
            baseline_batch=snap.batch if snap else None, rollback_snapshot=up.snapshot_path,
            previous_spec=st.last_stable_spec, previous_tx_generation=up.previous_tx_generation)
    if st.upgrade is not None and st.upgrade.snapshot_path and st.upgrade.restore_from == st.upgrade.snapshot_path:
        # Also here (409 if it exists): an operator killed right after step Stopped did not create it.
        step.act(CreateSnapshot(snapshot_resource_for(step, spec, st.upgrade.snapshot_name
                                                   or st.upgrade.snapshot_path.rsplit("/", 1)[-1], "upgrade",
                                                   path=st.upgrade.snapshot_path)))
    if st.upgrade is not None:
        up = st.upgrade
        how = (f"from snapshot {up.snapshot_name} in the new checkpoint location {up.checkpoint_dir}"
               if up.restore_from else
               f"in the fresh checkpoint location {up.checkpoint_dir} (stateless: new checkpoint identity, "
               "nothing skipped by the ledger)" if up.mode == "stateless" and not up.note else
               f"on the checkpoint {up.checkpoint_dir}")
        step.event("Normal", "Upgraded", f"{launch.pod} starts the new spec {how}, transactional-id generation "
                                         f"{st.tx_generation}" + (f"; {up.note}" if up.note else ""))
        st.upgrade = None
    step.act(ApplyConfigMap(children.run_config_map(ref, config)))
    if spec.job.deploy_mode == "cluster":
        step.act(ApplyService(children.driver_service(ref)))
    step.act(CreatePod(children.driver_pod(ref, spec, attempt=launch.attempt, tx_generation=st.tx_generation,
                                           snapshot_on_stop=st.snapshot_on_stop)))
    step.conditions(("False", ready_reason, f"creating {launch.pod}"),
                    ("True", "Submitting", f"creating driver Pod {launch.pod}"), degraded_cond)
    return step.done(again=True)


def record_refusal(status: ExactlyOnceStreamStatus, what: str, error: str, *, observed: Observed,
                   reason: str = REFUSED_REASON) -> tuple[ExactlyOnceStreamStatus, Event | None]:
    """Status after the API server refused ``what`` (a Pod or object the launch creates): the launch
    keeps its place and retries after REFUSED_RETRY_SECONDS; one event per distinct refusal."""
    st = status.model_copy(deep=True)
    launch = st.pending_launch
    if launch is None:
        return st, None
    fix = (REFUSED_FIX if reason == REFUSED_REASON
           else "fix the credentials, TLS settings, Secrets or ACLs the message names")
    message = refusal_text(what, error, fix)
    event = None if launch.refused == message else Event("Warning", reason, message)
    st.pending_launch = launch.model_copy(update={"refused": message, "refused_at": fmt(observed.now),
                                                  "refused_reason": reason})
    st.last_error = message
    return st, event


def launch_config(ref: children.StreamRef, spec: ExactlyOnceStreamSpec, st: ExactlyOnceStreamStatus) -> RunConfig:
    """What the launched driver runs: the upgrade's checkpoint location if one is in flight, else the current one."""
    up = st.upgrade
    if up is not None:
        return children.run_config(ref, spec, st.tx_generation, checkpoint=up.checkpoint_dir,
                                   restore_from=up.restore_from,
                                   replay_offsets_from=up.replay_offsets_from if up.restore_from else None)
    return children.run_config(ref, spec, st.tx_generation,
                               checkpoint=current_checkpoint_dir(st.checkpoint_dir, st.last_reconciled_spec, spec),
                               restore_from=st.restore_from, replay_offsets_from=st.replay_offsets_from)


def record_resolution(status: ExactlyOnceStreamStatus, report: ResolutionReport, *, attempt: int,
                      spec_hash: str, observed: Observed) -> tuple[ExactlyOnceStreamStatus, Event | None]:
    """Status after a successful resolution for launch ``attempt``; the Resolved event."""
    st = status.model_copy(deep=True)
    launch = st.pending_launch
    if launch is None or launch.attempt != attempt:
        return st, None  # the launch was cancelled or replaced meanwhile; the report is stale
    st.pending_launch = launch.model_copy(update={"resolved_spec_hash": spec_hash})
    st.resolution = report
    if report.last_complete_batch is not None:
        st.last_committed_batch = report.last_complete_batch
    summary = report.summary or summarise(report)
    return st, Event("Normal", "Resolved", f"before starting {launch.pod}: {summary}")


def summarise(r: ResolutionReport) -> str:
    parts = [f"generation {r.generation}, {r.slots} slots", f"fenced {r.fenced_transactional_ids} ids"]
    if not r.checkpoint_readable:
        parts.append("checkpoint not mounted in the operator (read by the driver)")
    if r.open_transactions_aborted:
        parts.append(f"aborted {r.open_transactions_aborted} open transactions")
    if r.last_complete_batch is not None:
        parts.append(f"last complete batch {r.last_complete_batch}")
    if r.replay_batch is not None:
        parts.append(f"replays batch {r.replay_batch}"
                     + (f" (slots {r.replay_slots_already_committed} already committed)"
                        if r.replay_slots_already_committed else ""))
    if r.partially_committed:
        parts.append("partially committed")
    return "; ".join(parts)


def plan_deletion(status: ExactlyOnceStreamStatus, observed: Observed) -> Plan:
    """Stop every driver gracefully, then remove the other children. The checkpoint stays. The children
    are found by name, so each delete names the stream's uid: an object of that name it does not own stays."""
    step = StreamStep(status, observed)
    if observed.pods:
        stop_pods(step, observed.pods)
        stuck = [p.name for p in observed.pods if p.deleting_since and seconds_between(
            parse(p.deleting_since), observed.now) > children.TERMINATION_GRACE_SECONDS + DELETION_SLACK_SECONDS]
        message = (f"deletion waits for {', '.join(stuck)} to stop (its node may be gone); the checkpoint is "
                   "kept. Force it with kubectl delete pod --grace-period=0 --force once you are sure it runs "
                   "nowhere (see docs/operations.md: Deleting without the operator)")
        ready = get_condition(status.conditions, "Ready")
        if stuck and (ready is None or ready.message != message):
            step.event("Warning", "DeletionWaiting", message)
            step.conditions(("False", "DeletionWaiting", message), ("True", "Deleting", message), degraded(step.st))
        return step.done(requeue_after=POLL_SECONDS, finished=False)
    step.act(DeleteConfigMap(children.run_config_name(observed.name), observed.uid))
    for component in children.AUX_COMPONENTS:
        step.act(DeleteConfigMap(children.aux_config_name(observed.name, component), observed.uid))
    step.act(DeleteService(children.driver_service_name(observed.name), observed.uid))
    if status.ui_service:   # collected with the stream anyway (owner reference); deleted by name like the others
        step.act(DeleteService(status.ui_service, observed.uid))
    return step.done()
