"""The CRD is generated from the models, committed, structural, and does not drift."""
from __future__ import annotations

import subprocess
import sys

import yaml

from eos_job.spec import ExactlyOnceStreamSpec, ExactlyOnceStreamStatus
from eos_operator import crd

ALLOWED_KEYS = {"type", "description", "enum", "default", "pattern", "minLength", "maxLength", "minimum", "maximum",
                "exclusiveMinimum", "exclusiveMaximum", "minItems", "maxItems", "format", "nullable", "properties",
                "required", "items", "additionalProperties", "x-kubernetes-preserve-unknown-fields",
                "x-kubernetes-list-type", "x-kubernetes-list-map-keys"}


def walk(node, path="openAPIV3Schema"):
    yield path, node
    for name, sub in (node.get("properties") or {}).items():
        yield from walk(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}.*")


def schema():
    return crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_committed_crd_matches_the_models():
    assert crd.CRD_PATH.exists(), "run `python -m eos_operator.crd`"
    assert crd.CRD_PATH.read_text() == crd.render(), (
        f"{crd.CRD_PATH} drifted from jobs/eos_job/spec.py: run `python -m eos_operator.crd` and commit it")


def test_check_mode_reports_drift(tmp_path):
    stale = tmp_path / "crd.yaml"
    stale.write_text("stale\n")
    assert crd.main(["--check", "--output", str(stale)]) == 1
    assert crd.main(["--output", str(stale)]) == 0
    assert crd.main(["--check", "--output", str(stale)]) == 0


def test_schema_is_structural():
    text = crd.render()
    assert "$ref" not in text and "anyOf" not in text and "allOf" not in text and "oneOf" not in text
    for path, node in walk(schema()):
        assert "type" in node, f"{path} has no type"
        assert set(node) <= ALLOWED_KEYS, f"{path} has {set(node) - ALLOWED_KEYS}"
        assert not ("properties" in node and "additionalProperties" in node), path
        if node["type"] == "object" and path != "openAPIV3Schema.metadata":
            assert ("properties" in node or "additionalProperties" in node
                    or node.get("x-kubernetes-preserve-unknown-fields")), f"{path}: an untyped object"
    preserved = [p for p, n in walk(schema()) if n.get("x-kubernetes-preserve-unknown-fields")]
    assert preserved == ["openAPIV3Schema.status.kopf"]


def test_every_spec_property_is_described():
    for path, node in walk(schema()["properties"]["spec"], "spec"):
        if not path.endswith((".*", "[]")):  # map values and list items are described by their parent
            assert node.get("description"), f"{path} has no description"


def test_schema_carries_enums_defaults_and_bounds():
    spec = schema()["properties"]["spec"]["properties"]
    job = spec["job"]["properties"]
    assert job["state"]["enum"] == ["running", "suspended"] and job["state"]["default"] == "running"
    assert job["parallelism"]["minimum"] == 1 and job["parallelism"]["maximum"] == 1024
    assert job["args"] == {"type": "object", "description": job["args"]["description"],
                           "additionalProperties": {"type": "string"}}
    assert spec["restartStrategy"]["properties"]["type"]["enum"] == ["fixed-delay", "exponential-delay",
                                                                      "failure-rate"]
    rate = spec["restartStrategy"]["properties"]["failureRate"]["properties"]["intervalSeconds"]
    assert rate["minimum"] == 0 and rate["exclusiveMinimum"] is True
    assert spec["sink"]["properties"]["deadLetterTopic"]["nullable"] is True
    assert set(schema()["properties"]["spec"]["required"]) == {"job", "source", "sink", "checkpoint"}
    # Every model field is in the schema, under its camelCase name.
    assert set(spec) == {f.alias for f in ExactlyOnceStreamSpec.model_fields.values()}
    status = schema()["properties"]["status"]["properties"]
    assert set(status) - {"kopf"} == {f.alias for f in ExactlyOnceStreamStatus.model_fields.values()}
    assert status["conditions"]["x-kubernetes-list-type"] == "map"
    assert not any("default" in n for _, n in walk(schema()["properties"]["status"]))


def test_resource_names_subresource_and_printer_columns():
    doc = yaml.safe_load(crd.CRD_PATH.read_text())
    assert doc["metadata"]["name"] == "exactlyoncestreams.streaming.eos.dev"
    names = doc["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == ("ExactlyOnceStream", "exactlyoncestreams",
                                                                     ["eos"])
    version = doc["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns == {"State": ".status.lifecycleState",
                       "Ready": '.status.conditions[?(@.type=="Ready")].reason',
                       "Batch": ".status.lastCommittedBatch", "Restarts": ".status.restartCount",
                       "Age": ".metadata.creationTimestamp"}


def test_module_entry_point_checks(tmp_path):
    out = subprocess.run([sys.executable, "-m", "eos_operator.crd", "--check"], capture_output=True, text=True,
                         env=_env())
    assert out.returncode == 0, out.stderr


def _env():
    import os
    root = crd.REPO
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root / "operator"), str(root / "jobs"), str(root), os.environ.get("PYTHONPATH", "")])}
