"""The ExactlyOnceSnapshot resource's parts: names, Pods, what was observed, results, parsing.

The planner (``snapshot_planner.plan_snapshot``) decides from these; the reconcile loop
(snapshot_reconciler.py) writes its status first (the write-ahead log) and then creates or deletes
the Pods it names.

A snapshot is a one-shot job. Each attempt is a Pod ``<snap>-snap-<n>`` that runs
``python -m eos_job snapshot take`` (or ``inspect`` for a snapshot an upgrading
driver wrote) with the stream's image and checkpoint volume, and reports what it
wrote in its termination message. Attempts retry with exponential backoff up to
``spec.maxRetries``; Completed and Failed are terminal (a new snapshot is a new
resource).

Deleting the resource disposes its files (``spec.disposeOnDelete``) behind kopf's
finalizer: Pods ``<snap>-dispose-<k>`` run ``python -m eos_job snapshot dispose``.
They carry *no* owner reference: an owner that is being deleted would have the
garbage collector remove them mid-run under foreground deletion, and a reference
to the stream would tie them to an object that may be gone or going. The
operator deletes them itself before it lets the finalizer go. A failed dispose
Pod is kept until the end as the record of that failure, so the count of
failures (at most ``DISPOSE_ATTEMPTS``) is observed, not remembered.

The attempt Pods are owned by the snapshot (controller, ``blockOwnerDeletion:
false``: nothing waits on them, and the operator needs no permission on the
snapshot's ``finalizers`` subresource), so they go with it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from eos_job.spec import API_GROUP, API_VERSION, ExactlyOnceStreamSpec, StreamIdentity
from eos_job.snapshot_resource import SNAPSHOT_KIND, ExactlyOnceSnapshotStatus, SnapshotAccess, SnapshotSpec
from eos_job.spec_rules import explain
from pydantic import ValidationError

from . import children
from .children import (LABEL_ATTEMPT, LABEL_COMPONENT, LABEL_MANAGED_BY, LABEL_SNAPSHOT_ACTION, LABEL_STREAM,
                       MANAGED_BY)
from .observed import PodView
from .upgrades import current_checkpoint_dir
from .validation import InvalidSpec, validate_spec

LABEL_SNAPSHOT = f"{API_GROUP}/snapshot"
COMPONENT = "snapshot"
MAX_LABEL_VALUE = 63
TERMINAL_STATES = ("Completed", "Failed")
POLL_SECONDS = 2.0

RETRY_BASE_SECONDS = 10.0      # attempt n failed: the next starts 10 s * 2^(n-1) later ...
RETRY_MAX_SECONDS = 300.0      # ... at most 5 minutes later
DISPOSE_ATTEMPTS = 5           # failed dispose Pods before the files are left to a human
DISPOSE_RETRY_BASE_SECONDS = 5.0
DISPOSE_RETRY_MAX_SECONDS = 60.0
ATTEMPT_GRACE_SECONDS = 30     # a take stopped by a deletion: time to remove its partial copy

# Exit codes of `python -m eos_job snapshot ...` (jobs/eos_job/cli.py).
EXIT_PREFLIGHT, EXIT_NOTHING_YET, EXIT_NOT_A_SNAPSHOT = 4, 5, 6
EXIT_MEANINGS = {EXIT_PREFLIGHT: "preflight failed", EXIT_NOTHING_YET: "no committed batch yet",
                 EXIT_NOT_A_SNAPSHOT: "not a snapshot"}
MAX_MESSAGE = 1024

SnapshotAction = Literal["take", "inspect", "dispose"]


# --------------------------------------------------------------------- names
@dataclass(frozen=True)
class SnapshotRef:
    """The snapshot resource, as its Pods and events need it."""
    name: str
    namespace: str
    uid: str
    kind: str = SNAPSHOT_KIND

    def owner_reference(self) -> dict[str, Any]:
        # blockOwnerDeletion false: deleting the snapshot never waits for its Pods (the finalizer does the
        # waiting where it matters), and no permission on exactlyoncesnapshots/finalizers is needed.
        return {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": SNAPSHOT_KIND, "name": self.name,
                "uid": self.uid, "controller": True, "blockOwnerDeletion": False}


def attempt_pod_name(snapshot: str, attempt: int) -> str:
    return f"{snapshot}-snap-{attempt}"


def dispose_pod_name(snapshot: str, index: int) -> str:
    return f"{snapshot}-dispose-{index}"


def snapshot_selector(snapshot: str) -> dict[str, str]:
    """Labels of every Pod of the snapshot: its attempts and its dispose Pods."""
    return {LABEL_MANAGED_BY: MANAGED_BY, LABEL_COMPONENT: COMPONENT, LABEL_SNAPSHOT: snapshot}


def default_path(stream_spec: ExactlyOnceStreamSpec, snapshot: str) -> str:
    return stream_spec.checkpoint.root() + f"/snapshots/{snapshot}"


def retry_delay(attempts: int) -> float:
    """Seconds before the attempt after ``attempts`` failed ones: 10 s, 20 s, 40 s, ... at most 5 min."""
    return min(RETRY_BASE_SECONDS * 2 ** max(attempts - 1, 0), RETRY_MAX_SECONDS)


def dispose_retry_delay(failures: int) -> float:
    return min(DISPOSE_RETRY_BASE_SECONDS * 2 ** max(failures - 1, 0), DISPOSE_RETRY_MAX_SECONDS)


# ------------------------------------------------------------------ builders
def snapshot_resource(namespace: str, stream: str, name: str, trigger: str, *, path: str | None = None,
                      max_retries: int, dispose_on_delete: bool) -> dict[str, Any]:
    """An ExactlyOnceSnapshot of ``stream``. No owner reference: a snapshot outlives its stream."""
    spec = SnapshotSpec(stream=stream, trigger=trigger, path=path, max_retries=max_retries,
                        dispose_on_delete=dispose_on_delete)
    return {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": SNAPSHOT_KIND,
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {LABEL_MANAGED_BY: MANAGED_BY, LABEL_STREAM: stream}},
            "spec": spec.wire()}


def take_command(checkpoint_dir: str, dest: str, identity: StreamIdentity, spec_hash: str) -> list[str]:
    return ["python", "-m", "eos_job", "snapshot", "take", "--checkpoint", checkpoint_dir, "--dest", dest,
            "--stream-json", identity.model_dump_json(by_alias=True), "--spec-hash", spec_hash]


def inspect_command(path: str) -> list[str]:
    return ["python", "-m", "eos_job", "snapshot", "inspect", "--path", path]


def dispose_command(path: str) -> list[str]:
    return ["python", "-m", "eos_job", "snapshot", "dispose", "--path", path]


def access_of(stream_spec: ExactlyOnceStreamSpec) -> SnapshotAccess:
    return SnapshotAccess(image=stream_spec.job.image, service_account_name=stream_spec.job.service_account_name,
                          store=stream_spec.checkpoint.store, claim_name=stream_spec.checkpoint.claim_name,
                          mount_path=stream_spec.checkpoint.path, s3=stream_spec.checkpoint.s3,
                          security=stream_spec.job.pod_template.security_context,
                          placement=stream_spec.job.pod_template.placement())


def snapshot_pod(ref: SnapshotRef, stream: str, access: SnapshotAccess, *, name: str,
                 action: SnapshotAction, command: list[str], attempt: int | None = None,
                 owned: bool = True) -> dict[str, Any]:
    """A Pod running one ``eos_job snapshot`` command with the stream's image, ServiceAccount, checkpoint
    volume and placement (node selector, tolerations, affinity, scheduler, pull Secrets), as the driver Pod has
    them (children.driver_pod)."""
    labels = {**snapshot_selector(ref.name), LABEL_STREAM: stream, LABEL_SNAPSHOT_ACTION: action}
    if attempt is not None:
        labels[LABEL_ATTEMPT] = str(attempt)
    container: dict[str, Any] = {
        "name": children.SNAPSHOT_CONTAINER,
        "image": access.image,
        "args": list(command),   # the image's entrypoint stays (children.DRIVER_COMMAND)
        # The CLI writes its result as compact JSON; on a crash the log tail says why.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    meta: dict[str, Any] = {"name": name, "namespace": ref.namespace, "labels": labels}
    if owned:
        meta["ownerReferences"] = [ref.owner_reference()]
    body = children.pod_body(meta, container, grace_seconds=ATTEMPT_GRACE_SECONDS,
                             service_account=access.service_account_name,
                             claim_name=access.claim_name if access.store == "pvc" else None,
                             mount_path=access.mount_path, s3=access.s3 if access.store == "s3" else None)
    return access.security.apply(access.placement.place(body))


# ------------------------------------------------------------- what was seen
@dataclass(frozen=True)
class SnapshotObserved:
    """One look at the world, taken before planning a snapshot."""
    name: str
    namespace: str
    uid: str
    generation: int
    now: datetime
    stream: dict[str, Any] | None = None     # the ExactlyOnceStream object (spec and status), None = missing
    pods: tuple[PodView, ...] = ()        # the Pods labelled with this snapshot (attempts and dispose)
    deleting: bool = False
    driver_node: str | None = None         # store pvc: the node of the stream's running driver (its claim)

    def attempt_pods(self) -> list[PodView]:
        """Attempt Pods of *this* snapshot (a re-created snapshot of the same name never adopts old ones)."""
        return [p for p in self.pods if p.action != "dispose" and p.owner_uid in (None, self.uid)]

    def dispose_pods(self) -> list[PodView]:
        return sorted((p for p in self.pods if p.action == "dispose"), key=lambda p: p.index)

    def pod(self, name: str | None) -> PodView | None:
        return next((p for p in self.attempt_pods() if p.name == name), None) if name else None

    @property
    def disposed(self) -> bool:
        """A dispose Pod succeeded: the files are gone."""
        return any(p.phase == "Succeeded" for p in self.dispose_pods())


@dataclass(frozen=True)
class StreamFacts:
    """What a snapshot needs from its stream."""
    spec: ExactlyOnceStreamSpec
    checkpoint_dir: str | None      # None: the stream never launched a driver, so it has no checkpoint
    spec_hash: str                  # of the spec its checkpoint was written with
    tx_generation: int


def stream_facts(obj: dict[str, Any] | None) -> StreamFacts | InvalidSpec | None:
    """None if the stream is missing; InvalidSpec if its spec cannot be run. Reads the stream's status
    leniently (only the three fields it needs), so it does not depend on the rest of that model."""
    if obj is None:
        return None
    meta = obj.get("metadata") or {}
    spec = validate_spec(obj.get("spec"), meta.get("namespace"), meta.get("name"))
    if isinstance(spec, InvalidSpec):
        return spec
    status = obj.get("status") or {}
    status_dir = status.get("checkpointDir") if isinstance(status.get("checkpointDir"), str) else None
    last = status.get("lastReconciledSpec") if isinstance(status.get("lastReconciledSpec"), str) else None
    checkpoint = current_checkpoint_dir(status_dir, last, spec) if (status_dir or last) else None
    spec_hash = spec.spec_hash()
    if last:
        try:
            spec_hash = ExactlyOnceStreamSpec.model_validate(json.loads(last)).spec_hash()
        except (ValueError, ValidationError):
            pass  # written by another version of the model: the current spec's hash is the best guess
    generation = status.get("txGeneration")
    return StreamFacts(spec=spec, checkpoint_dir=checkpoint, spec_hash=spec_hash,
                       tx_generation=generation if isinstance(generation, int) and generation >= 0 else 0)


# ------------------------------------------------------ what the CLI reported
@dataclass(frozen=True)
class SnapshotResult:
    """The termination message of a successful take or inspect."""
    path: str | None
    last_batch: int
    checkpoint_id: str | None = None
    stream_uid: str | None = None
    time: str | None = None
    size_bytes: int | None = None
    spec_hash: str | None = None


def parse_result(message: str | None) -> SnapshotResult | str:
    """The result, or why the message is not one (a string)."""
    text = (message or "").strip()
    if not text:
        return "the Pod left no termination message"
    try:
        doc = json.loads(text)
    except ValueError:
        return f"the termination message is not JSON: {text[:200]!r}"
    if not isinstance(doc, dict):
        return f"the termination message is not a JSON object: {text[:200]!r}"
    batch = doc.get("lastBatch")
    if not _is_int(batch) or batch < 0:
        return f"the termination message has no lastBatch: {text[:200]!r}"
    size = doc.get("sizeBytes")
    strings = {k: doc.get(k) for k in ("path", "checkpointId", "streamUid", "time", "specHash")}
    bad = [k for k, v in strings.items() if v is not None and not isinstance(v, str)]
    if bad or (size is not None and not _is_int(size)):
        return f"the termination message has mistyped fields {bad or ['sizeBytes']}: {text[:200]!r}"
    return SnapshotResult(path=strings["path"], last_batch=batch, checkpoint_id=strings["checkpointId"],
                          stream_uid=strings["streamUid"], time=strings["time"], size_bytes=size,
                          spec_hash=strings["specHash"])


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def failure_text(pod: PodView) -> str:
    """Why a Pod failed, in one line: exit code, its meaning, and the CLI's error (or the log tail)."""
    parts = [f"Pod {pod.name} failed"]
    if pod.exit_code is not None:
        meaning = EXIT_MEANINGS.get(pod.exit_code)
        parts.append(f"with exit code {pod.exit_code}" + (f" ({meaning})" if meaning else ""))
    text = " ".join(parts)
    detail = _detail(pod.message)
    return (f"{text}: {detail}" if detail else text)[:MAX_MESSAGE]


