"""The rules of an ``ExactlyOnceStream`` beyond types and bounds, in the three forms that say the same thing.

* Patterns and lengths of the pydantic fields (``spec.py``): the generated CRD carries them, so ``kubectl
  apply`` refuses a malformed value at once.
* CEL rules (``x-kubernetes-validations``, with messages in the project's style) for what spans fields: the
  API server evaluates them at once too.
* Python checks (``topic_errors``, ``restore_errors``, through ``spec.semantic_errors``) that the operator
  (``eos_operator.validation``) and ``eos-job validate`` run on top, so a CRD installed without its rules, or a
  manifest checked offline, is refused the same way.
  What needs the stream's namespace (the derived ledger topic's length) is checked only here: CEL sees no
  namespace (the CRD checks the bound a one-character namespace gives).

Kept out of ``spec.py`` (which imports this module) to keep that one the models' shape.
"""
from __future__ import annotations

import json
import re
from typing import Any

# sink.writer's rules live in writer_rules; spec takes WRITER_DOC and jvm_writer_errors from here with the rest.
from .writer_rules import JVM_WRITER_LIMITS, WRITER_DOC, jvm_writer_errors  # noqa: F401

# ------------------------------------------------------------------ patterns
_DNS = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_LABEL = rf"^{_DNS}$"                                   # namespaces, label-like names (at most 63)
DNS_1035_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"           # Service names: the stream's <name>-driver
DNS_SUBDOMAIN = rf"^{_DNS}(\.{_DNS})*$"                     # object names (at most 253)
# Kafka topic names: legal characters, at most 249, and never "." or ".." (Kafka refuses both).
TOPIC_PATTERN = r"^([a-zA-Z0-9_-][a-zA-Z0-9._-]{0,248}|\.([a-zA-Z0-9_-][a-zA-Z0-9._-]{0,247}|\.[a-zA-Z0-9._-]{1,247}))$"
_HOST = (r"([A-Za-z0-9_]([-A-Za-z0-9_]*[A-Za-z0-9_])?(\.[A-Za-z0-9_]([-A-Za-z0-9_]*[A-Za-z0-9_])?)*"
         r"|\[[0-9A-Fa-f:.]+\])")
_PORT = r"([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
BOOTSTRAP_PATTERN = rf"^{_HOST}:{_PORT}(,{_HOST}:{_PORT})*$"
# An OCI image reference: [registry[:port]/]path[:tag][@digest] (the grammar of the distribution reference).
_REGISTRY = (r"([A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*"
             r"|\[[0-9A-Fa-f:]+\])(:[0-9]{1,5})?")
_COMPONENT = r"[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*"
IMAGE_PATTERN = (rf"^({_REGISTRY}/)?{_COMPONENT}(/{_COMPONENT})*(:[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
                 r"(@[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9A-Fa-f]{32,})?$")
# A path segment: not empty, not "." or ".." (nor all dots), no whitespace, '%' (no encoded dots) or '\'.
_SEGMENT = r"\.{0,2}[^./\s%\\][^/\s%\\]*"
_ABSOLUTE = rf"/{_SEGMENT}(/{_SEGMENT})*/?"
_BUCKET = r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"
CHECKPOINT_PATH_PATTERN = rf"^{_ABSOLUTE}$"
_LOCATION = rf"(file://)?{_ABSOLUTE}|s3a?://{_BUCKET}{_ABSOLUTE}"
SNAPSHOT_PATH_PATTERN = rf"^({_LOCATION})$"               # a snapshot directory: absolute path or s3 URI
RESTORE_FROM_PATTERN = rf"^({_DNS}(\.{_DNS})*|{_LOCATION})$"

MAX_TOPIC = 249
MAX_NAME = 253
MAX_PATH = 512                 # checkpoint.path (a mount path, or a key prefix)
MAX_LOCATION = 1024            # a snapshot location (S3 keys have at most 1024 bytes)
MAX_IMAGE = 512
MAX_SERVERS = 512              # a broker list (CEL compares two of them: the API server's cost budget)
MAX_VALUE = 4096               # one value of args, sparkConf, options, producerConfig
MAX_ENTRIES = 256              # entries of those maps; source topics
MAX_STREAM_NAME = 63 - len("-driver")   # the driver's Service is <name>-driver (eos_operator.children)
MAX_SNAPSHOT_NAME = 63                  # a snapshot's name is a label value of its Pods
LEDGER_INFIX = ".eos-ledger."

