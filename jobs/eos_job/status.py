"""The status of an ``ExactlyOnceStream``, as the operator writes it (the spec's models are in ``spec``)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from .spec import Model


class Condition(Model):
    """A condition per the Kubernetes API conventions; lastTransitionTime changes only when status flips."""
    type: str = Field(..., description=(
        "Ready, Progressing or Degraded; Reconciling or Stalled (the kstatus conditions Flux reads)."))
    status: Literal["True", "False", "Unknown"] = Field(..., description="Whether the condition holds.")
    reason: str = Field(..., description="CamelCase reason of the current status.")
    message: str = Field("", description="What happened and, where something is wrong, what to do.")
    observed_generation: int | None = Field(None, description="metadata.generation this condition was computed for.")
    last_transition_time: str | None = Field(None, description="When status last flipped (RFC 3339).")


class SlotRecord(Model):
    slot: int
    batch: int
    count: int
    digest: str


class ProbedSnapshot(Model):
    """A snapshot's manifest as a probe read it (``eos-job probe --snapshot``)."""
    path: str = Field(..., description="The snapshot's directory.")
    stream_uid: str | None = Field(None, description="Stream id in its manifest (eos_job.spec.stream_uid).")
    batch: int | None = Field(None, description="Its last committed batch.")
    time: str | None = Field(None, description="When it was written (RFC 3339).")
    checkpoint_id: str | None = Field(None, description="Spark query id of the checkpoint it copies.")


class CheckpointFacts(Model):
    """What a checkpoint says about its batches, read where it is mounted (``python -m eos_job probe`` in a Pod
    of the stream, for ``checkpoint.store: pvc``) or by resolution itself (local files, S3)."""
    checkpoint_dir: str = Field(..., description="The checkpoint location these facts are of.")
    state: Literal["intact", "damaged", "empty"] | None = Field(None, description=(
        "intact: metadata and offsets; empty: neither; damaged: one without the other or unreadable metadata."))
    snapshot: ProbedSnapshot | None = Field(None, description=(
        "The snapshot the probe was asked about, if it holds a manifest."))
    checkpoint_id: str | None = Field(None, description="Spark query id from its metadata; unset: no checkpoint yet.")
    last_offsets_batch: int | None = Field(None, description="Newest batch in the offset log.")
    last_committed_batch: int | None = Field(None, description="Newest batch in the commit log.")
    replay_batch: int | None = Field(None, description="Batch a restart replays (offsets logged, not committed).")


class ResolutionReport(Model):
    """What resolution found before a (re)start; kept compact in status."""
    stream_uid: str = Field(..., description="The stream id the transactional ids and ledger keys derive from.")
    checkpoint_id: str | None = Field(None, description="Spark query id from the checkpoint's metadata, if any.")
    checkpoint_readable: bool = Field(True, description=(
        "False: the checkpoint store is not mounted where resolution ran (a PVC seen from the operator); "
        "the transactions were fenced, and the driver reads its checkpoint itself."))
    generation: int = Field(..., description="Transactional-id generation resolved for.")
    slots: int = Field(..., description="Output slots of that generation.")
    fenced_transactional_ids: int = Field(0, description="Transactional ids fenced (every generation's, the driver's).")
    open_transactions_aborted: int = Field(0, description="Of them, those that held an open transaction (aborted).")
    last_committed_batch_per_slot: dict[str, int] = Field(default_factory=dict, description=(
        "Per slot, the last batch its ledger record says it committed."))
    checkpoint_last_offsets_batch: int | None = Field(None, description="Newest batch in the checkpoint's offset log.")
    checkpoint_last_committed_batch: int | None = Field(None, description=(
        "Newest batch in the checkpoint's commit log."))
    last_complete_batch: int | None = Field(None, description="Last batch with a batch-complete ledger record.")
    replay_batch: int | None = Field(None, description="Batch the restart replays (offsets logged, not committed).")
    replay_slots_already_committed: list[int] = Field(default_factory=list, description=(
        "Slots that committed the replay batch already (they skip it)."))
    partially_committed: bool = Field(False, description="Some but not all slots committed the replay batch.")
    summary: str = Field("", description="The report in one line.")


