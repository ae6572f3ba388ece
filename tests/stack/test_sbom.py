"""The image's SBOM (stack/eos_stack/sbom.py, what `make release` writes into dist/): Syft's CycloneDX and SPDX
JSON of the image the tests use, with the three ecosystems it holds at the versions it holds them: Debian's
packages (tini, procps), Python's (PySpark, confluent-kafka, the project's own) and the jars' Maven coordinates
(the Kafka connector's kafka-clients, PySpark's spark-core); and nothing of what docker/prune.py removed (Hive's
jars), so it describes this image, not PySpark's wheel. `make soak`: Syft's first build takes minutes."""
from __future__ import annotations

import json

import pytest

from eos_stack import sbom
from eos_stack.common import Stack
from eos_stack.image_common import image_under_test

pytestmark = [pytest.mark.soak, pytest.mark.timeout(1800)]


def test_the_sbom_lists_debian_python_and_java_parts_of_the_image(tmp_path):
    cdx, spdx = sbom.make(Stack(), image_under_test(), tmp_path)
    components = json.loads(cdx.read_text())["components"]
    by_type: dict[str, dict[str, str]] = {}
    for c in components:
        purl = c.get("purl", "")
        kind = purl.split(":", 1)[1].split("/", 1)[0] if purl.startswith("pkg:") else "other"
        by_type.setdefault(kind, {})[c["name"]] = c.get("version", "")
    assert {"tini", "procps"} <= set(by_type.get("deb", {})), sorted(by_type.get("deb", {}))[:40]
    python = by_type.get("pypi", {})
    assert python.get("pyspark") == "4.2.0" and "confluent-kafka" in python, sorted(python)
    assert "spark-eos-operator" in python, sorted(python)
    jars = by_type.get("maven", {})
    assert jars.get("kafka-clients") == "3.9.2", {k: v for k, v in jars.items() if "kafka" in k}
    assert any(name.startswith("spark-core") for name in jars), sorted(jars)[:40]
    assert not [name for name in jars if name.startswith("hive-")], "pruned Hive jars are in the SBOM"
    doc = json.loads(spdx.read_text())
    assert doc["spdxVersion"].startswith("SPDX-"), doc.get("spdxVersion")
    spdx_names = {p["name"] for p in doc["packages"]}
    assert {"tini", "pyspark", "kafka-clients"} <= spdx_names, sorted(spdx_names)[:40]