# What a value refused by a pattern must look like (the operator's and eos-job's messages; pydantic would
# only print the expression).
PATTERN_HINTS = {
    TOPIC_PATTERN: "not a valid Kafka topic name: use letters, digits, '.', '_' and '-', at most 249 characters, "
                   "and not '.' or '..'",
    BOOTSTRAP_PATTERN: "not a broker list: write host:port[,host:port...] with ports 1-65535 and no spaces, "
                       "e.g. kafka-0.kafka:9092,kafka-1.kafka:9092",
    IMAGE_PATTERN: "not an image reference: write [registry[:port]/]repository[:tag][@sha256:digest] in "
                   "lowercase, e.g. ghcr.io/acme/job:1.2",
    DNS_SUBDOMAIN: "not a Kubernetes object name: use lowercase letters, digits, '-' and '.', starting and "
                   "ending with a letter or digit",
    CHECKPOINT_PATH_PATTERN: "must be an absolute path (/...) without '.' or '..' segments, empty segments, "
                             "whitespace, '%' or '\\'",
    SNAPSHOT_PATH_PATTERN: "must be an absolute path (/..., file:///...) or s3a://<bucket>/<key> without '.' or "
                           "'..' segments, empty segments, whitespace, '%' or '\\'",
    RESTORE_FROM_PATTERN: "must be the name of an ExactlyOnceSnapshot in the stream's namespace (a DNS-1123 "
                          "subdomain name) or an absolute snapshot path (/..., file:///..., s3a://<bucket>/...) "
                          "without '.' or '..' segments, empty segments, whitespace, '%' or '\\'",
}


def explain(error: dict[str, Any]) -> str:
    """The message of one pydantic error, with what the value must look like when a pattern refused it."""
    if error.get("type") == "string_pattern_mismatch":
        hint = PATTERN_HINTS.get((error.get("ctx") or {}).get("pattern"))
        if hint:
            return hint
    msg = str(error.get("msg", ""))
    return msg[len("Value error, "):] if msg.startswith("Value error, ") else msg


# ---------------------------------------------------------- reserved settings
# The exactly-once protocol owns these producer settings.
PRODUCER_RESERVED = frozenset({
    "transactional.id", "enable.idempotence", "acks", "partitioner", "transaction.timeout.ms",
    "bootstrap.servers", "isolation.level"})
# Spark Kafka source options the runtime sets (with the spec field that sets them, if any): a batch's input
# must be the offset ranges of the offset log, read only from committed transactions, never silently short.
SOURCE_RESERVED = {
    "subscribe": "source.topics", "subscribePattern": "source.topics", "assign": "source.topics",
    "kafka.bootstrap.servers": "source.bootstrapServers", "startingOffsets": "source.startingOffsets",
    "maxOffsetsPerTrigger": "source.maxOffsetsPerTrigger", "failOnDataLoss": "source.acceptDataLoss",
    "kafka.isolation.level": None, "endingOffsets": None, "startingTimestamp": None,
    "startingOffsetsByTimestamp": None,
}
# Spark settings the slots rely on: P shuffle partitions, never merged or split by adaptive execution, one
# attempt of a slot's task at a time (a speculative copy would write the slot's transaction twice over and
# fence the original), and on S3 the checkpoint file manager that writes files whole (eos_job.session).
SPARK_RESERVED = {
    "spark.sql.shuffle.partitions": "job.parallelism", "spark.sql.adaptive.enabled": None,
    "spark.sql.adaptive.coalescePartitions.enabled": None, "spark.sql.adaptive.skewJoin.enabled": None,
    "spark.speculation": None, "spark.sql.streaming.checkpointFileManagerClass": "checkpoint.store",
}


def _reserved_rule(field: str, reserved: dict[str, str | None], why: str) -> dict[str, Any]:
    keys = sorted(reserved)
    return {"rule": f"!self.exists(k, k in {json.dumps(keys)})",
            "message": f"spec.{field} must not set {', '.join(keys)}: {why}; remove them"}


# Spark settings that set an environment variable of the driver's or the executors' processes (the rest of the
# key is the variable's name). The runtime's own variables start with EOS_ (the operator sets them, and the
# test-only fault and unsafe switches of eos_job.faults are among them): no spec may set one this way.
ENV_CONF_PREFIXES = ("spark.executorEnv.", "spark.kubernetes.driverEnv.", "spark.yarn.appMasterEnv.",
                     "spark.mesos.driverEnv.", "spark.kubernetes.driver.secretKeyRef.",
                     "spark.kubernetes.executor.secretKeyRef.")
