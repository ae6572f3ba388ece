"""The ``ExactlyOnceStream`` resource: one set of models for its spec and status.

Used by the operator (validation, planning, the generated CRD) and by the job
runtime (its config is the resource's spec). Field names are camelCase on the
wire, snake_case in Python. Unknown fields are rejected so a typo names itself.
"""
from __future__ import annotations

import hashlib
import json
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from .driver_metrics import DriverMetrics, metrics_errors
from .event_log import EventLog, event_log_errors
from .model import Model
from .memory import driver_memory_errors
from .kafka_security import KafkaCredentials, KafkaTls, SecretKeyRef, end_errors
from .pod_template import PodTemplate
from .spec_rules import (BOOTSTRAP_PATTERN, CHECKPOINT_PATH_PATTERN, DNS_SUBDOMAIN, EXPONENTIAL_DELAY_RULES,
                         IMAGE_PATTERN, MAX_ENTRIES, MAX_IMAGE, MAX_LOCATION, MAX_NAME, MAX_PATH, MAX_SERVERS,
                         MAX_VALUE, RESTORE_FROM_PATTERN, S3_CREDENTIAL_RULES, SINK_RULES, SOURCE_OPTION_RULES,
                         PRODUCER_RESERVED, SOURCE_RESERVED, SPARK_CONF_RULES, SPARK_RESERVED, STREAM_RULES,
                         TOPIC_PATTERN, WRITER_DOC, default_ledger_topic, jvm_writer_errors, restore_errors,
                         s3_credential_errors, slots_errors, spark_env_errors, topic_errors)

API_GROUP = "streaming.eos.dev"
API_VERSION = "v1beta1"   # served and stored; older versions served: eos_operator.crd.OLDER_VERSIONS
KIND = "ExactlyOnceStream"
PLURAL = "exactlyoncestreams"
SHORT_NAMES = ["eos"]
DEFAULT_IMAGE = "ghcr.io/spark-eos/spark-eos-operator:0.1.0"

MODULE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$"
# Free-form maps (args, sparkConf, options, producerConfig): bounded keys, values and entries.
Settings = Annotated[dict[Annotated[str, Field(min_length=1, max_length=MAX_NAME)],
                          Annotated[str, Field(max_length=MAX_VALUE)]], Field(max_length=MAX_ENTRIES)]
Servers = Annotated[str, Field(min_length=1, max_length=MAX_SERVERS, pattern=BOOTSTRAP_PATTERN)]


# --------------------------------------------------------------------------- spec
class Resources(Model):
    cpu: str = Field("1", max_length=32, pattern=QUANTITY_PATTERN, description="CPU request and limit, e.g. 500m or 2.")
    memory: str = Field("1Gi", max_length=32, pattern=QUANTITY_PATTERN,
                        description="Memory request and limit, e.g. 2Gi.")


class DriverSpec(Resources):
    # The default stays 1Gi: a CRD default applies to stored objects as they are read, so a new one would be a
    # change of every stream that left the field unset, and an operator upgrade would restart their drivers.
    memory: str = Field("1Gi", max_length=32, pattern=QUANTITY_PATTERN, description=(
        "Memory request and limit, e.g. 2Gi: split between the JVM heap, the JVM's other memory and Python "
        "(eos_job.memory; docs/operations.md#driver-memory)."))
    start_timeout_seconds: int = Field(300, ge=10, le=3600, description=(
        "A driver Pod that is not running within this time of its creation (an image that cannot be pulled, "
        "a missing Secret or ConfigMap, no node that fits, an unbound claim) fails, saying why; the restart "
        "strategy then applies. Until then status says what blocks it."))


class ExecutorSpec(Resources):
    instances: int = Field(1, ge=1, le=256, description="Executor Pods (cluster deploy mode only).")
    start_timeout_seconds: int = Field(300, ge=10, le=3600, description=(
        "Cluster deploy mode: the driver fails, saying why, when no executor registered within this time "
        "(e.g. its ServiceAccount may not create Pods); the restart strategy then applies."))
    pod_template: PodTemplate = Field(default_factory=PodTemplate, description=(
        "Added to the executor Pods (cluster deploy mode): labels, annotations, scheduling, pull secrets, env."))