def _detail(message: str | None) -> str:
    text = (message or "").strip()
    if text.startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError:
            return text[-500:]
        if isinstance(doc, dict):
            error = doc.get("error") or doc.get("message")
            reason = doc.get("reason")
            if error:
                return f"{reason}: {error}" if reason else str(error)
            return str(reason or text)
    lines = [line for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-3:])[-500:]


class SnapshotStatusUnreadable(Exception):
    """The stored status cannot be parsed: acting on a guess could take or dispose twice."""


_STATUS_FIELDS = {f.alias or n for n, f in ExactlyOnceSnapshotStatus.model_fields.items()}


def parse_snapshot_status(raw: dict[str, Any] | None) -> ExactlyOnceSnapshotStatus:
    known = {k: v for k, v in (raw or {}).items() if k in _STATUS_FIELDS}
    try:
        return ExactlyOnceSnapshotStatus.model_validate(known)
    except ValidationError as exc:
        raise SnapshotStatusUnreadable(f"status cannot be parsed: {exc}") from exc


def parse_snapshot_spec(raw: Any) -> SnapshotSpec | InvalidSpec:
    if not isinstance(raw, dict):
        return InvalidSpec(("spec: required",))
    try:
        return SnapshotSpec.model_validate(raw)
    except ValidationError as exc:
        return InvalidSpec(tuple(f"spec.{'.'.join(str(p) for p in e['loc'])}: {explain(e)}"
                                 for e in exc.errors(include_url=False)))


