"""docs/reference.md is the generated field reference of both CRDs, and every field is described."""
from __future__ import annotations

import pytest

from eos_operator import crd_reference
from eos_operator.crd import build_crd, build_snapshot_crd

pytestmark = pytest.mark.unit


def test_the_committed_reference_is_what_the_models_generate():
    assert crd_reference.REFERENCE.read_text() == crd_reference.render(), (
        "docs/reference.md is out of date: run `python -m eos_operator.crd_reference`")


def test_every_field_of_both_resources_spec_and_status_is_described():
    missing = []
    for crd in (build_crd(), build_snapshot_crd()):
        props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
        kind = crd["spec"]["names"]["kind"]
        for part in ("spec", "status"):
            missing += [f"{kind} {path}" for path, node, _ in crd_reference.fields(props[part], part)
                        if not (node.get("description") or "").strip()]
    assert missing == [], f"fields without a description (give them one in the pydantic model): {missing}"


def test_a_row_names_the_field_its_type_default_limits_and_description():
    text = crd_reference.render()
    row = next(line for line in text.splitlines() if line.startswith("| `spec.job.parallelism` |"))
    assert row.startswith("| `spec.job.parallelism` | integer | `2` | Output slots P") and "(≥ 1, ≤ 1024)" in row
    assert "| `status.failedDriver.pod` | string | required |" in text
    # A pipe in a pattern is escaped, so the table keeps its four columns.
    image = next(line for line in text.splitlines() if line.startswith("| `spec.job.image` |"))
    assert image.replace("\\|", "").count("|") == 5