class JobSpec(Model):
    image: str = Field(DEFAULT_IMAGE, min_length=1, max_length=MAX_IMAGE, pattern=IMAGE_PATTERN, description=(
        "Container image with the job runtime and the user's module: [registry[:port]/]repository[:tag]"
        "[@sha256:digest]."))
    module: str = Field(..., max_length=MAX_NAME, pattern=MODULE_PATTERN,
                        description="Python module holding the transformation, e.g. examples.colors.job.")
    function: str = Field("transform", max_length=MAX_NAME, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                          description="Function in the module: transform(df: DataFrame, ctx) -> DataFrame.")
    args: Settings = Field(default_factory=dict, description="Settings passed to the transformation as ctx.args.")
    spark_conf: Settings = Field(default_factory=dict, json_schema_extra={"x-kubernetes-validations": SPARK_CONF_RULES},
                                 description=(
        "Extra Spark configuration. Not what the output slots rely on (the runtime sets those): "
        "spark.sql.shuffle.partitions (from parallelism), spark.sql.adaptive.* switches, spark.speculation "
        "(a second attempt of a slot's task would fence the first), spark.sql.streaming.checkpointFileManagerClass."))
    parallelism: int = Field(2, ge=1, le=1024, description=(
        "Output slots P: the output is hash-partitioned by key into P transactional writers. "
        "Changing it is an upgrade under a new transactional-id generation."))
    slots_from: Literal["key", "sourcePartitions"] = Field("key", description=(
        "How the output is cut into slots. key: repartition by key into P slots (any job). sourcePartitions: "
        "one slot per source topic-partition, no shuffle (map-only jobs; P must be at least the source's "
        "partition count). Changing it is an upgrade under a new transactional-id generation."))
    output_mode: Literal["update", "append", "complete"] = Field(
        "update", description="Spark output mode of the query.")
    deploy_mode: Literal["local", "cluster"] = Field(
        "local", description="local: Spark local mode inside the driver Pod; cluster: spark-submit --master k8s:// with executor Pods.")
    driver: DriverSpec = Field(default_factory=DriverSpec)
    executor: ExecutorSpec = Field(default_factory=ExecutorSpec)
    service_account_name: str | None = Field(None, max_length=MAX_NAME, pattern=DNS_SUBDOMAIN,
                                             description="ServiceAccount of the driver Pod (in its namespace).")
    pod_template: PodTemplate = Field(default_factory=PodTemplate, description=(
        "Added to the driver Pod and the stream's pre-flight and drain Pods: labels, annotations, scheduling, "
        "pull secrets, env. What the operator sets wins (eos_job.pod_template)."))
    state: Literal["running", "suspended"] = Field(
        "running", description="suspended stops the driver at a clean batch boundary; running resumes it.")
    metrics: DriverMetrics | None = Field(None, description="The driver's Spark metrics for Prometheus.")
    event_log: EventLog | None = Field(None, description="Spark's event log in the checkpoint store.")


DEFAULT_MAX_OFFSETS_PER_TRIGGER = 100_000


