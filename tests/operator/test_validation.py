"""The invalid corpus: every resource in tests/operator/invalid is rejected with a message naming the field.

Files annotated ``test.eos.dev/rejected-by: schema`` must fail the generated CRD
schema (checked here offline; tests/e2e/test_operator_e2e.py checks the real API
server); ``cel`` ones pass the structural schema here and fail a CEL rule of the CRD,
which only the real API server evaluates (``test_the_api_server_decides_as_annotated``
below, on the stack's API server, and the e2e test); ``operator`` ones pass both
and must fail the operator's validation (pydantic plus ``semantic_errors``), which
puts the message in the Ready condition and an InvalidSpec event. Every file fails the
operator's validation too, so a CRD installed without its rules still rejects it.
"""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import yaml

from eos_job.spec import ExactlyOnceStreamSpec
from eos_operator.crd import build_crd
from eos_operator.validation import InvalidSpec, allow_ambient_s3_credentials, validate_spec

from .fakes import base_spec
from .schema_check import validate

KEYS = {"accessKeyId": {"name": "keys", "key": "id"}, "secretAccessKey": {"name": "keys", "key": "secret"}}
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
    result = validate_spec(doc["spec"], doc["metadata"].get("namespace", "default"), doc["metadata"]["name"])
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
    doc = {"apiVersion": "streaming.eos.dev/v1beta1", "kind": "ExactlyOnceStream",
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


# ------------------------------------------------------------ the live API server
# The offline check above cannot evaluate CEL: here the real API server of the stack decides every file of the
# corpus, on a copy of the generated CRDs under a group of their own (nothing else on the shared server sees
# them), by server-side dry run (nothing is stored).
@pytest.fixture(scope="module")
def scratch_api(stack_env):
    from eos_stack.cluster import Kubectl

    from eos_operator.crd import build_snapshot_crd

    kubectl = Kubectl(stack_env)
    group = f"v{uuid.uuid4().hex[:8]}.validation.eos.dev"
    crds = [build_crd(), build_snapshot_crd()]
    for crd in crds:
        crd["spec"]["group"] = group
        crd["metadata"]["name"] = f"{crd['spec']['names']['plural']}.{group}"
    try:
        for crd in crds:
            kubectl.run("apply", "-f", "-", stdin=yaml.safe_dump(crd))
        for crd in crds:
            kubectl.run("wait", "--for=condition=Established", f"crd/{crd['metadata']['name']}", "--timeout=60s")
        yield lambda doc: kubectl.run("apply", "--dry-run=server", "-n", "default", "-f", "-", check=False,
                                      stdin=yaml.safe_dump({**doc, "apiVersion": f"{group}/v1beta1"}))
    finally:
        for crd in crds:
            kubectl.run("delete", "crd", crd["metadata"]["name"], "--ignore-not-found", "--wait=false", check=False)


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_the_api_server_decides_as_annotated(scratch_api, path):
    doc, field, by = load(path)
    result = scratch_api(doc)
    if by in ("schema", "cel"):
        assert result.returncode != 0, f"the API server accepted {path.name}"
        assert field in result.stderr, f"{path.name}: {result.stderr}"
    else:
        assert result.returncode == 0, f"{path.name} should pass the API server: {result.stderr}"


def stream_doc(name: str = "ok", **spec: object) -> dict:
    return {"kind": "ExactlyOnceStream", "metadata": {"name": name}, "spec": {**base_spec(), **spec}}


def test_the_api_server_accepts_what_the_rules_allow(scratch_api):
    ok = [stream_doc(),
          stream_doc(restoreFrom="colors-p1"),
          stream_doc(restoreFrom="/tmp/eos-test/snapshots/colors-p1"),
          stream_doc(restoreFrom="file:///tmp/eos-test/snapshots/colors-p1"),
          stream_doc(checkpoint={"store": "s3", "path": "/streams/ok", "s3": {"bucket": "checkpoints", **KEYS}},
                     restoreFrom="s3a://checkpoints/other-stream/snapshots/x"),
          stream_doc(checkpoint={"store": "s3", "path": "/streams/ok", "s3": {"bucket": "checkpoints",
                                                                                 "credentials": "ambient"}}),
          stream_doc(checkpoint={"store": "s3", "path": "/streams/ok", "s3": {"bucket": "checkpoints",
                                                                                 "credentials": "secret", **KEYS}}),
          # another cluster: the same topic names are other topics
          stream_doc(sink={"bootstrapServers": "sink-0.kafka:9093", "topic": "in", "deadLetterTopic": "dlq"}),
          stream_doc(sink={"bootstrapServers": "localhost:9092", "topic": "out", "deadLetterTopic": "dlq",
                           "ledgerTopic": "ledger"}),
          stream_doc(job={"module": "m", "image": "registry.example.com:5000/team/job:1.2@sha256:" + "a" * 64,
                          "serviceAccountName": "spark-driver", "sparkConf": {"spark.sql.ansi.enabled": "true"}},
                     source={"bootstrapServers": "[::1]:9092,kafka-0.kafka.svc:9092", "topics": ["in", ".x", "..y"],
                             "options": {"kafka.fetch.max.bytes": "1048576"}}),
          stream_doc("n" * 56, sink={"bootstrapServers": "localhost:9092", "topic": "t" * 179}),   # 179 + 56 = 235
          # the Spark UI Service with the UI on; off (false, null) without it
          stream_doc(job={"module": "m", "metrics": {"enabled": True, "uiService": True}}),
          stream_doc(job={"module": "m", "metrics": {"uiService": False}}),
          stream_doc(job={"module": "m", "metrics": {"enabled": False, "uiService": None}})]
    allow_ambient_s3_credentials(True)   # the ambient stream above: on an operator that allows it
    try:
        for doc in ok:
            result = scratch_api(doc)
            assert result.returncode == 0, (doc["metadata"]["name"], doc["spec"], result.stderr)
            assert validate_spec(doc["spec"], "d", doc["metadata"]["name"]).__class__ is ExactlyOnceStreamSpec
    finally:
        allow_ambient_s3_credentials(False)


@pytest.mark.parametrize("name", ["1-colors", "colors.v2", "Colors"])
def test_the_api_server_refuses_a_stream_name_its_service_cannot_have(scratch_api, name):
    result = scratch_api(stream_doc(name))
    assert result.returncode != 0 and "metadata.name must be a DNS-1035 label" in result.stderr, result.stderr


@pytest.mark.parametrize("path,accepted", [
    ("/tmp/eos-test/snapshots/s1", True), ("s3a://checkpoints/streams/s1", True), ("file:///ckpt/s1", True),
    ("snapshots/s1", False), ("/tmp/eos-test/../other/s1", False), ("/tmp/eos-test/./s1", False),
    ("s3a://checkpoints/../x", False), ("/tmp//s1", False)])
def test_the_api_server_checks_a_snapshot_path(scratch_api, path, accepted):
    doc = {"kind": "ExactlyOnceSnapshot", "metadata": {"name": "s1"}, "spec": {"stream": "colors", "path": path}}
    result = scratch_api(doc)
    assert (result.returncode == 0) == accepted, result.stderr
    if not accepted:
        assert "spec.path" in result.stderr
