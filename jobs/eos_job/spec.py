"""The ``ExactlyOnceStream`` resource: one set of models for its spec and status.

Used by the operator (validation, planning, the generated CRD) and by the job
runtime (its config is the resource's spec). Field names are camelCase on the
wire, snake_case in Python. Unknown fields are rejected so a typo names itself.
"""
from __future__ import annotations

import hashlib
import json
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

API_GROUP = "streaming.eos.dev"
API_VERSION = "v1alpha1"
KIND = "ExactlyOnceStream"
PLURAL = "exactlyoncestreams"
SHORT_NAMES = ["eos"]
DEFAULT_IMAGE = "ghcr.io/spark-eos/spark-eos-operator:0.1.0"

# Kafka topic names: legal characters and length (Kafka rejects others).
TOPIC_PATTERN = r"^[a-zA-Z0-9._-]{1,249}$"
MODULE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$"


class Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid",
                              validate_default=True)

    def wire(self) -> dict:
        """The camelCase form, as stored in the API server."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


# --------------------------------------------------------------------------- spec
class Resources(Model):
    cpu: str = Field("1", pattern=QUANTITY_PATTERN, description="CPU request and limit, e.g. 500m or 2.")
    memory: str = Field("1Gi", pattern=QUANTITY_PATTERN, description="Memory request and limit, e.g. 2Gi.")


class ExecutorSpec(Resources):
    instances: int = Field(1, ge=1, le=256, description="Executor Pods (cluster deploy mode only).")


class JobSpec(Model):
    image: str = Field(DEFAULT_IMAGE, min_length=1, description="Container image with the job runtime and the user's module.")
    module: str = Field(..., pattern=MODULE_PATTERN,
                        description="Python module holding the transformation, e.g. examples.colors.job.")
    function: str = Field("transform", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                          description="Function in the module: transform(df: DataFrame, ctx) -> DataFrame.")
    args: dict[str, str] = Field(default_factory=dict, description="Settings passed to the transformation as ctx.args.")
    spark_conf: dict[str, str] = Field(default_factory=dict, description="Extra Spark configuration.")
    parallelism: int = Field(2, ge=1, le=1024, description=(
        "Output slots P: the output is hash-partitioned by key into P transactional writers. "
        "Changing it is an upgrade under a new transactional-id generation."))
    output_mode: Literal["update", "append", "complete"] = Field(
        "update", description="Spark output mode of the query.")
    deploy_mode: Literal["local", "cluster"] = Field(
        "local", description="local: Spark local mode inside the driver Pod; cluster: spark-submit --master k8s:// with executor Pods.")
    driver: Resources = Field(default_factory=Resources)
    executor: ExecutorSpec = Field(default_factory=ExecutorSpec)
    service_account_name: str | None = Field(None, description="ServiceAccount of the driver Pod.")
    state: Literal["running", "suspended"] = Field(
        "running", description="suspended stops the driver at a clean batch boundary; running resumes it.")


class SourceSpec(Model):
    bootstrap_servers: str = Field(..., min_length=1, description="Kafka bootstrap servers of the source cluster.")
    topics: list[str] = Field(..., min_length=1, description="Source topics.")
    starting_offsets: Literal["earliest", "latest"] = Field(
        "earliest", description="Where a fresh checkpoint starts; ignored once the checkpoint has offsets.")
    max_offsets_per_trigger: int | None = Field(None, ge=1, description="Upper bound of records per micro-batch.")
    options: dict[str, str] = Field(default_factory=dict, description="Extra options of Spark's Kafka source.")
    replay_horizon_warning_seconds: int | None = Field(None, ge=1, description=(
        "Warn (event, Degraded condition) when retention will delete the oldest record the stream has not "
        "processed within this many seconds; default half the topic's retention.ms."))

    @model_validator(mode="after")
    def _topic_names(self) -> "SourceSpec":
        for t in self.topics:
            if not re.match(TOPIC_PATTERN, t):
                raise ValueError(f"source.topics: {t!r} is not a valid Kafka topic name "
                                 "(letters, digits, '.', '_', '-', at most 249)")
        return self


class SecretKeyRef(Model):
    name: str = Field(..., min_length=1, description="Secret name in the stream's namespace.")
    key: str = Field(..., min_length=1, description="Key within the Secret.")


class SinkCredentials(Model):
    mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "PLAIN"
    security_protocol: Literal["SASL_PLAINTEXT", "SASL_SSL"] = "SASL_SSL"
    username: SecretKeyRef
    password: SecretKeyRef


class SinkSpec(Model):
    bootstrap_servers: str = Field(..., min_length=1, description="Kafka bootstrap servers of the sink cluster.")
    topic: str = Field(..., pattern=TOPIC_PATTERN, description="Default output topic.")
    dead_letter_topic: str | None = Field(None, pattern=TOPIC_PATTERN, description=(
        "Topic for poison records, on the sink cluster (written in the same transaction)."))
    ledger_topic: str | None = Field(None, pattern=TOPIC_PATTERN, description=(
        "The stream's ledger topic; default <topic>.eos-ledger.<namespace>.<name>."))
    transaction_timeout_ms: int = Field(60000, ge=1000, le=900000, description=(
        "Kafka transaction.timeout.ms of the slot producers (at most the broker's transaction.max.timeout.ms)."))
    producer_config: dict[str, str] = Field(default_factory=dict, description=(
        "Extra librdkafka producer settings. Credentials go in credentials, never here."))
    credentials: SinkCredentials | None = Field(None, description="SASL credentials by Secret reference.")


class CheckpointSpec(Model):
    store: Literal["pvc", "local"] = Field("pvc", description=(
        "pvc: a PersistentVolumeClaim mounted in the driver; local: a path on the node (tests only)."))
    claim_name: str | None = Field(None, description="The PersistentVolumeClaim (store=pvc).")
    path: str = Field(..., min_length=1, description="Directory for checkpoints and snapshots inside the store.")


class FixedDelay(Model):
    attempts: int = Field(3, ge=0, le=1000, description="Restarts before the stream is Failed.")
    delay_seconds: float = Field(10.0, ge=0, le=86400)


class ExponentialDelay(Model):
    initial_delay_seconds: float = Field(1.0, ge=0, le=86400)
    max_delay_seconds: float = Field(300.0, ge=0, le=86400)
    multiplier: float = Field(2.0, ge=1.0, le=100.0)
    jitter: float = Field(0.1, ge=0.0, le=1.0, description="Random fraction added or removed from each delay.")
    reset_after_seconds: float = Field(600.0, ge=0, description="A run this long resets the backoff.")
    max_attempts: int | None = Field(None, ge=0, description="Restarts before Failed; unset = unlimited.")


class FailureRate(Model):
    max_failures: int = Field(3, ge=1, le=10000, description="Failures allowed within interval.")
    interval_seconds: float = Field(300.0, gt=0, le=604800)
    delay_seconds: float = Field(10.0, ge=0, le=86400)


class RestartStrategy(Model):
    type: Literal["fixed-delay", "exponential-delay", "failure-rate"] = "exponential-delay"
    fixed_delay: FixedDelay | None = None
    exponential_delay: ExponentialDelay | None = None
    failure_rate: FailureRate | None = None

    @model_validator(mode="after")
    def _one_config(self) -> "RestartStrategy":
        wanted = {"fixed-delay": "fixed_delay", "exponential-delay": "exponential_delay",
                  "failure-rate": "failure_rate"}[self.type]
        for other in ("fixed_delay", "exponential_delay", "failure_rate"):
            if other != wanted and getattr(self, other) is not None:
                raise ValueError(f"restartStrategy.{to_camel(other)} is set but restartStrategy.type is "
                                 f"{self.type!r}: remove it or set type accordingly")
        if getattr(self, wanted) is None:
            setattr(self, wanted, {"fixed_delay": FixedDelay, "exponential_delay": ExponentialDelay,
                                   "failure_rate": FailureRate}[wanted]())
        return self


class SnapshotPolicy(Model):
    interval_seconds: int | None = Field(None, ge=10, le=604800, description=(
        "Take a periodic snapshot of the running stream this often (a consistent copy of a committed batch, "
        "the query keeps running); unset = no periodic snapshots."))
    max_count: int = Field(5, ge=1, le=1000, description=(
        "Keep at most this many snapshots of the stream (the newest completed one and any a stream was "
        "restored from are always kept)."))
    max_age_seconds: int | None = Field(None, ge=60, description=(
        "Delete snapshots older than this (same exceptions as maxCount); unset = no age limit."))
    dispose_on_delete: bool = Field(True, description=(
        "Snapshots created for this stream delete their files when their ExactlyOnceSnapshot is deleted."))
    max_retries: int = Field(3, ge=0, le=100, description="Retries of a failed snapshot before it is Failed.")


class ExactlyOnceStreamSpec(Model):
    job: JobSpec
    source: SourceSpec
    sink: SinkSpec
    checkpoint: CheckpointSpec
    trigger_interval_ms: int = Field(1000, ge=100, le=86_400_000, description="Micro-batch trigger interval.")
    restart_strategy: RestartStrategy = Field(default_factory=RestartStrategy)
    upgrade_mode: Literal["snapshot", "last-state", "stateless"] = Field("snapshot", description=(
        "How a spec change is applied: snapshot (stop with a snapshot, start from it), last-state "
        "(restart on the live checkpoint), stateless (fresh checkpoint; only when asked)."))
    restart_nonce: int = Field(0, description="Change to restart the stream, also after RestartsExhausted.")
    snapshots: SnapshotPolicy = Field(default_factory=SnapshotPolicy, description=(
        "Periodic snapshots and how many are kept."))
    snapshot_nonce: int = Field(0, description=(
        "Change to take a snapshot now (an ExactlyOnceSnapshot <name>-n<nonce>; beyond 63 characters the "
        "name is shortened with a hash)."))
    restore_from: str | None = Field(None, min_length=1, description=(
        "Start from a snapshot: the name of a Completed ExactlyOnceSnapshot in this namespace, or an absolute "
        "snapshot path in the checkpoint store. Seeds a new checkpoint location; the snapshot is never changed. "
        "Setting or changing it on a running stream restores it (an upgrade from that snapshot)."))
    upgrade_pre_flight: bool = Field(True, description=(
        "Before stopping the old driver for an upgrade, start the new spec on a scratch copy of the state "
        "(writing nothing) and block the upgrade if Spark refuses it."))
    upgrade_readiness_timeout_seconds: int = Field(300, ge=10, le=86400, description=(
        "After an upgrade, the new driver must run and commit a batch within this time, else the stream "
        "is rolled back to the last stable spec from the upgrade's snapshot."))

    def spec_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.wire(), sort_keys=True).encode()).hexdigest()[:16]


def semantic_errors(spec: ExactlyOnceStreamSpec) -> list[str]:
    """Checks the schema cannot express; each message names the field and the fix."""
    errors: list[str] = []
    sink_topics = {spec.sink.topic, spec.sink.dead_letter_topic, spec.sink.ledger_topic} - {None}
    same_cluster = spec.source.bootstrap_servers == spec.sink.bootstrap_servers
    for t in spec.source.topics:
        if t in sink_topics and same_cluster:
            errors.append(f"sink.topic: {t!r} is also a source topic; the stream would read its own output. "
                          "Choose another sink.topic")
    if spec.sink.dead_letter_topic and spec.sink.dead_letter_topic == spec.sink.topic:
        errors.append("sink.deadLetterTopic: must differ from sink.topic")
    if spec.checkpoint.store == "pvc" and not spec.checkpoint.claim_name:
        errors.append("checkpoint.claimName: required when checkpoint.store is pvc")
    for key in spec.sink.producer_config:
        if key in PRODUCER_RESERVED:
            errors.append(f"sink.producerConfig.{key}: set by the runtime for exactly-once; remove it")
        if "sasl" in key.lower() or "password" in key.lower():
            errors.append(f"sink.producerConfig.{key}: credentials must come from sink.credentials "
                          "(a Secret reference), not producerConfig")
    return errors


# The exactly-once protocol owns these producer settings.
PRODUCER_RESERVED = frozenset({
    "transactional.id", "enable.idempotence", "acks", "partitioner", "transaction.timeout.ms",
    "bootstrap.servers", "isolation.level",
})


# ------------------------------------------------------------------------- status
class Condition(Model):
    """A condition per the Kubernetes API conventions; lastTransitionTime changes only when status flips."""
    type: str = Field(..., description="Ready, Progressing or Degraded.")
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(..., description="CamelCase reason of the current status.")
    message: str = ""
    observed_generation: int | None = Field(None, description="metadata.generation this condition was computed for.")
    last_transition_time: str | None = Field(None, description="When status last flipped (RFC 3339).")


class SlotRecord(Model):
    slot: int
    batch: int
    count: int
    digest: str


class ResolutionReport(Model):
    """What resolution found before a (re)start; kept compact in status."""
    stream_uid: str
    checkpoint_id: str | None = Field(None, description="Spark query id from the checkpoint's metadata, if any.")
    checkpoint_readable: bool = Field(True, description=(
        "False: the checkpoint store is not mounted where resolution ran (a PVC seen from the operator); "
        "the transactions were fenced, and the driver reads its checkpoint itself."))
    generation: int
    slots: int
    fenced_transactional_ids: int = 0
    open_transactions_aborted: int = 0
    last_committed_batch_per_slot: dict[str, int] = Field(default_factory=dict)
    checkpoint_last_offsets_batch: int | None = None
    checkpoint_last_committed_batch: int | None = None
    last_complete_batch: int | None = Field(None, description="Last batch with a batch-complete ledger record.")
    replay_batch: int | None = Field(None, description="Batch the restart replays (offsets logged, not committed).")
    replay_slots_already_committed: list[int] = Field(default_factory=list)
    partially_committed: bool = Field(False, description="Some but not all slots committed the replay batch.")
    summary: str = ""


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
    snapshot_name: str | None = None
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
    requested_at: str | None = None
    note: str = Field("", description="Why the upgrade deviates from its mode (e.g. no snapshot could be taken).")


class UpgradeCheck(Model):
    """An upgrade (or restore) whose new driver has not yet proven itself: Running and a batch committed."""
    target_spec_hash: str
    pod: str = Field(..., description="The new driver.")
    deadline: str = Field(..., description="Roll back if the new driver is not ready by then (RFC 3339).")
    baseline_batch: int | None = Field(None, description="A batch after this one must commit.")
    rollback_snapshot: str | None = Field(None, description="Snapshot taken before the upgrade (rollback source).")
    previous_spec: str | None = Field(None, description="JSON of the last stable spec (rollback target).")
    previous_tx_generation: int = 0


class RejectedSpec(Model):
    """A spec the operator will not run (pre-flight refused it, or it was rolled back); the old one keeps running."""
    spec_hash: str
    reason: Literal["PreFlightFailed", "RolledBack"]
    message: str = ""
    time: str | None = None
    run_spec: str | None = Field(None, description="JSON of the spec that runs instead (the last stable one).")


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
    message: str = ""


class ExactlyOnceStreamStatus(Model):
    observed_generation: int | None = Field(None, description="metadata.generation the operator last acted on.")
    lifecycle_state: Literal["Created", "Deploying", "Running", "Restarting", "Upgrading", "Suspended",
                             "Failed", "Invalid"] = Field("Created", description="Derived lifecycle state.")
    conditions: list[Condition] = Field(default_factory=list)
    last_committed_batch: int | None = Field(None, description="Last batch committed to the sink, as last seen.")
    nondeterministic_slots: int | None = Field(None, description=(
        "Replayed slots whose output differed from what the sink holds (the transformation is not "
        "deterministic), summed over the stream's ledger, as last seen."))
    restart_count: int = Field(0, description="Restarts since the last reset (restartNonce or a stable run).")
    next_restart_time: str | None = Field(None, description="When the pending restart may start (RFC 3339).")
    last_error: str | None = Field(None, description="Why the last driver failed: exit code and termination message.")
    resolution: ResolutionReport | None = Field(None, description="Report of the last resolution.")
    last_reconciled_spec: str | None = Field(None, description="JSON of the spec the current driver was launched with.")
    tx_generation: int = Field(0, description="Transactional-id generation of the running spec.")
    driver_pod: str | None = Field(None, description="Name of the current driver Pod.")
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


# ------------------------------------------------------- ExactlyOnceSnapshot
SNAPSHOT_KIND = "ExactlyOnceSnapshot"
SNAPSHOT_PLURAL = "exactlyoncesnapshots"
SNAPSHOT_SHORT_NAMES = ["eoss"]
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class SnapshotSpec(Model):
    stream: str = Field(..., pattern=DNS_LABEL, max_length=63, description="The ExactlyOnceStream (same namespace).")
    trigger: Literal["manual", "periodic", "nonce", "upgrade"] = Field("manual", description=(
        "Who asked: manual (created by a user), periodic (snapshots.intervalSeconds), nonce (snapshotNonce), "
        "upgrade (written by the driver when it stopped for an upgrade)."))
    path: str | None = Field(None, min_length=1, description=(
        "Snapshot directory; default <checkpoint.path>/snapshots/<name>. For trigger upgrade: the snapshot "
        "the driver wrote (it is verified, not copied)."))
    max_retries: int = Field(3, ge=0, le=100, description="Retries of a failed attempt before the snapshot is Failed.")
    dispose_on_delete: bool = Field(True, description="Delete the snapshot's files when this resource is deleted.")


class SnapshotAccess(Model):
    """How a Pod reaches the snapshot's files, recorded at its first attempt: disposal works after its
    stream is gone (snapshots outlive their streams)."""
    image: str
    service_account_name: str | None = None
    store: Literal["pvc", "local"]
    claim_name: str | None = None
    mount_path: str = Field(..., description="checkpoint.path of the stream (the claim's mount path).")


class ExactlyOnceSnapshotStatus(Model):
    state: Literal["Pending", "InProgress", "Completed", "Failed"] = Field("Pending", description=(
        "Pending: waiting to start (or to retry); InProgress: the copy runs; Completed; Failed: retries exhausted."))
    path: str | None = Field(None, description="Snapshot directory in the checkpoint store.")
    batch: int | None = Field(None, description="Last batch committed in the snapshot.")
    checkpoint_id: str | None = None
    stream_uid: str | None = Field(None, description="Stream id in the manifest (eos_job.spec.stream_uid).")
    spec_hash: str | None = None
    size_bytes: int | None = None
    taken_at: str | None = Field(None, description="When the snapshot was written (RFC 3339, from the manifest).")
    attempts: int = Field(0, description="Attempts started so far.")
    pod: str | None = Field(None, description="The Pod of the current attempt.")
    next_attempt_time: str | None = Field(None, description="A retry starts no earlier than this (RFC 3339).")
    last_error: str | None = None
    access: SnapshotAccess | None = Field(None, description=(
        "The stream's image, ServiceAccount and checkpoint volume, as the snapshot's Pods use them."))
    message: str = ""
    observed_generation: int | None = None


# ---------------------------------------------------------------- the job config
def stream_uid(namespace: str, name: str) -> str:
    """The stream id in ledger keys and transactional ids: derived from namespace and name.

    Not the resource's metadata.uid: a stream deleted and re-created with the
    same name on the same checkpoint is the same stream and must skip what its
    earlier incarnation committed. A fork (another name) is another stream.
    """
    return hashlib.sha256(f"{namespace}/{name}".encode()).hexdigest()[:32]


class StreamIdentity(Model):
    name: str
    namespace: str = "default"
    uid: str = Field(..., min_length=1, description="Stable stream id: stream_uid(namespace, name).")
    generation: int = Field(0, ge=0, description="Transactional-id generation; bumped when slots change.")

    @property
    def transactional_prefix(self) -> str:
        return f"eos-{self.namespace}-{self.name}-{self.uid[:8]}"


class RunConfig(Model):
    """What the driver runs: the stream's identity and its spec."""
    stream: StreamIdentity
    spec: ExactlyOnceStreamSpec
    checkpoint_dir: str = Field(..., description="Resolved checkpoint directory of this run.")
    restore_from: str | None = Field(None, description=(
        "Snapshot directory that seeds checkpoint_dir when it is still empty (restore, snapshot upgrade)."))
    replay_offsets_from: str | None = Field(None, description=(
        "After a restore: the checkpoint the stream ran on before. Batches it logged after the snapshot are "
        "re-run with their original offsets (so the ledger's skips match what the sink holds)."))

    def ledger_topic(self) -> str:
        return self.spec.sink.ledger_topic or f"{self.spec.sink.topic}.eos-ledger.{self.stream.namespace}.{self.stream.name}"


def load_run_config(doc: dict) -> RunConfig:
    """Accept a RunConfig document or an ExactlyOnceStream manifest (as applied with kubectl).

    The stream id is derived from namespace and name (``stream_uid``), as the
    operator does, so a local run of a manifest is the same stream as in the cluster.
    """
    if doc.get("kind") == KIND:
        meta = doc.get("metadata") or {}
        name = meta.get("name")
        if not name:
            raise ValueError("metadata.name: required")
        ns = meta.get("namespace", "default")
        uid = stream_uid(ns, name)
        spec = ExactlyOnceStreamSpec.model_validate(doc.get("spec") or {})
        gen = int((doc.get("status") or {}).get("txGeneration", 0))
        ck = spec.checkpoint.path.rstrip("/") + "/live"
        return RunConfig(stream=StreamIdentity(name=name, namespace=ns, uid=uid, generation=gen),
                         spec=spec, checkpoint_dir=ck)
    return RunConfig.model_validate(doc)
