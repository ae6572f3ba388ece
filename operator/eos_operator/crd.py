"""The CustomResourceDefinitions, generated from the pydantic models in ``eos_job.spec``.

``python -m eos_operator.crd`` rewrites ``crds/exactlyoncestreams.streaming.eos.dev.yaml``
and ``crds/exactlyoncesnapshots.streaming.eos.dev.yaml``;
``python -m eos_operator.crd --check`` exits 1 when either committed file drifts
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

from eos_job.spec import API_GROUP, API_VERSION, KIND, PLURAL, SHORT_NAMES, ExactlyOnceStreamSpec
from eos_job.spec_rules import STREAM_OBJECT_RULES
from eos_job.status import ExactlyOnceStreamStatus
from eos_job.snapshot_resource import (SNAPSHOT_KIND, SNAPSHOT_PLURAL, SNAPSHOT_SHORT_NAMES,
                                       ExactlyOnceSnapshotStatus, SnapshotSpec)

from .children import MAX_LABEL, MAX_STREAM_NAME

# Versions still served besides API_VERSION (the storage version), oldest last, each deprecated with a warning the
# API server returns on every request made with it. Their schemas are API_VERSION's: no field differs, so the
# API server converts by rewriting apiVersion (conversion strategy None); a version whose fields differ needs a
# conversion webhook first (docs/api-policy.md).
OLDER_VERSIONS = ("v1alpha1",)


def deprecation_warning(version: str) -> str:
    return (f"{API_GROUP}/{version} is deprecated and will be removed in a later release; use "
            f"{API_GROUP}/{API_VERSION} (same fields: change apiVersion only)")


REPO = Path(__file__).resolve().parents[2]
CRD_DIR = REPO / "crds"
CRD_NAME = f"{PLURAL}.{API_GROUP}"
CRD_PATH = CRD_DIR / f"{CRD_NAME}.yaml"
SNAPSHOT_CRD_NAME = f"{SNAPSHOT_PLURAL}.{API_GROUP}"
SNAPSHOT_CRD_PATH = CRD_DIR / f"{SNAPSHOT_CRD_NAME}.yaml"

# Keywords a structural schema may carry through from pydantic's output.
_KEEP = ("type", "description", "enum", "default", "pattern", "minLength", "maxLength", "minimum",
         "maximum", "minItems", "maxItems", "minProperties", "maxProperties", "format", "nullable",
         "x-kubernetes-validations")

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
    conditions["description"] = ("Ready, Progressing and Degraded, per the Kubernetes API conventions; Reconciling "
                                 "(Progressing under the kstatus name) and Stalled (the operator stopped and waits "
                                 "for a change of the spec), the conditions kstatus and Flux read.")
    conditions["x-kubernetes-list-type"] = "map"
    conditions["x-kubernetes-list-map-keys"] = ["type"]
    return _with_kopf(schema)


def _with_kopf(schema: dict[str, Any]) -> dict[str, Any]:
    # kopf may park its own bookkeeping under status.kopf; keep it from being pruned.
    schema["properties"]["kopf"] = {
        "type": "object", "x-kubernetes-preserve-unknown-fields": True,
        "description": "Bookkeeping of the operator framework (kopf)."}
    return schema


def snapshot_spec_schema() -> dict[str, Any]:
    schema = structural(SnapshotSpec.model_json_schema(by_alias=True, mode="validation"))
    schema["description"] = "Which stream to snapshot, who asked, and what happens to the files on deletion."
    return schema


def snapshot_status_schema() -> dict[str, Any]:
    schema = structural(ExactlyOnceSnapshotStatus.model_json_schema(by_alias=True, mode="serialization"),
                        keep_defaults=False)
    schema["description"] = "Observed state, written by the operator (and its write-ahead log)."
    return _with_kopf(schema)


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


SNAPSHOT_PRINTER_COLUMNS = [
    {"name": "Stream", "type": "string", "jsonPath": ".spec.stream", "description": "The snapshotted stream."},
    {"name": "Batch", "type": "integer", "jsonPath": ".status.batch",
     "description": "Last batch committed in the snapshot."},
    {"name": "Path", "type": "string", "jsonPath": ".status.path",
     "description": "Snapshot directory in the checkpoint store."},
    {"name": "State", "type": "string", "jsonPath": ".status.state",
     "description": "Pending, InProgress, Completed or Failed."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _name_rule(limit: int, why: str) -> list[dict[str, str]]:
    """A CEL rule on metadata.name (the API server allows 253 characters; names we derive need fewer)."""
    return [{"rule": f"self.metadata.name.size() <= {limit}",
             "message": f"metadata.name must be at most {limit} characters ({why}); choose a shorter name"}]


def _crd(*, kind: str, plural: str, short_names: list[str], description: str, spec: dict[str, Any],
         status: dict[str, Any], columns: list[dict[str, Any]], name_rule: list[dict[str, str]]) -> dict[str, Any]:
    schema = {
        "type": "object",
        "description": description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
        "x-kubernetes-validations": name_rule,
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{API_GROUP}", "labels": {"app.kubernetes.io/part-of": "spark-eos-operator"}},
        "spec": {
            "group": API_GROUP,
            "scope": "Namespaced",
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural,
                      "singular": kind.lower(), "shortNames": list(short_names)},
            "versions": [_version(API_VERSION, schema, columns)]
                        + [_version(v, schema, columns, deprecated=True) for v in OLDER_VERSIONS],
            # Identical schemas: the API server only rewrites apiVersion (see OLDER_VERSIONS).
            "conversion": {"strategy": "None"},
        },
    }


def _version(name: str, schema: dict[str, Any], columns: list[dict[str, Any]], *,
             deprecated: bool = False) -> dict[str, Any]:
    """One entry of spec.versions; API_VERSION is the storage version (and first: what readers of [0] want)."""
    version: dict[str, Any] = {"name": name, "served": True, "storage": name == API_VERSION}
    if deprecated:
        version.update(deprecated=True, deprecationWarning=deprecation_warning(name))
    version.update({"subresources": {"status": {}}, "additionalPrinterColumns": copy.deepcopy(columns),
                    "schema": {"openAPIV3Schema": copy.deepcopy(schema)}})
    return version


def build_crd() -> dict[str, Any]:
    return _crd(kind=KIND, plural=PLURAL, short_names=SHORT_NAMES,
                description="An exactly-once Spark Structured Streaming job from Kafka to Kafka.",
                spec=spec_schema(), status=status_schema(), columns=PRINTER_COLUMNS,
                name_rule=_name_rule(MAX_STREAM_NAME, "the driver's Service is named <name>-driver, a DNS label "
                                                      "of at most 63") + STREAM_OBJECT_RULES)


def build_snapshot_crd() -> dict[str, Any]:
    return _crd(kind=SNAPSHOT_KIND, plural=SNAPSHOT_PLURAL, short_names=SNAPSHOT_SHORT_NAMES,
                description=("A snapshot of an ExactlyOnceStream: a copy of its checkpoint at a committed batch "
                             "with a manifest, taken by the operator; it outlives the stream."),
                spec=snapshot_spec_schema(), status=snapshot_status_schema(), columns=SNAPSHOT_PRINTER_COLUMNS,
                name_rule=_name_rule(MAX_LABEL, "it is a label value of the snapshot's Pods"))


HEADER = ("# Generated by `python -m eos_operator.crd` from jobs/eos_job/spec.py. Do not edit by hand;\n"
          "# tests/operator/test_crd.py fails when this file drifts from the models.\n")


def _render(crd: dict[str, Any]) -> str:
    return HEADER + yaml.safe_dump(crd, sort_keys=False, width=100, allow_unicode=True)


def render() -> str:
    """The ExactlyOnceStream CRD file."""
    return _render(build_crd())


def render_snapshot() -> str:
    """The ExactlyOnceSnapshot CRD file."""
    return _render(build_snapshot_crd())


def rendered() -> dict[str, str]:
    """Every generated CRD file: {file name: text}."""
    return {CRD_PATH.name: render(), SNAPSHOT_CRD_PATH.name: render_snapshot()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eos_operator.crd",
                                 description="Generate the ExactlyOnceStream and ExactlyOnceSnapshot CRDs from "
                                             "the pydantic models.")
    ap.add_argument("--check", action="store_true", help="exit 1 if a committed file differs")
    ap.add_argument("--stdout", action="store_true", help="print instead of writing the files")
    ap.add_argument("--dir", type=Path, default=CRD_DIR, help="folder of the CRD files (default: crds/)")
    args = ap.parse_args(argv)
    files = rendered()
    if args.stdout:
        sys.stdout.write("---\n".join(files.values()))
        return 0
    if args.check:
        stale = [name for name, text in files.items()
                 if not (args.dir / name).exists() or (args.dir / name).read_text() != text]
        for name in stale:
            print(f"{args.dir / name} is out of date; run `python -m eos_operator.crd`", file=sys.stderr)
        return 1 if stale else 0
    args.dir.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (args.dir / name).write_text(text)
        print(f"wrote {args.dir / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
