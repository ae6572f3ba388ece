"""Validation the CRD schema cannot express.

The API server already rejects what the generated schema can say (types, enums,
patterns, bounds, unknown fields). What is left: pydantic validators (topic
names in a list, a restart-strategy section that does not match its type) and
``eos_job.spec.semantic_errors`` (cross-field checks). Every message starts with
the field's path under ``spec.`` so the user sees which field to fix.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from eos_job.spec import ExactlyOnceStreamSpec, semantic_errors
from eos_job.spec_rules import AMBIENT_GATE, explain

from .children import BLOCK_MANAGER_PORT, DRIVER_PORT


@dataclass(frozen=True)
class InvalidSpec:
    """The resource's spec cannot be run; ``errors`` each name a field."""
    errors: tuple[str, ...]

    @property
    def message(self) -> str:
        return "; ".join(self.errors)


def _path(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts)


def _field_from_message(msg: str) -> str | None:
    """Validators in spec.py start their message with the field path ('source.topics: ...')."""
    head = msg.split(":", 1)[0].strip()
    if head and " " not in head and head[0].isalpha():
        return head
    return None


def _format_pydantic(exc: ValidationError) -> list[str]:
    out = []
    for err in exc.errors(include_url=False):
        msg = explain(err)   # a refused pattern says what the value must look like
        loc = _path(tuple(err.get("loc", ())))
        named = _field_from_message(msg)
        if named:
            # The validator named the field itself (relative to the model it validates).
            field = named if not loc or named.startswith(loc.split(".")[0]) else f"{loc}.{named}"
            body = msg.split(":", 1)[1].strip() if ":" in msg else msg
            out.append(f"spec.{field}: {body}")
        else:
            out.append(f"spec.{loc}: {msg}" if loc else f"spec: {msg}")
    return out


_LOCAL_STORE = {"allowed": False}


def allow_local_store(allowed: bool = True) -> None:
    """``python -m eos_operator run --allow-local-store``: accept ``checkpoint.store: local`` (a directory on the
    node that runs the driver, so only where every Pod runs on one machine: tests, a single-node lab)."""
    _LOCAL_STORE["allowed"] = allowed


_AMBIENT_S3 = {"allowed": False}


def allow_ambient_s3_credentials(allowed: bool = True) -> None:
    """``python -m eos_operator run --allow-ambient-s3-credentials`` (chart value
    ``operator.allowAmbientS3Credentials``): accept ``checkpoint.s3.credentials: ambient``, a bucket read with the
    operator's own identity. Off by default: in a shared cluster that identity may reach every tenant's bucket."""
    _AMBIENT_S3["allowed"] = allowed


def ambient_s3_allowed() -> bool:
    return _AMBIENT_S3["allowed"]


def validate_spec(raw: dict[str, Any] | None, namespace: str | None = None,
                  name: str | None = None) -> ExactlyOnceStreamSpec | InvalidSpec:
    """Parse and check a resource's ``spec``; never raises for bad input. With the stream's namespace and
    name, what derives from them is checked too (the default ledger topic's length)."""
    if not isinstance(raw, dict):
        return InvalidSpec(("spec: required",))
    try:
        spec = ExactlyOnceStreamSpec.model_validate(raw)
    except ValidationError as exc:
        return InvalidSpec(tuple(_format_pydantic(exc)))
    except RecursionError:   # absurdly deep nesting in a free-form map
        return InvalidSpec(("spec: nested too deeply to be a stream's spec",))
    errors = semantic_errors(spec, namespace, name)
    if spec.checkpoint.store == "local" and not _LOCAL_STORE["allowed"]:
        errors.append("checkpoint.store: local is a directory on whichever node runs the driver: a restart on "
                      "another node would not find the checkpoint. Use store s3 (or pvc); local is accepted "
                      "only by an operator started with --allow-local-store (tests, single-node labs)")
    metrics = spec.job.metrics
    if (metrics is not None and metrics.enabled and spec.job.deploy_mode == "cluster"
            and metrics.port in (DRIVER_PORT, BLOCK_MANAGER_PORT)):
        errors.append(f"job.metrics.port: {metrics.port} is taken by the driver's RPC in cluster mode (ports "
                      f"{DRIVER_PORT} and {BLOCK_MANAGER_PORT}); pick another port, e.g. the default 4040")
    s3 = spec.checkpoint.s3
    if spec.checkpoint.store == "s3" and s3 is not None and s3.credentials == "ambient" and not ambient_s3_allowed():
        errors.append("checkpoint.s3.credentials: ambient would read the bucket with the operator's own identity, "
                      f"and this operator does not allow it: set {AMBIENT_GATE} to true if every stream may use "
                      "that identity, or give the stream its keys (accessKeyId and secretAccessKey)")
    if errors:
        return InvalidSpec(tuple(e if e.startswith("spec.") else f"spec.{e}" for e in errors))
    return spec
