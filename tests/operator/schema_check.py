"""A small validator for the subset of OpenAPI v3 a structural CRD schema uses.

It lets the unit tests check the generated CRD offline the way the API server
would (with strict field validation, as ``kubectl apply`` asks for): types,
enums, patterns, bounds, required and unknown fields. The e2e test checks the
real API server.
"""
from __future__ import annotations

import re
from typing import Any

_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
}


def validate(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    if value is None:
        return [] if schema.get("nullable") else [f"{path}: must not be null"]
    typ = schema.get("type")
    if typ and not _TYPES[typ](value):
        return [f"{path}: must be of type {typ}"]
    errors: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: unsupported value {value!r}")
    if isinstance(value, str):
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(f"{path}: should match {schema['pattern']}")
        if len(value) < schema.get("minLength", 0):
            errors.append(f"{path}: shorter than {schema['minLength']}")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"{path}: longer than {schema['maxLength']}")
    if typ in ("integer", "number"):
        if "minimum" in schema:
            low = schema["minimum"]
            if value < low or (schema.get("exclusiveMinimum") and value == low):
                errors.append(f"{path}: below the minimum {low}")
        if "maximum" in schema:
            high = schema["maximum"]
            if value > high or (schema.get("exclusiveMaximum") and value == high):
                errors.append(f"{path}: above the maximum {high}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            errors.append(f"{path}: fewer than {schema['minItems']} items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(f"{path}: more than {schema['maxItems']} items")
        for i, item in enumerate(value):
            errors += validate(item, schema.get("items", {}), f"{path}[{i}]")
    if isinstance(value, dict):
        props = schema.get("properties")
        if "maxProperties" in schema and len(value) > schema["maxProperties"]:
            errors.append(f"{path}: more than {schema['maxProperties']} properties")
        for req in schema.get("required", []):
            if req not in value:
                errors.append(f"{path}.{req}: Required value".lstrip("."))
        for key, item in value.items():
            sub = f"{path}.{key}" if path else key
            if props is not None and key in props:
                errors += validate(item, props[key], sub)
            elif isinstance(schema.get("additionalProperties"), dict):
                errors += validate(item, schema["additionalProperties"], sub)
            elif props is not None and not schema.get("x-kubernetes-preserve-unknown-fields"):
                errors.append(f'{sub}: unknown field "{sub}"')
    return errors