RUNTIME_ENV_PREFIX = "EOS_"
# Spark's Pod template files: a file's containers may carry any environment, and the operator writes the
# executors' own (security context, scratch volume; eos_job.pod_template).
POD_TEMPLATE_FILE_CONF = {"spark.kubernetes.driver.podTemplateFile": "job.podTemplate",
                          "spark.kubernetes.executor.podTemplateFile": "job.executor.podTemplate"}
_RUNTIME_ENV_KEYS = tuple(p + RUNTIME_ENV_PREFIX for p in ENV_CONF_PREFIXES)


def _runtime_env_rule() -> dict[str, str]:
    sets = " || ".join(f"k.startsWith('{p}')" for p in _RUNTIME_ENV_KEYS)
    return {"rule": f"!self.exists(k, {sets})",
            "message": f"spec.job.sparkConf must not set an environment variable named {RUNTIME_ENV_PREFIX}* "
                       f"({', '.join(p + RUNTIME_ENV_PREFIX + '*' for p in ENV_CONF_PREFIXES)}): the operator "
                       "and the runtime own those variables; remove the key or rename the variable"}


SPARK_CONF_RULES = [_reserved_rule("job.sparkConf", SPARK_RESERVED,
                                   "the runtime sets them, the output slots rely on them"),
                    _runtime_env_rule(),
                    _reserved_rule("job.sparkConf", POD_TEMPLATE_FILE_CONF,
                                   "the operator writes the Pods' templates (security context, environment); "
                                   "use job.podTemplate and job.executor.podTemplate instead")]
SOURCE_OPTION_RULES = [_reserved_rule("source.options", SOURCE_RESERVED,
                                      "the runtime sets them for exactly-once (from the source's own fields)")]


# ----------------------------------------------------------------- CEL rules
SINK_RULES = [
    {"rule": "!has(self.deadLetterTopic) || self.deadLetterTopic != self.topic", "fieldPath": ".deadLetterTopic",
     "message": "spec.sink.deadLetterTopic must differ from spec.sink.topic (poison records would be mixed into "
                "the output): choose another topic"},
    {"rule": "!has(self.ledgerTopic) || self.ledgerTopic != self.topic", "fieldPath": ".ledgerTopic",
     "message": "spec.sink.ledgerTopic must differ from spec.sink.topic (ledger records would be mixed into the "
                "output): choose another topic, or leave it unset"},
    {"rule": "!has(self.ledgerTopic) || !has(self.deadLetterTopic) || self.ledgerTopic != self.deadLetterTopic",
     "fieldPath": ".ledgerTopic",
     "message": "spec.sink.ledgerTopic must differ from spec.sink.deadLetterTopic: choose another topic, or leave "
                "it unset"},
    *({"rule": f"!has(self.writer) || self.writer != 'jvm' || {cond}", "fieldPath": f".{field}", "message": msg}
      for cond, field, msg in JVM_WRITER_LIMITS),
]
EXPONENTIAL_DELAY_RULES = [
    {"rule": "self.initialDelaySeconds <= self.maxDelaySeconds", "fieldPath": ".initialDelaySeconds",
     "message": "spec.restartStrategy.exponentialDelay.initialDelaySeconds must be at most maxDelaySeconds (no "
                "delay exceeds the maximum): lower initialDelaySeconds or raise maxDelaySeconds"},
]
_SAME_CLUSTER = ("sets.intersects(self.source.bootstrapServers.lowerAscii().split(','), "
                 "self.sink.bootstrapServers.lowerAscii().split(','))")


def _not_a_source_topic(field: str, optional: bool) -> dict[str, str]:
    guard = f"!has(self.sink.{field}) || " if optional else ""
    return {"rule": f"{guard}!(self.sink.{field} in self.source.topics) || !{_SAME_CLUSTER}",
            "fieldPath": f".sink.{field}",
            "message": f"spec.sink.{field} is also a source topic on the same Kafka cluster (the broker lists "
                       f"share a host:port): the stream would read its own output; choose another sink.{field}"}


