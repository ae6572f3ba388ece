"""The CRD is generated from the models, committed, structural, and does not drift."""
from __future__ import annotations

import subprocess
import sys

import yaml

import pytest

from eos_job.spec import ExactlyOnceStreamSpec
from eos_job.status import ExactlyOnceStreamStatus
from eos_job.snapshot_resource import ExactlyOnceSnapshotStatus, SnapshotSpec
from eos_operator import crd

ALLOWED_KEYS = {"type", "description", "enum", "default", "pattern", "minLength", "maxLength", "minimum", "maximum",
                "exclusiveMinimum", "exclusiveMaximum", "minItems", "maxItems", "minProperties", "maxProperties",
                "format", "nullable", "properties",
                "required", "items", "additionalProperties", "x-kubernetes-preserve-unknown-fields",
                "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-validations"}


def walk(node, path="openAPIV3Schema"):
    yield path, node
    for name, sub in (node.get("properties") or {}).items():
        yield from walk(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}.*")


def schema(build=crd.build_crd):
    return build()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


BOTH = pytest.mark.parametrize("path,render", [(crd.CRD_PATH, crd.render), (crd.SNAPSHOT_CRD_PATH, crd.render_snapshot)],
                               ids=["stream", "snapshot"])


@BOTH
def test_committed_crd_matches_the_models(path, render):
    assert path.exists(), "run `python -m eos_operator.crd`"
    assert path.read_text() == render(), (
        f"{path} drifted from jobs/eos_job/spec.py: run `python -m eos_operator.crd` and commit it")


