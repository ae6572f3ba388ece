"""How the operator and the job runtime write their logs: text (the default) or JSON, one object per line.

``configure(fmt, level)`` installs one stderr handler on the root logger. Either format goes through
``redact``: every Secret value the process holds (``register_secret``: the operator registers each value it
reads from a Secret, the runtime the values the operator mapped into its environment) and the password of
an inline JAAS line are replaced by ``***`` in the message and in a traceback, before anything is written.

A JSON line has ``time`` (RFC 3339, UTC, milliseconds), ``level``, ``logger`` and ``message``, then what is
known of ``stream``, ``namespace``, ``attempt`` and ``batch`` (and ``snapshot`` for a snapshot's records),
then ``exception`` (the formatted traceback) when the record carries one. The fields come from, later ones
winning: the process's base context (``set_base_context``: the runtime's stream, namespace and attempt), the
current context (``log_context``: a contextvar, so each asyncio task of the operator and each thread of the
runtime has its own: the stream a reconcile works on, the batch the writer writes), the object kopf logs
about (its ``k8s_ref``), and a record's own ``extra``.
"""
from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime, timezone
from typing import Any, Iterator, TextIO

FORMATS = ("text", "json")
FORMAT_ENV = "EOS_LOG_FORMAT"
ATTEMPT_ENV = "EOS_ATTEMPT"   # the driver's attempt, set by the operator: a field of the runtime's records
CONTEXT_FIELDS = ("stream", "namespace", "attempt", "batch", "snapshot")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
MASK = "***"
MIN_SECRET = 4   # shorter values (a one-letter username) would mask ordinary words; they are not secrets

_base: dict[str, Any] = {}
_context: ContextVar[dict[str, Any]] = ContextVar("eos_log_context", default={})
_secrets: set[str] = set()
_chosen = {"format": "text"}
# password="..." of a JAAS line (kafka-clients' sasl.jaas.config), wherever it is printed.
_JAAS_PASSWORD = re.compile(r'(password\s*=\s*")((?:[^"\\]|\\.)*)(")', re.IGNORECASE)


def parse_format(value: str | None, source: str = FORMAT_ENV) -> str:
    """``text`` or ``json`` (unset: text); anything else is a ValueError naming ``source`` and the fix."""
    fmt = (value or "text").strip().lower()
    if fmt not in FORMATS:
        raise ValueError(f"{source}: {value!r} is not a log format: use text or json")
    return fmt


def format_argument(value: str) -> str:
    """``--log-format`` of both command lines (argparse ``type``: also checks a default from the environment)."""
    try:
        return parse_format(value, f"--log-format (or ${FORMAT_ENV})")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def current_format() -> str:
    """The format this process chose (``configure``): the operator passes it on to the Pods it makes."""
    return _chosen["format"]


# ------------------------------------------------------------------ redaction
def register_secret(value: str | None) -> None:
    """A value that must never be written to a log (a Secret's value, a key from the environment)."""
    if value and len(value) >= MIN_SECRET:
        _secrets.add(value)


def redact(text: str) -> str:
    """``text`` with every registered secret and every inline JAAS password replaced by ``***``."""
    for secret in sorted(_secrets, key=len, reverse=True):   # a secret inside a longer one: the longer first
        if secret in text:
            text = text.replace(secret, MASK)
    return _JAAS_PASSWORD.sub(lambda m: m.group(1) + MASK + m.group(3), text)


# -------------------------------------------------------------------- context
def set_base_context(**fields: Any) -> None:
    """Fields of every record of this process (the runtime: its stream, namespace and attempt)."""
    _base.update({k: v for k, v in fields.items() if v is not None})


@contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Fields of every record logged inside the block, in this thread or asyncio task only."""
    token = _context.set({**_context.get(), **{k: v for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


def context_of(record: logging.LogRecord) -> dict[str, Any]:
    fields = {**_base, **_context.get()}
    ref = getattr(record, "k8s_ref", None)     # kopf's per-object loggers
    if isinstance(ref, dict) and ref.get("name"):
        fields["snapshot" if ref.get("kind") == "ExactlyOnceSnapshot" else "stream"] = ref["name"]
        if ref.get("namespace"):
            fields["namespace"] = ref["namespace"]
    for key in CONTEXT_FIELDS:
        if getattr(record, key, None) is not None:
            fields[key] = getattr(record, key)
    return {k: fields[k] for k in CONTEXT_FIELDS if k in fields}


# ----------------------------------------------------------------- formatters
class RedactingFormatter(logging.Formatter):
    """The text format, with secrets masked."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines in a message or traceback are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds")
                    .replace("+00:00", "Z"),
            "level": record.levelname, "logger": record.name, "message": redact(record.getMessage())}
        doc.update(context_of(record))
        if record.exc_info:
            doc["exception"] = redact(self.formatException(record.exc_info))
        elif record.exc_text:
            doc["exception"] = redact(record.exc_text)
        if record.stack_info:
            doc["stack"] = redact(self.formatStack(record.stack_info))
        return json.dumps(doc, ensure_ascii=False, default=str)


def formatter(fmt: str) -> logging.Formatter:
    return JsonFormatter() if parse_format(fmt, "log format") == "json" else RedactingFormatter(TEXT_FORMAT)


class _Handler(logging.StreamHandler):
    """The handler ``configure`` installs (and replaces when called again)."""


def configure(fmt: str, level: int | str = logging.INFO, stream: TextIO | None = None, *,
              force: bool = False) -> None:
    """One handler on the root logger writing ``fmt`` to ``stream`` (stderr). Like ``logging.basicConfig``,
    it leaves a root logger that has handlers of someone else's alone (a test runner's, a host program's)
    unless ``force``; the chosen format is recorded either way (the operator passes it on to its Pods)."""
    _chosen["format"] = parse_format(fmt, "log format")
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler) or force]:
        root.removeHandler(old)
    if root.handlers:
        return
    handler = _Handler(stream or sys.stderr)
    handler.setFormatter(formatter(fmt))
    root.addHandler(handler)
    root.setLevel(level)
