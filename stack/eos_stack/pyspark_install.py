"""The PySpark this Python environment has: its version and the jars it bundles.

Apart from :mod:`eos_stack.spark` so that :mod:`eos_stack.spark_s3`, which the Spark part uses, can ask
without importing it back: no import circle.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from pathlib import Path

from .common import StackError


def pyspark_version() -> str:
    try:
        return importlib.metadata.version("pyspark")
    except importlib.metadata.PackageNotFoundError:
        raise StackError("pyspark is not installed in this Python environment; run `make venv` "
                         "and use .venv/bin/python") from None


def pyspark_jars_dir() -> Path:
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise StackError("pyspark is not installed in this Python environment; run `make venv`")
    d = Path(list(spec.submodule_search_locations)[0]) / "jars"
    if not d.is_dir():
        raise StackError(f"{d} does not exist: this pyspark installation has no bundled jars")
    return d


def bundled_jar(artifact_id: str, bundled_names: list[str]) -> str | None:
    """The jar of ``bundled_names`` (file names of PySpark's ``jars/``) that is ``artifact_id``, whatever its
    version, or None: a second copy of a library PySpark ships causes hard-to-read linkage errors."""
    pat = re.compile(re.escape(artifact_id) + r"-\d[^/]*\.jar")
    return next((n for n in bundled_names if pat.fullmatch(n)), None)
