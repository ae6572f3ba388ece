"""The invalid corpus: every resource in tests/operator/invalid is rejected with a message naming the field.

Files annotated ``test.eos.dev/rejected-by: schema`` must fail the generated CRD
schema (checked here offline; tests/e2e/test_operator_e2e.py checks the real API
server); ``cel`` ones pass the structural schema here and fail a CEL rule of the CRD,
which only the real API server evaluates (the e2e test); ``operator`` ones pass both
and must fail the operator's validation (pydantic plus ``semantic_errors``), which
puts the message in the Ready condition and an InvalidSpec event. Every file fails the
operator's validation too, so a CRD installed without its rules still rejects it.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from eos_job.spec import ExactlyOnceStreamSpec
from eos_operator.crd import build_crd
from eos_operator.validation import InvalidSpec, validate_spec

from .fakes import base_spec
from .schema_check import validate

CORPUS = sorted((Path(__file__).parent / "invalid").glob("*.yaml"))
SCHEMA = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def load(path: Path) -> tuple[dict, str, str]:
    doc = yaml.safe_load(path.read_text())
    ann = doc["metadata"]["annotations"]
    return doc, ann["test.eos.dev/expect-field"], ann["test.eos.dev/rejected-by"]


def test_corpus_is_large_enough():
    assert len(CORPUS) >= 15
    by = [load(p)[2] for p in CORPUS]
    assert by.count("schema") >= 10 and by.count("operator") >= 5


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_operator_validation_rejects_naming_the_field(path):
    doc, field, _ = load(path)
    result = validate_spec(doc["spec"])
    assert isinstance(result, InvalidSpec), f"{path.name} was accepted"
    assert any(field in e for e in result.errors), result.errors
    assert all(e.startswith("spec") for e in result.errors)
    assert "hunter2" not in result.message       # a rejected secret value is never echoed


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_crd_schema_decides_as_annotated(path):
    doc, field, by = load(path)
    errors = validate(doc, SCHEMA)
    if by == "schema":
        assert errors, f"{path.name} passes the CRD schema but is annotated rejected-by: schema"
        assert any(field in e for e in errors), errors
    else:
        assert errors == [], f"{path.name} is rejected by the schema: {errors}"


def test_the_base_of_the_corpus_is_valid():
    doc = {"apiVersion": "streaming.eos.dev/v1alpha1", "kind": "ExactlyOnceStream",
           "metadata": {"name": "ok"}, "spec": base_spec()}
    assert validate(doc, SCHEMA) == []
    assert isinstance(validate_spec(doc["spec"]), ExactlyOnceStreamSpec)


def test_example_manifest_is_valid():
    path = Path(__file__).resolve().parents[2] / "examples" / "colors.yaml"
    doc = yaml.safe_load(path.read_text())
    assert doc["kind"] == "ExactlyOnceStream" and doc["metadata"]["name"] == "colors"
    assert validate(doc, SCHEMA) == []
    spec = validate_spec(doc["spec"])
    assert isinstance(spec, ExactlyOnceStreamSpec), spec
    assert spec.job.module == "examples.colors.job" and spec.job.parallelism == 2
    assert spec.source.topics == ["colors-events"] and spec.sink.topic == "colors-counts"
    assert spec.sink.dead_letter_topic == "colors-dlq"
    assert spec.restart_strategy.type == "fixed-delay"
    assert spec.checkpoint.store == "s3" and spec.checkpoint.s3.bucket == "checkpoints"   # a store every node reaches


def test_missing_spec():
    assert isinstance(validate_spec(None), InvalidSpec)


def test_local_store_is_refused_unless_the_operator_allows_it():
    from eos_operator.validation import allow_local_store
    spec = {**base_spec(), "checkpoint": {"store": "local", "path": "/tmp/ckpt"}}
    allow_local_store(False)
    result = validate_spec(spec)
    assert isinstance(result, InvalidSpec) and result.errors[0].startswith("spec.checkpoint.store: local")
    assert "--allow-local-store" in result.message and "s3" in result.message
    allow_local_store(True)
    assert isinstance(validate_spec(spec), ExactlyOnceStreamSpec)
