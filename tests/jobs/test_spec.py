"""The shared resource models: defaults, field-named errors, semantic checks, run config loading."""
import subprocess
import sys

import pytest
from pydantic import ValidationError

from eos_job.spec import ExactlyOnceStreamSpec, load_run_config, semantic_errors


def spec(**over):
    base = {"job": {"module": "examples.colors.job"},
            "source": {"bootstrapServers": "k:9092", "topics": ["in"]},
            "sink": {"bootstrapServers": "k:9092", "topic": "out"},
            "checkpoint": {"store": "local", "path": "/tmp/c"}}
    for path, value in over.items():
        node = base
        *parents, leaf = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return base


def test_defaults():
    s = ExactlyOnceStreamSpec.model_validate(spec())
    assert s.job.parallelism == 2 and s.upgrade_mode == "snapshot"
    assert s.restart_strategy.type == "exponential-delay"
    assert s.restart_strategy.exponential_delay is not None
    assert s.wire()["triggerIntervalMs"] == 1000


@pytest.mark.parametrize("path,value,field", [
    ("job.paralelism", 3, "job.paralelism"),
    ("job.parallelism", 0, "job.parallelism"),
    ("job.module", "not a module", "job.module"),
    ("sink.topic", "bad topic!", "sink.topic"),
    ("source.topics", [], "source.topics"),
    ("triggerIntervalMs", 10, "triggerIntervalMs"),
    ("sink.transactionTimeoutMs", 10, "sink.transactionTimeoutMs"),
    ("upgradeMode", "yolo", "upgradeMode"),
    ("restartStrategy", {"type": "fixed-delay", "failureRate": {}}, "restartStrategy.failureRate"),
])
def test_invalid_fields_are_named(path, value, field):
    with pytest.raises(ValidationError) as ei:
        ExactlyOnceStreamSpec.model_validate(spec(**{path: value}))
    text = str(ei.value)
    assert field.split(".")[-1] in text


def test_semantic_errors_name_field_and_fix():
    s = ExactlyOnceStreamSpec.model_validate(spec(**{"sink.topic": "in"}))
    errs = semantic_errors(s)
    assert any(e.startswith("sink.topic:") and "Choose another" in e for e in errs)
    s = ExactlyOnceStreamSpec.model_validate(spec(**{"checkpoint.store": "pvc"}))
    assert any(e.startswith("checkpoint.claimName") for e in semantic_errors(s))
    s = ExactlyOnceStreamSpec.model_validate(spec(**{"sink.producerConfig": {"sasl.password": "x",
                                                                              "transactional.id": "y"}}))
    errs = semantic_errors(s)
    assert any("sink.producerConfig.sasl.password" in e for e in errs)
    assert any("sink.producerConfig.transactional.id" in e for e in errs)


def test_manifest_loads_as_run_config_with_stable_uid():
    doc = {"kind": "ExactlyOnceStream", "metadata": {"name": "s", "namespace": "n"}, "spec": spec()}
    a, b = load_run_config(doc), load_run_config(doc)
    assert a.stream.uid == b.stream.uid and a.checkpoint_dir == "/tmp/c/live"
    assert a.ledger_topic() == "out.eos-ledger.n.s"
    assert a.stream.transactional_prefix.startswith("eos-n-s-")


def test_operator_folder_does_not_shadow_the_stdlib():
    from pathlib import Path
    repo = Path(__file__).resolve().parents[2]
    assert not (repo / "operator" / "__init__.py").exists()
    out = subprocess.run([sys.executable, "-c", "import operator, pydantic; print(operator.__file__)"],
                         cwd=repo, capture_output=True, text=True, check=True).stdout
    assert "/operator/" not in out.replace("operator.py", "")


@pytest.mark.parametrize("field,key,named", [
    ("source.options", "kafka.isolation.level", None),
    ("source.options", "failOnDataLoss", None),
    ("source.options", "subscribe", "source.topics"),
    ("source.options", "subscribePattern", "source.topics"),
    ("source.options", "startingOffsets", "source.startingOffsets"),
    ("job.sparkConf", "spark.sql.adaptive.enabled", None),
    ("job.sparkConf", "spark.sql.shuffle.partitions", "job.parallelism"),
])
def test_settings_the_protocol_relies_on_are_reserved(field, key, named):
    s = ExactlyOnceStreamSpec.model_validate(spec(**{field: {key: "x", "kafka.fetch.max.bytes": "1"} if
                                                     field == "source.options" else {key: "x", "spark.ui.enabled": "false"}}))
    errs = semantic_errors(s)
    assert len(errs) == 1, errs            # the other key is the user's to set
    assert errs[0].startswith(f"{field}.{key}:") and "remove it" in errs[0]
    if named:
        assert named in errs[0]


def test_a_batch_is_bounded_by_default_and_output_hash_ignores_how_it_runs():
    s = ExactlyOnceStreamSpec.model_validate(spec())
    assert s.source.max_offsets_per_trigger == 100_000
    same = ExactlyOnceStreamSpec.model_validate(spec(**{"restartNonce": 3, "job.driver": {"cpu": "2"},
                                                        "source.maxOffsetsPerTrigger": 10}))
    assert same.output_hash() == s.output_hash() and same.spec_hash() != s.spec_hash()
    for path, value in (("job.args", {"drop": "red"}), ("job.parallelism", 3), ("sink.topic", "other"),
                        ("job.module", "examples.colors.ids")):
        assert ExactlyOnceStreamSpec.model_validate(spec(**{path: value})).output_hash() != s.output_hash(), path


def test_slots_from_source_partitions_is_in_the_output_hash_and_refuses_splitting_options():
    s = ExactlyOnceStreamSpec.model_validate(spec())
    assert s.job.slots_from == "key"
    assert "slotsFrom" not in str(s.output_hash())
    by_source = ExactlyOnceStreamSpec.model_validate(spec(**{"job.slotsFrom": "sourcePartitions"}))
    assert by_source.output_hash() != s.output_hash()
    # A stream that never set it keeps the output hash it had before the field existed.
    assert ExactlyOnceStreamSpec.model_validate(spec(**{"job.slotsFrom": "key"})).output_hash() == s.output_hash()
    split = ExactlyOnceStreamSpec.model_validate(spec(**{"job.slotsFrom": "sourcePartitions",
                                                         "source.options": {"minPartitions": "8"}}))
    assert any(e.startswith("source.options.minPartitions:") and "job.slotsFrom key" in e
               for e in semantic_errors(split))
    keyed = ExactlyOnceStreamSpec.model_validate(spec(**{"source.options": {"minPartitions": "8"}}))
    assert not any("minPartitions" in e for e in semantic_errors(keyed))
    with pytest.raises(ValidationError, match="slotsFrom"):
        ExactlyOnceStreamSpec.model_validate(spec(**{"job.slotsFrom": "shuffle"}))
