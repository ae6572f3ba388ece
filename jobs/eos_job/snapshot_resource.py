"""The ``ExactlyOnceSnapshot`` resource: a snapshot of a stream's checkpoint, its spec and status."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from .pod_template import PodPlacement, PodSecurity
from .spec import Model, S3Store
from .spec_rules import MAX_LOCATION, SNAPSHOT_PATH_PATTERN
from .status import Condition

SNAPSHOT_KIND = "ExactlyOnceSnapshot"
SNAPSHOT_PLURAL = "exactlyoncesnapshots"
SNAPSHOT_SHORT_NAMES = ["eoss"]
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class SnapshotSpec(Model):
    stream: str = Field(..., pattern=DNS_LABEL, max_length=63, description="The ExactlyOnceStream (same namespace).")
    trigger: Literal["manual", "periodic", "nonce", "upgrade"] = Field("manual", description=(
        "Who asked: manual (created by a user), periodic (snapshots.intervalSeconds), nonce (snapshotNonce), "
        "upgrade (written by the driver when it stopped for an upgrade)."))
    path: str | None = Field(None, min_length=1, max_length=MAX_LOCATION, pattern=SNAPSHOT_PATH_PATTERN,
                             description=(
        "Snapshot directory; default <checkpoint.path>/snapshots/<name>. For trigger upgrade: the snapshot "
        "the driver wrote (it is verified, not copied). Absolute (/..., file:///..., s3a://<bucket>/...), "
        "without '.' or '..' segments, and inside the stream's store (under checkpoint.path for pvc and local, "
        "in the stream's bucket for s3): the operator refuses a path elsewhere."))
    max_retries: int = Field(3, ge=0, le=100, description="Retries of a failed attempt before the snapshot is Failed.")
    dispose_on_delete: bool = Field(True, description="Delete the snapshot's files when this resource is deleted.")


class SnapshotAccess(Model):
    """How a Pod reaches the snapshot's files, recorded at its first attempt: disposal works after its
    stream is gone (snapshots outlive their streams)."""
    image: str = Field(..., description="The stream's job image, which the snapshot's Pods run.")
    service_account_name: str | None = Field(None, description="The stream's job ServiceAccount.")
    store: Literal["pvc", "local", "s3"] = Field(..., description="checkpoint.store of the stream.")
    claim_name: str | None = Field(None, description="checkpoint.claimName of the stream (store pvc).")
    s3: S3Store | None = Field(None, description="The bucket (store s3): endpoint settings and Secret references.")
    mount_path: str = Field(..., description="checkpoint.path of the stream (the claim's mount path).")
    security: PodSecurity = Field(default_factory=PodSecurity, description=(
        "job.podTemplate.securityContext of the stream: who the snapshot's Pods run as."))
    placement: PodPlacement = Field(default_factory=PodPlacement, description=(
        "job.podTemplate's node selector, tolerations, affinity, scheduler, priority class and image pull "
        "Secrets of the stream: where the snapshot's Pods run and how they pull the image."))


class ExactlyOnceSnapshotStatus(Model):
    state: Literal["Pending", "InProgress", "Completed", "Failed"] = Field("Pending", description=(
        "Pending: waiting to start (or to retry); InProgress: the copy runs; Completed; Failed: retries exhausted."))
    path: str | None = Field(None, description="Snapshot directory in the checkpoint store.")
    batch: int | None = Field(None, description="Last batch committed in the snapshot.")
    checkpoint_id: str | None = Field(None, description="Spark query id of the checkpoint it copies.")
    stream_uid: str | None = Field(None, description="Stream id in the manifest (eos_job.spec.stream_uid).")
    spec_hash: str | None = Field(None, description="Hash of the stream's spec when it was taken (manifest).")
    size_bytes: int | None = Field(None, description="Bytes of its files.")
    taken_at: str | None = Field(None, description="When the snapshot was written (RFC 3339, from the manifest).")
    attempts: int = Field(0, description="Attempts started so far.")
    pod: str | None = Field(None, description="The Pod of the current attempt.")
    next_attempt_time: str | None = Field(None, description="A retry starts no earlier than this (RFC 3339).")
    last_error: str | None = Field(None, description="Why the last attempt failed.")
    access: SnapshotAccess | None = Field(None, description=(
        "The stream's image, ServiceAccount and checkpoint volume, as the snapshot's Pods use them."))
    message: str = Field("", description="What the snapshot is doing or why it failed, in words.")
    conditions: list[Condition] = Field(default_factory=list, description=(
        "Ready: True once Completed. False with reason Pending, InProgress, Failed or Deleting, or what holds "
        "the current Pod up: SnapshotStartBlocked (it cannot start: ErrImagePull, ImagePullBackOff, "
        "CreateContainerConfigError, Unschedulable; the cause in the message), Refused (the API server refused "
        "its create; the server's message, retried every 30 s). Reconciling (kstatus): True until Completed or "
        "Failed; Stalled: True once Failed."))
    observed_generation: int | None = Field(None, description="metadata.generation the operator last acted on.")