_RESTORE_PATH = "has(self.restoreFrom) && self.restoreFrom.contains('/')"
_LOCAL_ROOT = "(self.checkpoint.path.endsWith('/') ? self.checkpoint.path : self.checkpoint.path + '/')"
# Kafka source options that cut one topic-partition's range into several Spark tasks.
SPLITTING_SOURCE_OPTIONS = ("minPartitions", "maxRecordsPerPartition")
_SPLITTING = " || ".join(f"'{k}' in self.source.options" for k in SPLITTING_SOURCE_OPTIONS)
STREAM_RULES = [
    {"rule": f"!has(self.job.slotsFrom) || self.job.slotsFrom != 'sourcePartitions' || "
             f"!has(self.source.options) || !({_SPLITTING})",
     "fieldPath": ".source.options",
     "message": f"spec.source.options: {' and '.join(SPLITTING_SOURCE_OPTIONS)} split a source partition over "
                "several tasks, and job.slotsFrom sourcePartitions takes one slot per source partition: remove "
                "them or set job.slotsFrom key"},
    _not_a_source_topic("topic", False), _not_a_source_topic("deadLetterTopic", True),
    _not_a_source_topic("ledgerTopic", True),
    {"rule": f"!({_RESTORE_PATH}) || self.checkpoint.store != 's3' || (has(self.checkpoint.s3) && ("
             "self.restoreFrom.startsWith('s3a://' + self.checkpoint.s3.bucket + '/') || "
             "self.restoreFrom.startsWith('s3://' + self.checkpoint.s3.bucket + '/')))",
     "fieldPath": ".restoreFrom",
     "message": "spec.restoreFrom: with checkpoint.store s3 a snapshot path must be in the stream's bucket "
                "(s3a://<checkpoint.s3.bucket>/...); name a snapshot elsewhere by its ExactlyOnceSnapshot"},
    {"rule": f"!({_RESTORE_PATH}) || self.checkpoint.store == 's3' || (self.restoreFrom.startsWith('file://') ? "
             f"self.restoreFrom.substring(7) : self.restoreFrom).startsWith({_LOCAL_ROOT})",
     "fieldPath": ".restoreFrom",
     "message": "spec.restoreFrom: with checkpoint.store pvc or local a snapshot path must lie under "
                "checkpoint.path (the only part of the store the stream's Pods mount); name a snapshot "
                "elsewhere by its ExactlyOnceSnapshot"},
]
# On checkpoint (CheckpointSpec): whose identity reads an S3 bucket is the stream's explicit choice, never the
# operator's own credentials by omission (issue 30).
AMBIENT_GATE = ("operator.allowAmbientS3Credentials (chart value; the operator's flag "
                "--allow-ambient-s3-credentials)")
_AMBIENT = "(has(self.s3.credentials) && self.s3.credentials == 'ambient')"
_KEYS_FIX = ("name the bucket's keys (accessKeyId and secretAccessKey, Secret references), or set "
             "checkpoint.s3.credentials: ambient to read it with the operator's and the Pods' own identity "
             f"(IRSA, GKE Workload Identity, instance profile; the operator must allow it: {AMBIENT_GATE})")
S3_CREDENTIAL_RULES = [
    {"rule": f"self.store != 's3' || !has(self.s3) || {_AMBIENT} || "
             "(has(self.s3.accessKeyId) && has(self.s3.secretAccessKey))",
     "fieldPath": ".s3.accessKeyId",
     "message": f"spec.checkpoint.s3.accessKeyId and secretAccessKey are required with checkpoint.store s3 "
                f"unless checkpoint.s3.credentials is ambient: {_KEYS_FIX}"},
    {"rule": f"!has(self.s3) || !{_AMBIENT} || (!has(self.s3.accessKeyId) && !has(self.s3.secretAccessKey))",
     "fieldPath": ".s3.credentials",
     "message": "spec.checkpoint.s3.credentials: ambient reads the bucket without keys, but accessKeyId or "
                "secretAccessKey is set: remove the keys, or set credentials secret (or leave it unset)"},
]
# On the whole object (crd.py): CEL sees metadata.name but not the namespace, so the ledger rule checks the
# bound of a one-character namespace; topic_errors checks the real one.
_LEDGER_BOUND = MAX_TOPIC - len(LEDGER_INFIX) - len(".") - 1
STREAM_OBJECT_RULES = [
    {"rule": "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
     "message": "metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', starting with a "
                "letter): the driver's Service is named <name>-driver; choose another name"},
    {"rule": f"has(self.spec.sink.ledgerTopic) || self.spec.sink.topic.size() + self.metadata.name.size() <= "
             f"{_LEDGER_BOUND}",
     "fieldPath": ".spec.sink.ledgerTopic",
     "message": "spec.sink.ledgerTopic: the default ledger topic <sink.topic>.eos-ledger.<namespace>.<name> "
                f"would be longer than Kafka's {MAX_TOPIC} characters: set sink.ledgerTopic, or shorten "
                "sink.topic or the stream's name"},
]


