"""What the observer saw: plain values, read by the planner, never acted on here."""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from eos_job.status import ReplayHorizon

from .children import LABEL_ATTEMPT, LABEL_SNAPSHOT_ACTION, OWN_CONTAINERS
from .spark_ui import ServiceView

TERMINAL_PHASES = ("Succeeded", "Failed")
MAX_MESSAGE = 1024


@dataclass(frozen=True)
class PodView:
    """Any Pod the operator made (driver, pre-flight, drain, snapshot take/inspect/dispose), as observed."""
    name: str
    phase: str = "Pending"                   # Pending, Running, Succeeded, Failed, Unknown
    deleting: bool = False                   # metadata.deletionTimestamp is set
    exit_code: int | None = None
    reason: str | None = None
    message: str | None = None               # the termination message (whole), else the Pod's own message
    attempt: int | None = None
    started_at: str | None = None
    owner_uid: str | None = None             # uid of the controlling owner (stream or snapshot)
    action: str | None = None                # a snapshot's Pods: take, inspect or dispose
    finished_at: str | None = None
    created_at: str | None = None            # metadata.creationTimestamp
    blocked: str | None = None               # why a Pending Pod does not start (waiting reason, Unschedulable)
    node: str | None = None                  # spec.nodeName: where it runs
    deleting_since: str | None = None        # metadata.deletionTimestamp
    evicted: bool = False                    # DisruptionTarget condition, reason EvictionByEvictionAPI (a drain)
    not_ready: bool = False                  # Ready condition False while Running (e.g. its node is lost)

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @property
    def index(self) -> int:
        """The trailing number of the name (the attempt, or a dispose Pod's index)."""
        tail = self.name.rsplit("-", 1)[-1]
        return int(tail) if tail.isdigit() else -1

    @property
    def summary_reason(self) -> str | None:
        """The ``reason`` of the run summary the job runtime wrote as its termination message, if any."""
        text = (self.message or "").strip()
        if not text.startswith("{"):
            return None
        try:
            doc = json.loads(text)
        except ValueError:
            return None
        return doc.get("reason") if isinstance(doc, dict) else None

    def failure_text(self, advice: str = "") -> str:
        """What ended the Pod; ``advice`` (what to change) goes before the log's tail, which is cut first."""
        parts = [f"driver Pod {self.name} {self.phase.lower()}"]
        detail = []
        if self.exit_code is not None:
            detail.append(f"exit code {self.exit_code}")
        if self.reason:
            detail.append(self.reason)
        if detail:
            parts.append(f"({', '.join(detail)})")
        text = " ".join(parts) + (f": {advice}" if advice else "")
        if self.message:
            # A log tail ends with what matters.
            text += f"{'. Log' if advice else ''}: {_readable(self.message[-MAX_MESSAGE:])}"
        return text[:MAX_MESSAGE]


def _readable(message: str) -> str:
    """The job runtime writes a JSON run summary as its termination message; show its reason and error."""
    message = message.strip()
    if message.startswith("{"):
        try:
            doc = json.loads(message)
        except ValueError:
            return message
        if isinstance(doc, dict) and doc.get("error"):
            return f"{doc.get('reason', 'Error')}: {doc['error']}"
    return message


@dataclass(frozen=True)
class NodeView:
    """The Node a driver Pod runs on, as read when the Pod looked unwell (not Ready, or being deleted)."""
    name: str
    ready: str = "True"                      # the Ready condition's status: True, False, Unknown
    since: str | None = None                 # the Ready condition's lastTransitionTime
    reason: str | None = None                # its reason (NodeStatusUnknown: the kubelet stopped posting)

    @property
    def lost(self) -> bool:
        return self.ready != "True"


def node_view(name: str, node: dict[str, Any] | None) -> NodeView | None:
    """A NodeView from a Node as the API returns it. None for a Node the API does not have (404): that is not a
    lost node here. On a cluster the Pod garbage collector force-deletes the Pods of a deleted Node (the driver is
    then gone, as after any deletion), so a Pod bound to a node name with no Node object is waited for as before."""
    if node is None:
        return None
    ready = next((c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), {})
    return NodeView(name, ready=ready.get("status") or "Unknown", since=ready.get("lastTransitionTime"),
                    reason=ready.get("reason"))


@dataclass(frozen=True)
class SnapshotView:
    """A snapshot's manifest, as read back from the checkpoint store."""
    path: str
    stream_uid: str | None = None
    batch: int | None = None
    time: str | None = None
    checkpoint_id: str | None = None


@dataclass(frozen=True)
class SnapshotInfo:
    """An ExactlyOnceSnapshot of the stream, as listed (newest last by creation)."""
    name: str
    trigger: str = "manual"
    state: str = "Pending"
    path: str | None = None
    batch: int | None = None
    stream_uid: str | None = None
    created: str | None = None               # metadata.creationTimestamp
    deleting: bool = False


@dataclass(frozen=True)
class RestoreSource:
    """``spec.restoreFrom`` resolved: a Completed snapshot resource or a path with a readable manifest."""
    ref: str                                 # as written in the spec
    path: str | None = None                  # None: not usable (see problem)
    stream_uid: str | None = None            # None: unknown (store unreadable)
    batch: int | None = None
    problem: str | None = None               # why it cannot be used yet


# What a checkpoint location holds: intact (metadata and offsets), empty (never started), damaged (anything
# else), unknown (the operator cannot read the store).
CheckpointState = str


