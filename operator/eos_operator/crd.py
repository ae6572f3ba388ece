"""The CustomResourceDefinition, generated from the pydantic models in ``eos_job.spec``.

``python -m eos_operator.crd`` rewrites ``crds/exactlyoncestreams.streaming.eos.dev.yaml``;
``python -m eos_operator.crd --check`` exits 1 when the committed file drifts
from the models (the unit tests do the same).

Kubernetes wants a *structural* OpenAPI v3 schema: every node typed, no
``$ref``, no ``anyOf`` of types, ``properties`` and ``additionalProperties``
never together. Pydantic emits JSON Schema 2020-12, so this module inlines the
``$defs``, turns ``Optional[X]`` into ``X`` with ``nullable``, ``const`` into a
one-value ``enum``, numeric ``exclusiveMinimum`` into the v3.0 boolean form,
and drops pydantic's ``additionalProperties: false`` (the API server's strict
field validation reports unknown fields instead, and the operator's pydantic
validation forbids them).
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import yaml

from eos_job.spec import (API_GROUP, API_VERSION, KIND, PLURAL, SHORT_NAMES, ExactlyOnceStreamSpec,
                          ExactlyOnceStreamStatus)

REPO = Path(__file__).resolve().parents[2]
CRD_NAME = f"{PLURAL}.{API_GROUP}"
CRD_PATH = REPO / "crds" / f"{CRD_NAME}.yaml"

# Keywords a structural schema may carry through from pydantic's output.
_KEEP = ("type", "description", "enum", "default", "pattern", "minLength", "maxLength", "minimum",
         "maximum", "minItems", "maxItems", "format", "nullable")

# Descriptions for spec fields whose pydantic Field has none (keyed by the
# camelCase path under spec). Better moved into eos_job/spec.py one day; the
# unit tests fail if a spec property ends up without a description.
EXTRA_DESCRIPTIONS: dict[str, str] = {
    "job": "The Spark job: image, the user's transformation and its resources.",
    "job.driver": "Resources of the driver Pod.",
    "job.executor": "Resources and count of the executor Pods (cluster deploy mode).",
    "source": "The Kafka source.",
    "sink": "The Kafka sink, written exactly once.",
    "sink.credentials.mechanism": "SASL mechanism.",
    "sink.credentials.securityProtocol": "Kafka security.protocol.",
    "sink.credentials.username": "Secret key holding the SASL username.",
    "sink.credentials.password": "Secret key holding the SASL password.",
    "checkpoint": "Where Spark's checkpoint (offsets, commits, state) lives.",
    "restartStrategy": "What the operator does when the driver fails.",
    "restartStrategy.type": "fixed-delay, exponential-delay or failure-rate.",
    "restartStrategy.fixedDelay": "Settings of type fixed-delay.",
    "restartStrategy.fixedDelay.delaySeconds": "Delay before each restart.",
    "restartStrategy.exponentialDelay": "Settings of type exponential-delay.",
    "restartStrategy.exponentialDelay.initialDelaySeconds": "Delay before the first restart.",
    "restartStrategy.exponentialDelay.maxDelaySeconds": "Upper bound of the delay.",
    "restartStrategy.exponentialDelay.multiplier": "Factor from one delay to the next.",
    "restartStrategy.failureRate": "Settings of type failure-rate.",
    "restartStrategy.failureRate.intervalSeconds": "Window in which failures are counted.",
    "restartStrategy.failureRate.delaySeconds": "Delay before each restart.",
}


def structural(schema: dict[str, Any], *, keep_defaults: bool = True,
               extra_descriptions: dict[str, str] | None = None) -> dict[str, Any]:
    """Turn a pydantic JSON schema into a Kubernetes structural schema."""
    defs = schema.get("$defs", {})
    extra = extra_descriptions or {}

    def resolve(node: dict[str, Any]) -> dict[str, Any]:
        if "$ref" in node:
            target = copy.deepcopy(defs[node["$ref"].split("/")[-1]])
            # Field-level keywords next to the $ref (description, default) win.
            merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
            if "description" not in node and "description" in target:
                merged["description"] = target["description"]
            return merged
        return node

    def convert(node: dict[str, Any], path: str) -> dict[str, Any]:
        node = resolve(node)
        nullable = False
        if "anyOf" in node:
            variants = [resolve(v) for v in node["anyOf"]]
            non_null = [v for v in variants if v.get("type") != "null"]
            if len(non_null) != 1:
                raise ValueError(f"{path or '<root>'}: a union of several types cannot be structural")
            nullable = len(non_null) < len(variants)
            outer = {k: v for k, v in node.items() if k != "anyOf"}
            node = {**resolve(non_null[0]), **outer}
        if "allOf" in node and len(node["allOf"]) == 1:
            outer = {k: v for k, v in node.items() if k != "allOf"}
            node = {**resolve(node["allOf"][0]), **outer}
        if "const" in node:
            node = {**node, "enum": [node["const"]]}
            node.setdefault("type", "string")

        out: dict[str, Any] = {k: node[k] for k in _KEEP if k in node}
        if "exclusiveMinimum" in node and not isinstance(node["exclusiveMinimum"], bool):
            out["minimum"] = node["exclusiveMinimum"]
            out["exclusiveMinimum"] = True
        if "exclusiveMaximum" in node and not isinstance(node["exclusiveMaximum"], bool):
            out["maximum"] = node["exclusiveMaximum"]
            out["exclusiveMaximum"] = True
        if nullable:
            out["nullable"] = True
        if not keep_defaults or out.get("default", 0) is None:
            out.pop("default", None)
        if path in extra and "description" not in out:
            out["description"] = extra[path]

        typ = node.get("type")
        if typ == "object" or "properties" in node:
            out["type"] = "object"
            props = node.get("properties") or {}
            if props:
                out["properties"] = {
                    name: convert(sub, f"{path}.{name}" if path else name) for name, sub in props.items()}
                required = node.get("required") or []
                if required:
                    out["required"] = list(required)
            else:
                add = node.get("additionalProperties")
                if isinstance(add, dict):
                    out["additionalProperties"] = convert(add, f"{path}.*")
                else:
                    out["x-kubernetes-preserve-unknown-fields"] = True
        elif typ == "array":
            out["items"] = convert(node.get("items") or {}, f"{path}[]")
        elif typ is None:
            raise ValueError(f"{path or '<root>'}: no type in {node}")
        return out

    return convert(schema, "")


def spec_schema() -> dict[str, Any]:
    schema = structural(ExactlyOnceStreamSpec.model_json_schema(by_alias=True, mode="validation"),
                        extra_descriptions=EXTRA_DESCRIPTIONS)
    schema["description"] = "Desired state of the stream."
    return schema


def status_schema() -> dict[str, Any]:
    schema = structural(ExactlyOnceStreamStatus.model_json_schema(by_alias=True, mode="serialization"),
                        keep_defaults=False)
    schema["description"] = "Observed state, written by the operator (and its write-ahead log)."
    conditions = schema["properties"]["conditions"]
    conditions["description"] = "Ready, Progressing and Degraded, per the Kubernetes API conventions."
    conditions["x-kubernetes-list-type"] = "map"
    conditions["x-kubernetes-list-map-keys"] = ["type"]
    # kopf may park its own bookkeeping under status.kopf; keep it from being pruned.
    schema["properties"]["kopf"] = {
        "type": "object", "x-kubernetes-preserve-unknown-fields": True,
        "description": "Bookkeeping of the operator framework (kopf)."}
    return schema


PRINTER_COLUMNS = [
    {"name": "State", "type": "string", "jsonPath": ".status.lifecycleState",
     "description": "Derived lifecycle state."},
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
     "description": "Reason of the Ready condition."},
    {"name": "Batch", "type": "integer", "jsonPath": ".status.lastCommittedBatch",
     "description": "Last committed micro-batch."},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restartCount",
     "description": "Restarts since the last reset."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def build_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "labels": {"app.kubernetes.io/part-of": "spark-eos-operator"}},
        "spec": {
            "group": API_GROUP,
            "scope": "Namespaced",
            "names": {"kind": KIND, "listKind": f"{KIND}List", "plural": PLURAL,
                      "singular": KIND.lower(), "shortNames": list(SHORT_NAMES)},
            "versions": [{
                "name": API_VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": PRINTER_COLUMNS,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": "An exactly-once Spark Structured Streaming job from Kafka to Kafka.",
                    "required": ["spec"],
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "metadata": {"type": "object"},
                        "spec": spec_schema(),
                        "status": status_schema(),
                    },
                }},
            }],
        },
    }


HEADER = ("# Generated by `python -m eos_operator.crd` from jobs/eos_job/spec.py. Do not edit by hand;\n"
          "# tests/operator/test_crd.py fails when this file drifts from the models.\n")


def render() -> str:
    return HEADER + yaml.safe_dump(build_crd(), sort_keys=False, width=100, allow_unicode=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eos_operator.crd",
                                 description="Generate the ExactlyOnceStream CRD from the pydantic models.")
    ap.add_argument("--check", action="store_true", help="exit 1 if the committed file differs")
    ap.add_argument("--stdout", action="store_true", help="print instead of writing the file")
    ap.add_argument("--output", type=Path, default=CRD_PATH)
    args = ap.parse_args(argv)
    text = render()
    if args.stdout:
        sys.stdout.write(text)
        return 0
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is out of date; run `python -m eos_operator.crd`", file=sys.stderr)
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