# ------------------------------------------------------------- Python checks
def default_ledger_topic(topic: str, namespace: str, name: str) -> str:
    return f"{topic}{LEDGER_INFIX}{namespace}.{name}"


def brokers(servers: str) -> set[str]:
    """A bootstrap server list as a set of host:port, host lowercase: the same cluster in any order."""
    return {s.strip().lower() for s in servers.split(",") if s.strip()}


def topic_errors(spec, namespace: str | None = None, name: str | None = None) -> list[str]:
    """The sink's topics: distinct, none a source topic of the same cluster, the derived ledger topic legal."""
    errors: list[str] = []
    sink = spec.sink
    ledger = sink.ledger_topic
    if ledger is None and namespace and name:
        ledger = default_ledger_topic(sink.topic, namespace, name)
        if len(ledger) > MAX_TOPIC:
            errors.append(f"sink.ledgerTopic: unset, so it is <sink.topic>.eos-ledger.<namespace>.<name>, "
                          f"{len(ledger)} characters here, over Kafka's {MAX_TOPIC}: set sink.ledgerTopic, or "
                          "shorten sink.topic or the stream's name")
    if sink.dead_letter_topic is not None and sink.dead_letter_topic == sink.topic:
        errors.append("sink.deadLetterTopic: must differ from sink.topic (poison records would be mixed into the "
                      "output): choose another topic")
    if ledger is not None and ledger == sink.topic:
        errors.append("sink.ledgerTopic: must differ from sink.topic (ledger records would be mixed into the "
                      "output): choose another topic, or leave it unset")
    if ledger is not None and ledger == sink.dead_letter_topic:
        field = "sink.ledgerTopic" if sink.ledger_topic is not None else "sink.deadLetterTopic"
        errors.append(f"{field}: the ledger topic and sink.deadLetterTopic must differ: choose another topic")
    if brokers(spec.source.bootstrap_servers) & brokers(sink.bootstrap_servers):
        for field, topic in (("topic", sink.topic), ("deadLetterTopic", sink.dead_letter_topic),
                             ("ledgerTopic", ledger)):
            if topic is not None and topic in spec.source.topics:
                errors.append(f"sink.{field}: {topic!r} is also a source topic on the same Kafka cluster (the "
                              "broker lists share a host:port); the stream would read its own output. Choose "
                              f"another sink.{field}")
    return errors


def s3_credential_errors(checkpoint) -> list[str]:
    """``checkpoint.s3``: keys (``credentials`` secret, the default) or none (``ambient``), never neither by
    omission and never both (S3_CREDENTIAL_RULES say the same to the API server)."""
    s3 = checkpoint.s3
    if s3 is None:
        return []
    keys = s3.access_key_id is not None or s3.secret_access_key is not None
    if s3.credentials == "ambient":
        return [] if not keys else [
            "checkpoint.s3.credentials: ambient reads the bucket without keys, but accessKeyId or secretAccessKey "
            "is set: remove the keys, or set credentials secret (or leave it unset)"]
    if checkpoint.store == "s3" and not (s3.access_key_id is not None and s3.secret_access_key is not None):
        return [f"checkpoint.s3.accessKeyId: required with checkpoint.store s3 unless checkpoint.s3.credentials is "
                f"ambient (the operator no longer reads a bucket with its own identity by omission): {_KEYS_FIX}"]
    return []