class SourceSpec(Model):
    bootstrap_servers: Servers = Field(..., description=(
        "Kafka bootstrap servers of the source cluster: host:port[,host:port...], no spaces."))
    topics: list[Annotated[str, Field(pattern=TOPIC_PATTERN)]] = Field(..., min_length=1, max_length=MAX_ENTRIES,
                                                                       description="Source topics.")
    starting_offsets: Literal["earliest", "latest"] = Field(
        "earliest", description="Where a fresh checkpoint starts; ignored once the checkpoint has offsets.")
    max_offsets_per_trigger: int = Field(DEFAULT_MAX_OFFSETS_PER_TRIGGER, ge=1, description=(
        "Upper bound of records per micro-batch. Bounded by default, so a start with a backlog runs batches "
        "whose slot transactions fit in sink.transactionTimeoutMs, not one huge batch."))
    options: Settings = Field(default_factory=dict, json_schema_extra={"x-kubernetes-validations": SOURCE_OPTION_RULES},
                              description=(
        "Extra options of Spark's Kafka source. Not the ones the runtime sets: subscribe, subscribePattern and "
        "assign (from topics), startingOffsets, maxOffsetsPerTrigger, failOnDataLoss, kafka.isolation.level "
        "(read_committed: only committed transactions), endingOffsets, startingTimestamp, ...; nor SASL or TLS "
        "settings (credentials, tls)."))
    accept_data_loss: bool = Field(False, description=(
        "Go on after the replay horizon was exceeded: records retention deleted before the stream read them "
        "are skipped (Spark's failOnDataLoss=false). The loss is reported (ReplayHorizonExceeded), never silent; "
        "leave false otherwise."))
    credentials: KafkaCredentials | None = Field(None, description=(
        "SASL credentials of the source cluster, by Secret reference (never in options)."))
    tls: KafkaTls | None = Field(None, description="TLS to the source cluster: a private CA, a client certificate.")
    replay_horizon_warning_seconds: int | None = Field(None, ge=1, description=(
        "Warn (event, Degraded condition) when retention will delete the oldest record the stream has not "
        "processed within this many seconds; default half the topic's retention.ms."))


class SinkSpec(Model):
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": SINK_RULES})
    bootstrap_servers: Servers = Field(..., description=(
        "Kafka bootstrap servers of the sink cluster: host:port[,host:port...], no spaces. A list that shares "
        "a host:port with the source's (in any order, any case) is the same cluster."))
    topic: str = Field(..., pattern=TOPIC_PATTERN, description="Default output topic.")
    dead_letter_topic: str | None = Field(None, pattern=TOPIC_PATTERN, description=(
        "Topic for poison records, on the sink cluster (written in the same transaction)."))
    ledger_topic: str | None = Field(None, pattern=TOPIC_PATTERN, description=(
        "The stream's ledger topic; default <topic>.eos-ledger.<namespace>.<name>, which must fit Kafka's 249 "
        "characters (else set this). Differs from topic and deadLetterTopic."))
    transaction_timeout_ms: int = Field(60000, ge=1000, le=900000, description=(
        "Kafka transaction.timeout.ms of the slot producers (at most the broker's transaction.max.timeout.ms)."))
    producer_config: Settings = Field(default_factory=dict, description=(
        "Extra librdkafka producer settings. Credentials go in credentials, never here."))
    credentials: KafkaCredentials | None = Field(None, description="SASL credentials of the sink cluster, by Secret reference.")
    tls: KafkaTls | None = Field(None, description="TLS to the sink cluster: a private CA, a client certificate.")
    audit_headers: bool = Field(True, description=(
        "Label every output record with headers naming its batch and slot (eos.batch, eos.slot), so that "
        "`kubectl eos verify` can check each committed slot against the ledger. They cost about 1.3 us of CPU "
        "per record in the slot task; false writes records without them, and verify then cannot run."))
    writer: Literal["python", "jvm"] | None = Field(None, description=WRITER_DOC)