class FailedDriver(Model):
    """The last driver Pod that ended, kept with its log until a later driver commits a batch."""
    pod: str = Field(..., description="Name of the Pod; its log: kubectl logs -n <namespace> <pod>.")
    batch: int | None = Field(None, description="Last committed batch when it ended (unset: none yet).")
    time: str = Field(..., description="When the operator saw it end (RFC 3339).")


class PendingLaunch(Model):
    """Write-ahead record of a driver launch in flight.

    Written to status before the old driver is deleted, before resolution and
    before the new Pod is created, so an operator that restarts mid-launch
    finishes the same launch (same Pod name) instead of starting another.
    """
    attempt: int = Field(..., ge=0, description="Attempt counter n of the driver Pod <name>-driver-<n>.")
    pod: str = Field(..., description="Name of the driver Pod this launch creates.")
    reason: Literal["Create", "Restart", "Resume", "SpecChange", "RestartRequested", "Rollback"] = Field(
        ..., description="Why the driver is (re)launched.")
    requested_at: str | None = Field(None, description="When the launch was decided (RFC 3339).")
    not_before: str | None = Field(None, description="The restart delay: no Pod before this time (RFC 3339).")
    resolved_spec_hash: str | None = Field(None, description=(
        "Hash of the spec resolution ran for; unset until resolution succeeded for this attempt."))
    refused: str | None = Field(None, description=(
        "The API server's refusal of a Pod or object of this launch (Pod Security, a quota, a webhook, a "
        "name another object holds); the launch retries it after a pause."))
    refused_at: str | None = Field(None, description="When that refusal happened (RFC 3339).")
    refused_reason: str | None = Field(None, description=(
        "Its reason: Refused (the API server), KafkaAuthenticationFailed, KafkaAuthorizationFailed, "
        "KafkaSecretMissing, CheckpointSecretMissing."))
    checkpoint_facts: CheckpointFacts | None = Field(None, description=(
        "checkpoint.store pvc: what the probe Pod read on the claim for this launch, before resolution."))


class SnapshotRecord(Model):
    """A snapshot the operator saw written (its manifest read back), newest last in status."""
    name: str = Field(..., description="Snapshot name, <stream>-a<driver attempt>.")
    path: str = Field(..., description="Snapshot directory in the checkpoint store.")
    batch: int | None = Field(None, description="Last batch committed in the snapshot.")
    time: str | None = Field(None, description="When the snapshot was written (RFC 3339).")


class UpgradeProgress(Model):
    """Write-ahead record of an upgrade in flight (a spec change classified as an upgrade).

    Written before the old driver is stopped; each step is idempotent, so an
    operator killed mid-upgrade re-reads it and finishes the same upgrade once.
    """
    mode: Literal["snapshot", "last-state", "stateless"] = Field(..., description=(
        "How this upgrade is carried out (a snapshot upgrade may fall back to last-state, see note)."))
    step: Literal["PreFlight", "Stopping", "Stopped", "Draining", "Blocked"] = Field(..., description=(
        "PreFlight: the new spec is tried on a scratch copy of the state while the old driver runs; "
        "Stopping: the old driver is being stopped (and writes its snapshot); Stopped: the old driver "
        "is gone and where the new one starts from is decided; Draining: a partially committed batch is "
        "finished with the old spec before the new one starts; Blocked: no snapshot and no intact "
        "checkpoint, nothing is started (see note)."))
    target_spec_hash: str = Field(..., description="Hash of the spec the upgrade was decided for.")
    from_pod: str | None = Field(None, description="The driver being replaced.")
    snapshot_name: str | None = Field(None, description="Name of the snapshot the upgrade takes or restores.")
    snapshot_path: str | None = Field(None, description="Where the old driver writes its snapshot on stop.")
    checkpoint_dir: str = Field(..., description="Checkpoint location of the new driver.")
    restore_from: str | None = Field(None, description="Snapshot that seeds checkpoint_dir (snapshot mode).")
    replay_offsets_from: str | None = Field(None, description=(
        "The checkpoint the old driver ran on: batches it logged after the snapshot are re-run with their "
        "original offsets."))
    previous_tx_generation: int = Field(0, description=(
        "status.txGeneration before the upgrade (restored if the upgrade is abandoned before the new driver)."))
    pre_flight_pod: str | None = Field(None, description="The pre-flight Pod of this upgrade (step PreFlight).")
    drain_pod: str | None = Field(None, description="The Pod finishing a partially committed batch (step Draining).")
    drained: bool = Field(False, description="The partially committed batch was finished with the old spec.")
    rollback: bool = Field(False, description="This upgrade is a rollback to the last stable spec.")
    requested_at: str | None = Field(None, description="When the upgrade was decided (RFC 3339).")
    note: str = Field("", description="Why the upgrade deviates from its mode (e.g. no snapshot could be taken).")
    checked: CheckpointFacts | None = Field(None, description=(
        "checkpoint.store pvc: the old driver's snapshot and checkpoint as the check Pod read them on the claim."))


