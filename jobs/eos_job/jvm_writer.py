"""``sink.writer: jvm`` (experimental, issue 29 part 2): the batch's slot tasks run the JVM slot writer
(``jvm/slot-writer``, Kafka's Java producer in the executor JVMs) instead of ``sink.slot_task`` in Python
workers. The driver's protocol stays here: ``writer.BatchWriter`` checks and records the batch as ever, and
hands the JVM the same ``sink.SlotWriterConfig`` (as JSON) that the Python slot tasks get; the JVM returns the
same commit rows (``sink.COMMIT_SCHEMA``). Both writers cut a batch into the same slots (``repartition(slots,
key)``) and keep the same ledger, so either one finishes a batch the other began (tests/stack/test_jvm_writer.py).
The protocol pieces both implement are pinned by tests/conformance/vectors.json.
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict

from .session import writer_jars
from .sink import SlotWriterConfig
from .writer_rules import JVM_PRODUCER_SETTINGS

log = logging.getLogger("eos_job")

ENTRY = "eos.slotwriter.SparkEntry"
# Producer settings the JVM writer takes from the Python writer's: those with the same name and meaning in
# Kafka's Java producer (request_limits' batch.size). sink.producerConfig goes through java_producer_settings.
SHARED_PRODUCER_SETTINGS = ("batch.size",)


def java_producer_settings(producer_config: dict[str, str]) -> dict[str, str]:
    """``sink.producerConfig`` (librdkafka names) as the Java producer's settings (writer_rules.JVM_PRODUCER_SETTINGS;
    a key without an equivalent is refused by the spec's checks before this runs)."""
    unknown = sorted(k for k in producer_config if k not in JVM_PRODUCER_SETTINGS)
    if unknown:
        raise ValueError(f"sink.producerConfig.{unknown[0]}: no equivalent in Kafka's Java producer (sink.writer jvm)")
    return {JVM_PRODUCER_SETTINGS[k]: str(v) for k, v in producer_config.items()}


def config_json(cfg: SlotWriterConfig, faults: dict[str, int] | None = None,
                security: dict[str, str] | None = None) -> str:
    """What the JVM slot tasks read (eos.slotwriter.Config): the config's fields by name; the producer settings
    only as far as the Java producer shares them; ``security``: the Java clients' own settings, over those:
    SASL and TLS (``ledger.sink_java_security``) and ``sink.producerConfig`` mapped (``java_producer_settings``),
    never the librdkafka ones of ``cfg.producer_config``. The JSON
    travels inside the slot tasks' closure, not in Spark's settings: it may carry credentials. ``faults``:
    test-only fault points: ``commit_returned_slot`` (the slot's commit lands, its answer is lost), ``fail_slot``
    (the slot's task fails on every attempt before it writes)."""
    doc = asdict(cfg)
    doc["producer_config"] = {**{k: v for k, v in cfg.producer_config.items() if k in SHARED_PRODUCER_SETTINGS},
                              **(security or {})}
    doc["unsafe"] = sorted(cfg.unsafe)
    doc["slot_map"] = list(cfg.slot_map)
    for point in ("commit_returned_slot", "fail_slot"):
        if faults and point in faults:
            doc[f"fault_{point}"] = int(faults[point])
    return json.dumps(doc)


_announced = False


def run_slots(df, cfg: SlotWriterConfig, faults: dict[str, int] | None = None,
              security: dict[str, str] | None = None) -> list[dict]:
    """Run the batch's slot tasks on the JVM writer; their commit rows, as dicts. ``security``: see
    ``config_json``."""
    global _announced
    jvm = df.sparkSession._jvm
    try:
        entry = getattr(jvm, ENTRY)
        rows = entry.run(df._jdf, config_json(cfg, faults, security), cfg.slots)
    except TypeError as exc:   # py4j: the class is not on the class path (a JavaPackage, not a JavaClass)
        raise RuntimeError("sink.writer jvm: the JVM slot writer's jar is not on spark.jars (EOS_SLOT_WRITER_JAR, "
                           "which the image sets and `eos_stack up spark` builds): use sink.writer python, or provide "
                           "the jar") from exc
    if not _announced:
        _announced = True
        log.info("sink.writer jvm: the slot tasks run %s of %s", ENTRY, ", ".join(writer_jars()) or "spark.jars")
    return [json.loads(r) for r in rows]