class S3Store(Model):
    bucket: str = Field(..., pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", description="The bucket.")
    endpoint: str | None = Field(None, max_length=MAX_NAME, pattern=r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?/?$",
                                 description=(
        "http(s)://host[:port] of an S3-compatible server; unset: AWS S3 of the region."))
    region: str = Field("us-east-1", pattern=r"^[a-z0-9-]{1,32}$", description="The bucket's region.")
    path_style_access: bool = Field(False, description=(
        "Address the bucket in the path (http://host/bucket/key), as most S3-compatible servers need."))
    credentials: Literal["secret", "ambient"] | None = Field(None, description=(
        "Whose identity reads the bucket. secret (or unset): the keys of accessKeyId and secretAccessKey, "
        "required. ambient: no keys; the operator reads the bucket with its own identity (environment, "
        "instance profile, IRSA, GKE Workload Identity) and the stream's Pods with theirs; accepted only by "
        "an operator installed with operator.allowAmbientS3Credentials (--allow-ambient-s3-credentials)."))
    access_key_id: SecretKeyRef | None = Field(None, description=(
        "The access key id, from a Secret (credentials secret)."))
    secret_access_key: SecretKeyRef | None = Field(None, description="The secret access key, from a Secret.")

    @model_validator(mode="after")
    def _both_keys(self) -> "S3Store":
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise ValueError("checkpoint.s3: set both accessKeyId and secretAccessKey, or neither")
        return self


class CheckpointSpec(Model):
    # CEL rules: `kubectl apply` refuses a store without its settings at once (semantic_errors says it too).
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "self.store != 's3' || has(self.s3)",
         "message": "spec.checkpoint.s3 is required when checkpoint.store is s3: set at least s3.bucket"},
        *S3_CREDENTIAL_RULES,
        {"rule": "self.store != 'pvc' || has(self.claimName)",
         "message": "spec.checkpoint.claimName is required when checkpoint.store is pvc: name the claim"},
    ]})
    store: Literal["pvc", "local", "s3"] = Field("pvc", description=(
        "pvc: a PersistentVolumeClaim mounted in the driver; s3: an S3 (compatible) bucket, read by the "
        "operator directly; local: a path on the node (tests only)."))
    claim_name: str | None = Field(None, max_length=MAX_NAME, pattern=DNS_SUBDOMAIN,
                                   description="The PersistentVolumeClaim (store=pvc).")
    s3: S3Store | None = Field(None, description="The bucket (store=s3).")
    path: str = Field(..., max_length=MAX_PATH, pattern=CHECKPOINT_PATH_PATTERN, description=(
        "Directory for checkpoints and snapshots inside the store, absolute, without '.' or '..' segments: "
        "the claim's mount path (pvc), a directory on the node (local), the key prefix in the bucket (s3)."))

    def root(self) -> str:
        """Where this stream's checkpoints and snapshots live, as Spark and the storage layer spell it."""
        if self.store == "s3" and self.s3 is not None:
            return f"s3a://{self.s3.bucket}/{self.path.strip('/')}"
        return self.path.rstrip("/")


class FixedDelay(Model):
    attempts: int = Field(3, ge=0, le=1000, description="Restarts before the stream is Failed.")
    delay_seconds: float = Field(10.0, ge=0, le=86400)


class ExponentialDelay(Model):
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": EXPONENTIAL_DELAY_RULES})
    initial_delay_seconds: float = Field(1.0, ge=0, le=86400)
    max_delay_seconds: float = Field(300.0, ge=0, le=86400)
    multiplier: float = Field(2.0, ge=1.0, le=100.0)
    jitter: float = Field(0.1, ge=0.0, le=1.0, description="Random fraction added or removed from each delay.")
    reset_after_seconds: float = Field(600.0, ge=0, description="A run this long resets the backoff.")
    max_attempts: int | None = Field(None, ge=0, description="Restarts before Failed; unset = unlimited.")

    @model_validator(mode="after")
    def _initial_within_max(self) -> "ExponentialDelay":
        if self.initial_delay_seconds > self.max_delay_seconds:
            raise ValueError(f"restartStrategy.exponentialDelay.initialDelaySeconds: {self.initial_delay_seconds:g} is "
                             f"over maxDelaySeconds ({self.max_delay_seconds:g}), the bound of every delay: lower "
                             "initialDelaySeconds or raise maxDelaySeconds")
        return self


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
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": STREAM_RULES})
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
    restore_from: str | None = Field(None, min_length=1, max_length=MAX_LOCATION, pattern=RESTORE_FROM_PATTERN,
                                     description=(
        "Start from a snapshot: the name of a Completed ExactlyOnceSnapshot in this namespace (looked up there "
        "only), or an absolute snapshot path (/..., file:///..., s3a://...) without '.' or '..' segments inside "
        "the stream's store: under checkpoint.path for pvc and local (the only part of the volume its Pods "
        "mount), in checkpoint.s3.bucket for s3 (its keys reach that bucket); a snapshot elsewhere is named by "
        "its ExactlyOnceSnapshot. Seeds a new checkpoint location; the snapshot is never changed. "
        "Setting or changing it on a running stream restores it (an upgrade from that snapshot)."))
    upgrade_pre_flight: bool = Field(True, description=(
        "Before stopping the old driver for an upgrade, start the new spec on a scratch copy of the state "
        "(writing nothing) and block the upgrade if Spark refuses it."))
    upgrade_readiness_timeout_seconds: int = Field(300, ge=10, le=86400, description=(
        "After an upgrade, the new driver must run and commit a batch within this time, else the stream "
        "is rolled back to the last stable spec from the upgrade's snapshot."))

    def spec_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.wire(), sort_keys=True).encode()).hexdigest()[:16]

    def output_hash(self) -> str:
        """The part of the spec that decides what a batch writes (code, arguments, slots, topics), not how
        it runs (resources, nonces, snapshot policy): the ledger refuses to finish one spec's batch with
        another's."""
        j, src, snk = self.job, self.source, self.sink
        decisive = {"image": j.image, "module": j.module, "function": j.function, "args": j.args,
                    "parallelism": j.parallelism, "outputMode": j.output_mode, "topics": src.topics,
                    "options": src.options, "topic": snk.topic, "deadLetterTopic": snk.dead_letter_topic}
        if j.slots_from != "key":   # only when set: the streams that never set it keep their output hash
            decisive["slotsFrom"] = j.slots_from
        return hashlib.sha256(json.dumps(decisive, sort_keys=True).encode()).hexdigest()[:16]


