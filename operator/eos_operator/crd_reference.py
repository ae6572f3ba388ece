"""The field reference of both CRDs (``docs/reference.md``), generated from the CRDs, which are generated from
the pydantic models (``eos_operator.crd``): one table per resource part (spec, status), a row per field with
its type, default, limits and description.

``python -m eos_operator.crd_reference`` rewrites the file; ``--check`` exits 1 when it is out of date
(tests/operator/test_crd_reference.py fails then too).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Iterator

from .crd import CRD_DIR, build_crd, build_snapshot_crd

REFERENCE = CRD_DIR.parent / "docs" / "reference.md"
LIMITS = (("minimum", "≥ {}"), ("maximum", "≤ {}"), ("minLength", "length ≥ {}"), ("maxLength", "length ≤ {}"),
          ("minItems", "≥ {} items"), ("maxItems", "≤ {} items"), ("pattern", "pattern `{}`"))


def _type(node: dict[str, Any]) -> str:
    if "enum" in node:
        return " \\| ".join(f"`{v}`" for v in node["enum"])
    kind = node.get("type") or ("int or string" if node.get("x-kubernetes-int-or-string") else "object")
    if kind == "array":
        return f"list of {_type(node.get('items') or {})}"
    if kind == "object" and "additionalProperties" in node and "properties" not in node:
        return "map"
    return kind


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def fields(node: dict[str, Any], prefix: str) -> Iterator[tuple[str, dict[str, Any], bool]]:
    """(path, schema, required) of every field under ``node``, depth first in the models' order."""
    required = set(node.get("required") or [])
    for name, child in (node.get("properties") or {}).items():
        path = f"{prefix}.{name}"
        yield path, child, name in required
        inner = child.get("items") if child.get("type") == "array" else child
        if inner and inner.get("properties"):
            yield from fields(inner, path + ("[]" if child.get("type") == "array" else ""))


def table(schema: dict[str, Any], prefix: str) -> list[str]:
    rows = ["| field | type | default | description |", "| --- | --- | --- | --- |"]
    for path, node, required in fields(schema, prefix):
        limits = [fmt.format(node[k]) for k, fmt in LIMITS if k in node]
        default = f"`{json.dumps(node['default'])}`" if "default" in node else ("required" if required else "")
        desc = node.get("description", "") + (f" ({', '.join(limits)})" if limits else "")
        desc = _cell(desc)
        rows.append(f"| `{path}` | {_type(node)} | {default} | {desc} |")
    return rows


def render() -> str:
    out = ["# Field reference", "",
           "Every field of the `ExactlyOnceStream` and `ExactlyOnceSnapshot` resources "
           "(`streaming.eos.dev`), generated from the pydantic models shared by the operator and the job "
           "runtime (`python -m eos_operator.crd_reference`; a unit test fails when this file drifts). "
           "Rules across fields (CEL) are in the CRDs under `crds/`; the user guide (`docs/user-guide.md`) "
           "explains the concepts.", ""]
    for crd in (build_crd(), build_snapshot_crd()):
        version = crd["spec"]["versions"][0]
        kind = crd["spec"]["names"]["kind"]
        props = version["schema"]["openAPIV3Schema"]["properties"]
        out += [f"## {kind} (`{crd['spec']['group']}/{version['name']}`)", ""]
        older = [v["name"] for v in crd["spec"]["versions"][1:] if v.get("deprecated")]
        if older:
            out += [f"Also served, with the same fields, deprecated: {', '.join(f'`{v}`' for v in older)} "
                    "([API versions](api-policy.md)).", ""]
        for part in ("spec", "status"):
            if part in props:
                out += [f"### {part}", ""] + table(props[part], part) + [""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eos_operator.crd_reference",
                                 description="Generate docs/reference.md from the CRDs.")
    ap.add_argument("--check", action="store_true", help="exit 1 if the committed file differs")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        if not REFERENCE.exists() or REFERENCE.read_text() != text:
            print(f"{REFERENCE} is out of date; run `python -m eos_operator.crd_reference`", file=sys.stderr)
            return 1
        return 0
    REFERENCE.parent.mkdir(parents=True, exist_ok=True)
    REFERENCE.write_text(text)
    print(f"wrote {REFERENCE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