def test_check_mode_reports_drift_in_either_file(tmp_path):
    assert crd.main(["--check", "--dir", str(tmp_path)]) == 1              # both missing
    assert crd.main(["--dir", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([crd.CRD_PATH.name, crd.SNAPSHOT_CRD_PATH.name])
    assert crd.main(["--check", "--dir", str(tmp_path)]) == 0
    for name in (crd.CRD_PATH.name, crd.SNAPSHOT_CRD_PATH.name):
        good = (tmp_path / name).read_text()
        (tmp_path / name).write_text(good + "# stale\n")
        assert crd.main(["--check", "--dir", str(tmp_path)]) == 1, name
        (tmp_path / name).write_text(good)
    assert crd.main(["--check", "--dir", str(tmp_path)]) == 0


@pytest.mark.parametrize("build,render", [(crd.build_crd, crd.render), (crd.build_snapshot_crd, crd.render_snapshot)],
                         ids=["stream", "snapshot"])
def test_schema_is_structural(build, render):
    text = render()
    assert "$ref" not in text and "anyOf" not in text and "allOf" not in text and "oneOf" not in text
    for path, node in walk(schema(build)):
        assert "type" in node, f"{path} has no type"
        assert set(node) <= ALLOWED_KEYS, f"{path} has {set(node) - ALLOWED_KEYS}"
        assert not ("properties" in node and "additionalProperties" in node), path
        if node["type"] == "object" and path != "openAPIV3Schema.metadata":
            assert ("properties" in node or "additionalProperties" in node
                    or node.get("x-kubernetes-preserve-unknown-fields")), f"{path}: an untyped object"
    preserved = [p for p, n in walk(schema(build)) if n.get("x-kubernetes-preserve-unknown-fields")]
    # Only kopf's bookkeeping and the Pod template's pass-through Kubernetes types (affinity, volumes: the
    # API server checks them as part of the Pod; a bad one is a Refused launch naming the field).
    passthrough = {f"openAPIV3Schema.spec.job.{where}podTemplate.{field}"
                   for where in ("", "executor.") for field in ("affinity", "volumes[]")}
    passthrough.add("openAPIV3Schema.status.access.placement.affinity")   # a snapshot's copy of the stream's
    assert set(preserved) - passthrough == {"openAPIV3Schema.status.kopf"}, preserved


def test_every_spec_property_is_described():
    for path, node in walk(schema()["properties"]["spec"], "spec"):
        if not path.endswith((".*", "[]")):  # map values and list items are described by their parent
            assert node.get("description"), f"{path} has no description"


def test_schema_carries_enums_defaults_and_bounds():
    spec = schema()["properties"]["spec"]["properties"]
    job = spec["job"]["properties"]
    assert job["state"]["enum"] == ["running", "suspended"] and job["state"]["default"] == "running"
    assert job["parallelism"]["minimum"] == 1 and job["parallelism"]["maximum"] == 1024
    assert job["args"] == {"type": "object", "description": job["args"]["description"], "maxProperties": 256,
                           "additionalProperties": {"type": "string", "maxLength": 4096}}
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
    assert version["name"] == "v1beta1" and version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns == {"State": ".status.lifecycleState",
                       "Ready": '.status.conditions[?(@.type=="Ready")].reason',
                       "Batch": ".status.lastCommittedBatch", "Restarts": ".status.restartCount",
                       "Age": ".metadata.creationTimestamp"}


def test_snapshot_resource_names_schema_and_printer_columns():
    doc = yaml.safe_load(crd.SNAPSHOT_CRD_PATH.read_text())
    assert doc["metadata"]["name"] == "exactlyoncesnapshots.streaming.eos.dev"
    assert doc["spec"]["scope"] == "Namespaced" and doc["spec"]["group"] == "streaming.eos.dev"
    names = doc["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == ("ExactlyOnceSnapshot", "exactlyoncesnapshots",
                                                                     ["eoss"])
    version = doc["spec"]["versions"][0]
    assert version["name"] == "v1beta1" and version["subresources"] == {"status": {}}
    columns = [(c["name"], c["jsonPath"]) for c in version["additionalPrinterColumns"]]
    assert columns == [("Stream", ".spec.stream"), ("Batch", ".status.batch"), ("Path", ".status.path"),
                       ("State", ".status.state"), ("Age", ".metadata.creationTimestamp")]
    root = schema(crd.build_snapshot_crd)
    spec, status = root["properties"]["spec"], root["properties"]["status"]["properties"]
    assert set(spec["properties"]) == {f.alias for f in SnapshotSpec.model_fields.values()}
    assert spec["required"] == ["stream"]
    assert spec["properties"]["trigger"]["enum"] == ["manual", "periodic", "nonce", "upgrade"]
    assert spec["properties"]["maxRetries"]["default"] == 3 and spec["properties"]["disposeOnDelete"]["default"] is True
    assert set(status) - {"kopf"} == {f.alias for f in ExactlyOnceSnapshotStatus.model_fields.values()}
    for path, node in walk(spec, "spec"):
        assert node.get("description"), f"{path} has no description"


def test_module_entry_point_checks(tmp_path):
    out = subprocess.run([sys.executable, "-m", "eos_operator.crd", "--check"], capture_output=True, text=True,
                         env=_env())
    assert out.returncode == 0, out.stderr


def _env():
    import os
    root = crd.REPO
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root / "operator"), str(root / "jobs"), str(root), os.environ.get("PYTHONPATH", "")])}


@BOTH
def test_v1beta1_is_stored_and_v1alpha1_served_deprecated_with_the_same_schema(path, render):
    """The policy (docs/api-policy.md): one storage version, older ones still served, deprecated with a warning
    naming the new one, and no field differing, which is what makes conversion strategy None correct."""
    doc = yaml.safe_load(render())
    versions = {v["name"]: v for v in doc["spec"]["versions"]}
    assert list(versions) == ["v1beta1", "v1alpha1"]
    assert [v["name"] for v in doc["spec"]["versions"] if v["storage"]] == ["v1beta1"]
    assert all(v["served"] for v in versions.values())
    assert "deprecated" not in versions["v1beta1"] and "deprecationWarning" not in versions["v1beta1"]
    assert versions["v1alpha1"]["deprecated"] is True
    assert "streaming.eos.dev/v1beta1" in versions["v1alpha1"]["deprecationWarning"]
    for key in ("schema", "subresources", "additionalPrinterColumns"):
        assert versions["v1alpha1"][key] == versions["v1beta1"][key], key
    assert doc["spec"]["conversion"] == {"strategy": "None"}


def test_the_operator_speaks_the_storage_version():
    from eos_job.spec import API_VERSION

    assert API_VERSION == "v1beta1" and API_VERSION not in crd.OLDER_VERSIONS