def semantic_errors(spec: ExactlyOnceStreamSpec, namespace: str | None = None, name: str | None = None) -> list[str]:
    """Checks beyond the fields' own (the CRD's CEL rules say most of them too); each message names the field
    and the fix. With the stream's namespace and name the derived ledger topic is checked too."""
    errors: list[str] = topic_errors(spec, namespace, name) + restore_errors(spec)
    if spec.checkpoint.store == "pvc" and not spec.checkpoint.claim_name:
        errors.append("checkpoint.claimName: required when checkpoint.store is pvc")
    errors += spec.job.pod_template.errors("job.podTemplate")
    errors += end_errors("source", spec.source.credentials, spec.source.tls)
    errors += end_errors("sink", spec.sink.credentials, spec.sink.tls) + jvm_writer_errors(spec.sink)
    errors += [f"source.options.{k}: credentials and TLS material come from source.credentials and source.tls "
               "(Secret references), never options" for k in spec.source.options
               if k.lower().startswith(("kafka.sasl.", "kafka.ssl.", "kafka.security."))]
    errors += spec.job.executor.pod_template.errors("job.executor.podTemplate")
    if spec.checkpoint.store == "s3" and spec.checkpoint.s3 is None:
        errors.append("checkpoint.s3: required when checkpoint.store is s3 (at least its bucket)")
    errors += s3_credential_errors(spec.checkpoint)
    for key in spec.source.options:
        if key in SOURCE_RESERVED:
            via = SOURCE_RESERVED[key]
            errors.append(f"source.options.{key}: set by the runtime for exactly-once"
                          f"{f' (from {via})' if via else ''}; remove it")
    errors += slots_errors(spec)
    errors += driver_memory_errors(spec)
    for key in spec.job.spark_conf:
        if key in SPARK_RESERVED:
            via = SPARK_RESERVED[key]
            errors.append(f"job.sparkConf.{key}: the output slots rely on it{f' (set from {via})' if via else ''}; "
                          "remove it")
    errors += spark_env_errors(spec.job.spark_conf) + metrics_errors(spec) + event_log_errors(spec)
    for key in spec.sink.producer_config:
        if key in PRODUCER_RESERVED:
            errors.append(f"sink.producerConfig.{key}: set by the runtime for exactly-once; remove it")
        if "sasl" in key.lower() or "password" in key.lower():
            errors.append(f"sink.producerConfig.{key}: credentials must come from sink.credentials "
                          "(a Secret reference), not producerConfig")
    return errors


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
        return self.spec.sink.ledger_topic or default_ledger_topic(self.spec.sink.topic, self.stream.namespace,
                                                                   self.stream.name)


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
        ck = spec.checkpoint.root() + "/live"
        return RunConfig(stream=StreamIdentity(name=name, namespace=ns, uid=uid, generation=gen),
                         spec=spec, checkpoint_dir=ck)
    return RunConfig.model_validate(doc)
