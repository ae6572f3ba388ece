"""The e2e tests' placement of a stream on the real nodes (tests/e2e/on_nodes.py) makes a spec the operator takes:
the test job modules mounted where the image imports them, the checkpoint in the bucket with the keys by
reference, the manifest given left as it was."""
from __future__ import annotations

import copy
import importlib.util
import re

import pytest

from eos_job.spec import ExactlyOnceStreamSpec
from eos_operator.validation import validate_spec
from examples.colors.manifest import colors_manifest
from tests.e2e import on_nodes
from tests.e2e.on_nodes import JOBS_MOUNT, NodeStreams, jobs_configmap

POD_ENV = {"POD_KAFKA_BOOTSTRAP": "10.1.2.3:9093", "POD_S3_ENDPOINT": "http://10.1.2.3:9000",
           "POD_KUBE_APISERVER": "https://kubernetes.default.svc:6443", "EOS_SERVICES_IP": "10.1.2.3"}


@pytest.fixture
def placer(monkeypatch) -> NodeStreams:
    monkeypatch.setattr(on_nodes.node_services, "pod_env", lambda st: POD_ENV)
    monkeypatch.setattr(on_nodes, "node_image", lambda: "127.0.0.1:5000/spark-eos-operator:0.1.0")
    return NodeStreams({"S3_BUCKET": "eos", "KUBECONFIG": "/unused"}, kubectl=None, namespace="eos-e2e-abc123")


def test_a_placed_stream_is_a_valid_spec_on_the_nodes(placer):
    doc = colors_manifest("colors", "127.0.0.1:9092", "ev", "out", "/tmp/x/checkpoint", dlq="dlq",
                          job={"module": "tests.e2e.jobs.ids_by_partition"})
    before = copy.deepcopy(doc)
    placed = placer.place(doc)
    assert doc == before                                    # a copy: the test's manifest is left alone
    spec = validate_spec(placed["spec"], "eos-e2e-abc123", "colors")
    assert isinstance(spec, ExactlyOnceStreamSpec), spec
    s = placed["spec"]
    assert s["source"]["bootstrapServers"] == s["sink"]["bootstrapServers"] == "10.1.2.3:9093"
    assert s["checkpoint"]["store"] == "s3" and s["checkpoint"]["path"] == "/e2e/eos-e2e-abc123/colors"
    assert s["checkpoint"]["s3"]["accessKeyId"] == {"name": "ckpt-keys", "key": "id"}
    template = s["job"]["podTemplate"]
    assert template["schedulerName"] and template["tolerations"]
    (mount,) = template["volumeMounts"]
    assert mount["mountPath"] == JOBS_MOUNT and {"name": mount["name"], "configMap": {"name": "e2e-jobs"}} in \
        template["volumes"]


def test_a_stream_already_on_s3_keeps_its_checkpoint(placer):
    doc = colors_manifest("colors", "127.0.0.1:9092", "ev", "out", "/unused")
    doc["spec"]["checkpoint"] = placer.checkpoint("colors", "-fork")
    assert placer.place(doc)["spec"]["checkpoint"]["path"] == "/e2e/eos-e2e-abc123/colors-fork"


def test_the_job_modules_configmap_holds_every_test_job_module():
    data = jobs_configmap()["data"]
    assert "__init__.py" in data and "ids_by_partition.py" in data
    for name, text in data.items():     # each is importable Python as mounted (no sub-package, no other import root)
        compile(text, name, "exec")
        # Of the repository's tests only the mounted package itself: nothing else of tests/ is in the image.
        outside = [m for m in re.findall(r"^\s*(?:from|import) (tests\S*)", text, re.M)
                   if not m.startswith("tests.e2e.jobs")]
        assert not outside, (name, outside)
    assert importlib.util.find_spec("tests.e2e.jobs.ids_by_partition") is not None