class UpgradeCheck(Model):
    """An upgrade (or restore) whose new driver has not yet proven itself: Running and a batch committed."""
    target_spec_hash: str = Field(..., description="Hash of the upgraded spec being verified.")
    pod: str = Field(..., description="The new driver.")
    deadline: str = Field(..., description="Roll back if the new driver is not ready by then (RFC 3339).")
    baseline_batch: int | None = Field(None, description="A batch after this one must commit.")
    rollback_snapshot: str | None = Field(None, description="Snapshot taken before the upgrade (rollback source).")
    previous_spec: str | None = Field(None, description="JSON of the last stable spec (rollback target).")
    previous_tx_generation: int = Field(0, description="Transactional-id generation of the last stable spec.")


class RejectedSpec(Model):
    """A spec the operator will not run (pre-flight refused it, or it was rolled back); the old one keeps running."""
    spec_hash: str = Field(..., description="Hash of the spec that is not run.")
    reason: Literal["PreFlightFailed", "RolledBack"] = Field(..., description=(
        "PreFlightFailed: pre-flight refused it, the old driver runs on; RolledBack: it did not become ready."))
    message: str = Field("", description="Why, with what to change.")
    time: str | None = Field(None, description="When it was rejected (RFC 3339).")
    run_spec: str | None = Field(None, description="JSON of the spec that runs instead (the last stable one).")


class PartitionLag(Model):
    topic: str = Field(..., description="Source topic.")
    partition: int = Field(..., description="Source partition.")
    records: int = Field(..., description="Records the source partition holds beyond the last committed batch.")


MAX_LAG_PARTITIONS = 50


class ReplayHorizon(Model):
    """How far the source still reaches back behind the stream (the protocol's replay horizon).

    Compares the source positions of the last batch in the sink (its ledger record) with what
    the source retains: records deleted by retention before the stream read them are lost to it.
    """
    state: Literal["Safe", "Shrinking", "Exceeded"] = Field(..., description=(
        "Safe; Shrinking: retention deletes an unprocessed record soon (see secondsLeft); Exceeded: "
        "retention already deleted records the stream had not read (lostRecords)."))
    batch: int = Field(..., description="The committed batch whose source positions were compared.")
    checked_at: str = Field(..., description="When the source was read (RFC 3339).")
    backlog_records: int = Field(0, description="Records retained but not yet processed, all partitions.")
    lost_records: int = Field(0, description="Records deleted before the stream read them, all partitions.")
    seconds_left: float | None = Field(None, description=(
        "Least time before retention may delete an unprocessed record; unset: no backlog or no time limit."))
    partition: str | None = Field(None, description="The partition that decided the state (topic/partition).")
    message: str = Field("", description="The state in words, with what to do.")
    lag: list[PartitionLag] = Field(default_factory=list, description=(
        f"Per source partition, the records beyond the last committed batch (the consumer lag), largest first; "
        f"at most {MAX_LAG_PARTITIONS} partitions, those behind by 0 left out."))


