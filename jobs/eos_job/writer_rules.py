"""What ``sink.writer`` may be combined with: the JVM slot writer (``sink.writer: jvm``, experimental, issue 29
part 2) takes ``sink.producerConfig`` in librdkafka's names and maps each key to Kafka's Java producer; a key with
no Java equivalent is refused, named (CEL rule in the CRD, ``semantic_errors`` without Kubernetes). Pure: shared by
the operator, the CRD generator and the runtime (``jvm_writer``)."""
from __future__ import annotations

# sink.writer has no CRD default (unset is python): a default would be stored in every stream, and the previous
# release's operator, still running while the CRDs are upgraded, refuses a field it does not know.
WRITER_DOC = (
    "The slot writer: python (the reference, in the Python workers) or jvm (experimental: Kafka's Java producer in "
    "the executor JVMs, the same protocol; credentials and tls as the Java client's settings; producerConfig "
    "mapped to the Java producer's names, a key without an equivalent refused). Unset: python.")
# sink.producerConfig (librdkafka names) for the JVM slot writer: each key that has a Java producer equivalent,
# and that equivalent (jvm_writer.java_producer_settings). Any other key is refused with sink.writer jvm, named.
JVM_PRODUCER_SETTINGS = {
    "linger.ms": "linger.ms", "queue.buffering.max.ms": "linger.ms", "batch.size": "batch.size",
    "compression.codec": "compression.type", "compression.type": "compression.type",
    "request.timeout.ms": "request.timeout.ms", "message.timeout.ms": "delivery.timeout.ms",
    "delivery.timeout.ms": "delivery.timeout.ms", "retry.backoff.ms": "retry.backoff.ms",
    "retry.backoff.max.ms": "retry.backoff.max.ms", "message.max.bytes": "max.request.size",
    "max.in.flight.requests.per.connection": "max.in.flight.requests.per.connection",
    "max.in.flight": "max.in.flight.requests.per.connection", "client.id": "client.id",
    "connections.max.idle.ms": "connections.max.idle.ms", "reconnect.backoff.ms": "reconnect.backoff.ms",
    "reconnect.backoff.max.ms": "reconnect.backoff.max.ms", "metadata.max.age.ms": "metadata.max.age.ms",
    "socket.connection.setup.timeout.ms": "socket.connection.setup.timeout.ms",
    "security.protocol": "security.protocol",
    "ssl.endpoint.identification.algorithm": "ssl.endpoint.identification.algorithm",
}
_JVM_KEYS = ", ".join(sorted(JVM_PRODUCER_SETTINGS))
# What the JVM slot writer (sink.writer jvm, experimental: issue 29 part 2) does not take: (CEL condition that
# holds, field, message naming the field and the fix). semantic_errors says the same without Kubernetes, naming
# the key.
JVM_WRITER_LIMITS = [
    ("!has(self.producerConfig) || self.producerConfig.all(k, k in [%s])"
     % ", ".join(f"'{k}'" for k in sorted(JVM_PRODUCER_SETTINGS)), "producerConfig",
     "spec.sink.producerConfig has a librdkafka setting with no equivalent in Kafka's Java producer, which "
     f"sink.writer jvm uses: keep to {_JVM_KEYS}, or use sink.writer python"),
]


def jvm_writer_errors(sink) -> list[str]:
    """JVM_WRITER_LIMITS checked on the model (``semantic_errors``: a job run without Kubernetes), naming each key."""
    if sink.writer != "jvm":
        return []
    return [f"sink.producerConfig.{key}: no equivalent in Kafka's Java producer, which sink.writer jvm uses: keep "
            f"to {_JVM_KEYS}, or use sink.writer python" for key in sink.producer_config
            if key not in JVM_PRODUCER_SETTINGS]