@dataclass(frozen=True)
class Observed:
    """One look at the world, taken before planning."""
    name: str
    namespace: str
    uid: str
    generation: int
    now: datetime
    pods: tuple[PodView, ...] = ()           # every driver Pod of the stream, any attempt
    deleting: bool = False                   # the stream has a deletionTimestamp
    # Hook for progress: the last batch committed to the sink, from the ledger or
    # from the driver's Pod annotations (filled by the observer once the runtime
    # publishes it). None = unknown; the planner then keeps what status has.
    last_committed_batch: int | None = None
    # With it, from the same ledger record: replayed slots whose output differed from the sink, so far,
    # and the runtime version of the driver that wrote it (None also when that runtime reports none).
    nondeterministic_slots: int | None = None
    runtime_version: str | None = None
    # Read only while an upgrade waits for its old driver to stop (status.upgrade.step Stopping):
    # the snapshot that driver was to write (None = none there), whether the store could be read at
    # all, and the state of the live checkpoint location.
    snapshot: SnapshotView | None = None
    store_readable: bool = True
    checkpoint_state: CheckpointState = "unknown"
    snapshots: tuple[SnapshotInfo, ...] = ()  # the stream's ExactlyOnceSnapshots, oldest first
    aux_pods: tuple[PodView, ...] = ()        # pre-flight and drain Pods of the stream
    restore_source: RestoreSource | None = None  # spec.restoreFrom resolved (None when unset)
    # Snapshots other streams of the namespace still have to restore from (their spec.restoreFrom, not yet
    # restored): retention keeps them.
    wanted_by_others: frozenset[str] = frozenset()
    # The replay horizon as last checked (None: not checked this time, or nothing to check yet).
    replay_horizon: ReplayHorizon | None = None
    # The Service <name>-ui as read (None: none there, or not read: only while job.metrics.uiService is on or
    # status.uiService names it).
    ui_service: ServiceView | None = None
    # The Nodes of driver Pods that looked unwell (not Ready while Running, or being deleted); Nodes not read
    # (healthy Pods, or the operator may not read Nodes) are not here.
    nodes: tuple[NodeView, ...] = ()

    def node(self, name: str | None) -> NodeView | None:
        return next((n for n in self.nodes if n.name == name), None) if name else None

    def pod(self, name: str | None) -> PodView | None:
        if name is None:
            return None
        return next((p for p in self.pods if p.name == name), None)

    def others(self, name: str | None) -> tuple[PodView, ...]:
        return tuple(p for p in self.pods if p.name != name)

    def aux_pod(self, name: str | None) -> PodView | None:
        if name is None:
            return None
        return next((p for p in self.aux_pods if p.name == name), None)


def snapshot_info(obj: dict[str, Any]) -> SnapshotInfo:
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    return SnapshotInfo(name=meta.get("name", ""), trigger=spec.get("trigger", "manual"),
                        state=status.get("state", "Pending"), path=status.get("path") or spec.get("path"),
                        batch=status.get("batch"), stream_uid=status.get("streamUid"),
                        created=meta.get("creationTimestamp"), deleting=bool(meta.get("deletionTimestamp")))


# Waiting reasons of a container that will not start by itself soon (ContainerCreating, PodInitializing don't).
BLOCKING_WAITS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                  "CreateContainerError", "RunContainerError", "ErrImageNeverPull")


def start_blocker(status: dict[str, Any]) -> str | None:
    """Why a Pending Pod is not starting, as the scheduler or kubelet reported it, or None."""
    if status.get("phase", "Pending") != "Pending":
        return None
    for c in status.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return f"{c.get('reason') or 'Unschedulable'}: {c.get('message') or 'no node fits'}"
    for c in status.get("containerStatuses") or []:
        waiting = (c.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in BLOCKING_WAITS:
            return f"{waiting['reason']}: {waiting.get('message') or ''}".rstrip(": ")
    return None


# The reason of the DisruptionTarget condition the API server sets before an eviction deletes the Pod.
EVICTION_REASON = "EvictionByEvictionAPI"


def pod_view(pod: dict[str, Any]) -> PodView:
    """A PodView from a Pod as the API returns it (camelCase dict)."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    labels = meta.get("labels") or {}
    exit_code = reason = message = started = finished = None
    statuses = status.get("containerStatuses") or []
    mine = next((c for c in statuses if c.get("name") in OWN_CONTAINERS), statuses[0] if statuses else None)
    if mine:
        state = mine.get("state") or {}
        term = state.get("terminated") or (mine.get("lastState") or {}).get("terminated")
        if term:
            exit_code = term.get("exitCode")
            reason = term.get("reason")
            message = term.get("message")
            finished = term.get("finishedAt")
        running = state.get("running")
        if running:
            started = running.get("startedAt")
    if message is None and status.get("message"):
        message = status.get("message")      # e.g. evicted: the Pod's own message
    if reason is None and status.get("reason"):
        reason = status.get("reason")
    evicted = any(c.get("type") == "DisruptionTarget" and c.get("status") == "True"
                  and c.get("reason") == EVICTION_REASON for c in status.get("conditions") or [])
    not_ready = status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "False" for c in status.get("conditions") or [])
    raw_attempt = labels.get(LABEL_ATTEMPT)
    attempt = int(raw_attempt) if raw_attempt is not None and raw_attempt.isdigit() else None
    owner = next((o.get("uid") for o in meta.get("ownerReferences") or [] if o.get("controller")), None)
    return PodView(name=meta.get("name", ""), phase=status.get("phase") or "Pending",
                   created_at=meta.get("creationTimestamp"), blocked=start_blocker(status),
                   node=(pod.get("spec") or {}).get("nodeName"), deleting_since=meta.get("deletionTimestamp"),
                   deleting=bool(meta.get("deletionTimestamp")), exit_code=exit_code, reason=reason,
                   message=message, attempt=attempt, started_at=started, owner_uid=owner,
                   action=labels.get(LABEL_SNAPSHOT_ACTION), finished_at=finished, evicted=evicted,
                   not_ready=not_ready)