def store_problem(checkpoint, location: str) -> str | None:
    """Why snapshot ``location`` is not in the stream's checkpoint store, None if it is.

    The store is what the stream's Pods reach with the stream's own settings: with ``store: s3`` its bucket
    (the stream's keys read and write there; another bucket would be read with them), with ``pvc`` and
    ``local`` the directory ``checkpoint.path`` (a claim is mounted there and nothing else of it is; a local
    path elsewhere would be any directory of the node or the operator's own filesystem).
    """
    if checkpoint.store == "s3":
        bucket = checkpoint.s3.bucket if checkpoint.s3 is not None else ""
        scheme, _, rest = location.partition("://")
        if scheme not in ("s3a", "s3") or rest.split("/", 1)[0] != bucket:
            return (f"{location!r} is not in the stream's bucket: with checkpoint.store s3 a snapshot path is "
                    f"s3a://{bucket}/<key>")
        return None
    if location.startswith(("s3a://", "s3://")):
        return (f"{location!r} is an S3 location but checkpoint.store is {checkpoint.store}: use a path under "
                f"checkpoint.path ({checkpoint.path})")
    root = checkpoint.path.rstrip("/") + "/"
    if not location.removeprefix("file://").startswith(root):
        return (f"{location!r} is outside checkpoint.path ({checkpoint.path}), the only part of the store the "
                "stream's Pods mount: use a path under it")
    return None


def sets_runtime_env(key: str) -> bool:
    """Whether Spark setting ``key`` sets an ``EOS_*`` variable in a process of the stream."""
    return key.startswith(_RUNTIME_ENV_KEYS)


def spark_env_errors(spark_conf: dict[str, str]) -> list[str]:
    """``job.sparkConf`` keys that would set a runtime variable (``EOS_*``) in the driver's or the executors'
    environment, or replace a Pod template the operator writes; each names the key and the fix."""
    errors = [f"job.sparkConf.{k}: sets the environment variable {k[k.index('.' + RUNTIME_ENV_PREFIX) + 1:]}, and "
              f"variables named {RUNTIME_ENV_PREFIX}* belong to the operator and the runtime; remove the key or "
              "rename the variable" for k in spark_conf if sets_runtime_env(k)]
    errors += [f"job.sparkConf.{k}: the operator writes the Pods' templates (security context, environment); set "
               f"{field} instead and remove the key" for k, field in POD_TEMPLATE_FILE_CONF.items() if k in spark_conf]
    return errors


def slots_errors(spec) -> list[str]:
    """``job.slotsFrom: sourcePartitions`` takes one task per source partition: no option may split one."""
    if spec.job.slots_from != "sourcePartitions":
        return []
    return [f"source.options.{k}: splits a source partition over several tasks, which job.slotsFrom "
            "sourcePartitions cannot take (one slot per source partition); remove it or set job.slotsFrom key"
            for k in spec.source.options if k in SPLITTING_SOURCE_OPTIONS]


def restore_errors(spec) -> list[str]:
    """``restoreFrom``: a snapshot name (looked up in the stream's namespace) or a path in the stream's store.
    Its shape (no relative path, no '..') is the field's pattern."""
    ref = spec.restore_from
    if not ref:
        return []
    if "/" not in ref:
        if len(ref) > MAX_NAME:
            return [f"restoreFrom: a snapshot name has at most {MAX_NAME} characters: name an existing "
                    "ExactlyOnceSnapshot of this namespace"]
        return []
    problem = store_problem(spec.checkpoint, ref)
    return [f"restoreFrom: {problem}; or name the snapshot's ExactlyOnceSnapshot"] if problem else []


def name_errors(metadata: Any, *, snapshot: bool = False) -> list[str]:
    """The rules of the CRDs (and the API server) on metadata.name and metadata.namespace of a stream, or of
    a snapshot."""
    if not isinstance(metadata, dict):
        return ["metadata: required, with at least metadata.name"]
    errors = []
    name, namespace = metadata.get("name"), metadata.get("namespace")
    if not isinstance(name, str) or not name:
        errors.append("metadata.name: required")
    elif snapshot:
        if len(name) > MAX_SNAPSHOT_NAME or not re.match(DNS_SUBDOMAIN, name):
            errors.append(f"metadata.name: {name!r} must be a DNS-1123 subdomain name of at most "
                          f"{MAX_SNAPSHOT_NAME} characters (it is a label value of the snapshot's Pods)")
    elif len(name) > MAX_STREAM_NAME or not re.match(DNS_1035_LABEL, name):
        errors.append(f"metadata.name: {name!r} must be a DNS-1035 label (lowercase letters, digits and '-', "
                      f"starting with a letter) of at most {MAX_STREAM_NAME} characters: the driver's Service "
                      "is named <name>-driver")
    if namespace is not None and (not isinstance(namespace, str) or len(namespace) > 63
                                  or not re.match(DNS_LABEL, namespace)):
        errors.append(f"metadata.namespace: {namespace!r} is not a namespace name (a DNS-1123 label of at most "
                      "63 characters)")
    return errors