class ExactlyOnceStreamStatus(Model):
    observed_generation: int | None = Field(None, description="metadata.generation the operator last acted on.")
    lifecycle_state: Literal["Created", "Deploying", "Running", "Restarting", "Upgrading", "Suspended",
                             "Failed", "Invalid"] = Field("Created", description="Derived lifecycle state.")
    conditions: list[Condition] = Field(default_factory=list)
    last_committed_batch: int | None = Field(None, description="Last batch committed to the sink, as last seen.")
    nondeterministic_slots: int | None = Field(None, description=(
        "Replayed slots whose output differed from what the sink holds (the transformation is not "
        "deterministic), summed over the stream's ledger, as last seen."))
    runtime_version: str | None = Field(None, description=(
        "Job runtime version (eos_job) of the driver that wrote the newest batch-complete record of the ledger, "
        "as last seen: the operator compares it with its own (Degraded, reason RuntimeVersionSkew, when outside "
        "the version-skew policy). Unset: no batch seen yet, or a runtime too old to report it."))
    restart_count: int = Field(0, description="Restarts since the last reset (restartNonce or a stable run).")
    next_restart_time: str | None = Field(None, description="When the pending restart may start (RFC 3339).")
    last_error: str | None = Field(None, description="Why the last driver failed: exit code and termination message.")
    resolution: ResolutionReport | None = Field(None, description="Report of the last resolution.")
    last_reconciled_spec: str | None = Field(None, description="JSON of the spec the current driver was launched with.")
    tx_generation: int = Field(0, description="Transactional-id generation of the running spec.")
    driver_pod: str | None = Field(None, description="Name of the current driver Pod.")
    failed_driver: FailedDriver | None = Field(None, description=(
        "The last driver Pod that failed, kept (not deleted) with its log until a later driver commits a batch "
        "beyond the one it ended at; only the newest is kept. Not in deployMode cluster, whose executor Pods "
        "the driver Pod owns (lastError holds its termination message)."))
    driver_attempt: int = Field(0, description="Attempt counter n of the current (or next) driver Pod.")
    pending_launch: PendingLaunch | None = None
    observed_restart_nonce: int | None = Field(None, description="spec.restartNonce the counters were last reset for.")
    failure_times: list[str] = Field(default_factory=list, description=(
        "Recent driver failure times (RFC 3339), for the failure-rate strategy."))
    last_restart_delay_seconds: float | None = Field(None, description=(
        "Base delay of the last restart, for the exponential-delay strategy."))
    running_since: str | None = Field(None, description="When the current driver was first seen Running (RFC 3339).")
    checkpoint_dir: str | None = Field(None, description=(
        "Checkpoint location of the current driver; unset means <checkpoint.path>/live."))
    restore_from: str | None = Field(None, description="Snapshot the current checkpoint location was seeded from.")
    replay_offsets_from: str | None = Field(None, description=(
        "Checkpoint whose offset log the current driver re-runs after its restore (see RunConfig)."))
    snapshot_on_stop: str | None = Field(None, description=(
        "Where the current driver writes its snapshot when stopped gracefully."))
    upgrade: UpgradeProgress | None = None
    last_stable_spec: str | None = Field(None, description="JSON of the last spec whose driver reached Running.")
    snapshots: list[SnapshotRecord] = Field(default_factory=list, description=(
        "Snapshots taken by upgrades, newest last (bounded)."))
    observed_snapshot_nonce: int | None = Field(None, description="spec.snapshotNonce a snapshot was last requested for.")
    upgrade_check: UpgradeCheck | None = None
    rejected_spec: RejectedSpec | None = Field(None, description=(
        "The current spec is not run (pre-flight failed or rolled back); the last stable spec runs instead. "
        "Change the spec to try again."))
    restored_from_snapshot: str | None = Field(None, description="spec.restoreFrom the stream was last restored from.")
    replay_horizon: ReplayHorizon | None = Field(None, description=(
        "Checkpointed source positions versus what the source still retains, as last checked."))
    ui_service: str | None = Field(None, description=(
        "The Spark UI Service the operator made for job.metrics.uiService (recorded before it is created); "
        "it is deleted, and this cleared, when the option is turned off."))
