"""Snapshots the stream asks for (snapshotNonce, snapshots.intervalSeconds) and their retention."""
from __future__ import annotations

from datetime import datetime

from eos_job.spec import ExactlyOnceStreamSpec
from eos_job.status import ExactlyOnceStreamStatus

from .. import children
from ..actions import CreateSnapshot, DeleteSnapshot
from ..snapshots import snapshot_resource
from ..timeutil import parse, seconds_between, utc
from .step import StreamStep


def snapshot_resource_for(step: StreamStep, spec: ExactlyOnceStreamSpec, name: str, trigger: str,
                       path: str | None = None) -> dict:
    return snapshot_resource(step.obs.namespace, step.obs.name, name, trigger, path=path,
                             max_retries=spec.snapshots.max_retries,
                             dispose_on_delete=spec.snapshots.dispose_on_delete)


def snapshot_housekeeping(step: StreamStep, spec: ExactlyOnceStreamSpec) -> None:
    """Snapshots asked for by snapshotNonce or snapshots.intervalSeconds, and retention."""
    st, obs = step.st, step.obs
    names = {s.name for s in obs.snapshots}
    if st.observed_snapshot_nonce is None:
        st.observed_snapshot_nonce = spec.snapshot_nonce
    elif st.observed_snapshot_nonce != spec.snapshot_nonce:
        st.observed_snapshot_nonce = spec.snapshot_nonce
        name = children.fitted_name(obs.name, f"-n{spec.snapshot_nonce}")
        if name not in names:
            step.act(CreateSnapshot(snapshot_resource_for(step, spec, name, "nonce")))
            step.event("Normal", "SnapshotRequested", f"snapshotNonce changed: snapshot {name} requested")
    interval = spec.snapshots.interval_seconds
    driver = obs.pod(st.driver_pod)
    if (interval and driver is not None and driver.phase == "Running" and st.pending_launch is None
            and st.upgrade is None and spec.job.state == "running"):
        periodic = [s for s in obs.snapshots if s.trigger == "periodic" and parse(s.created) is not None]
        newest = max((parse(s.created) for s in periodic), default=None)
        since = parse(st.running_since)
        due_from = max([t for t in (newest, since) if t is not None], default=None)
        if due_from is not None and seconds_between(due_from, obs.now) >= interval:
            name = children.fitted_name(obs.name, f"-p{int(utc(obs.now).timestamp()) // interval}")
            if name not in names:
                step.act(CreateSnapshot(snapshot_resource_for(step, spec, name, "periodic")))
                step.event("Normal", "SnapshotRequested", f"periodic snapshot {name} requested "
                                                          f"(every {interval}s)")
    for name in retention(obs.snapshots, spec, st, obs.now, wanted=obs.wanted_by_others):
        step.act(DeleteSnapshot(name))
        step.event("Normal", "SnapshotPruned", f"snapshot {name} deleted by retention (maxCount "
                                               f"{spec.snapshots.max_count}, maxAgeSeconds "
                                               f"{spec.snapshots.max_age_seconds})")


def retention(snapshots, spec: ExactlyOnceStreamSpec, st: ExactlyOnceStreamStatus, now: datetime,
              wanted: frozenset[str] = frozenset()) -> list[str]:
    """Snapshots to delete: beyond snapshots.maxCount or older than maxAgeSeconds, newest first kept.

    Never deleted: one that is not finished (Pending, InProgress), the newest Completed one, one the
    stream was restored from or would roll back to, the one spec.restoreFrom names, or one another
    stream still has to restore from (``wanted``: names or paths).
    """
    policy = spec.snapshots
    finished = [s for s in snapshots if s.state in ("Completed", "Failed") and not s.deleting]
    finished.sort(key=lambda s: (parse(s.created) or now, s.name), reverse=True)
    completed = [s for s in finished if s.state == "Completed"]
    protected_paths = {p for p in (st.restore_from, st.upgrade.restore_from if st.upgrade else None,
                                   st.upgrade_check.rollback_snapshot if st.upgrade_check else None) if p}
    protected = {completed[0].name} if completed else set()
    protected |= {s.name for s in finished if s.path in protected_paths or s.name == spec.restore_from
                  or s.name in wanted or s.path in wanted}
    out = []
    for i, s in enumerate(finished):
        if s.name in protected:
            continue
        created = parse(s.created)
        too_old = (policy.max_age_seconds is not None and created is not None
                   and seconds_between(created, now) > policy.max_age_seconds)
        if i >= policy.max_count or too_old:
            out.append(s.name)
    return sorted(out)
