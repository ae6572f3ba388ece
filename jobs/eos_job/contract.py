"""The contract between the runtime and the user's job.

The job's ``transform(df, ctx)`` is loaded by module and function name and
receives the source DataFrame and a ``TransformContext``. Output rows follow a
fixed contract (``key``, ``value``; optional ``headers``, ``topic``,
``partition``, ``error``). A row whose ``error`` is set goes to the dead-letter
topic with that error, inside the slot's transaction.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

from .protocol import HASH_COL

OUTPUT_COLUMNS = {"key", "value", "headers", "topic", "partition", "error"}


class JobFailed(RuntimeError):
    """The query cannot go on; the message says why and what to do."""


class DriverSuperseded(JobFailed):
    """A newer driver of the stream started (its epoch is on the slot's ledger record): this one stops for
    good rather than fence the newer one's producers."""
    REASON = "Superseded"


class BatchRefused(JobFailed):
    """Batch N is not the input, or not the spec, the ledger recorded for N: it must not run, and running
    it again would refuse again (the operator fails the stream rather than restart it)."""
    REASON = "BatchRefused"


class SpecRefused(JobFailed):
    """The job's plan contradicts a setting of the spec (``job.slotsFrom: sourcePartitions`` on a job that
    shuffles, say): a restart would refuse again. Nothing was written; the operator fails the stream at once
    and a spec change starts it again."""
    REASON = "InvalidSpec"


@dataclass
class TransformContext:
    """What the user's ``transform(df, ctx)`` receives besides the source DataFrame."""
    spark: object
    args: dict[str, str]
    stream: str
    namespace: str
    slots: int


def load_transform(module: str, function: str):
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise JobFailed(f"job.module: cannot import {module!r} ({exc}); check the module path and the image") from exc
    fn = getattr(mod, function, None)
    if not callable(fn):
        raise JobFailed(f"job.function: {module}.{function} is not a function; define transform(df, ctx) there")
    return fn


def prepare_output(df):
    """Check the output contract and add the record hash used for slot digests."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    cols = set(df.columns)
    if "value" not in cols:
        raise JobFailed(f"the transformation's output has no 'value' column (columns: {sorted(cols)}); "
                        "return key/value columns")
    extra = cols - OUTPUT_COLUMNS
    if extra:
        raise JobFailed(f"the transformation's output has unexpected columns {sorted(extra)}; "
                        f"allowed: {sorted(OUTPUT_COLUMNS)}")
    fields = {f.name: f.dataType for f in df.schema.fields}

    def to_binary(name: str):
        t = fields[name]
        if isinstance(t, T.BinaryType):
            return F.col(name)
        if isinstance(t, T.StringType):
            return F.col(name).cast("binary")
        if isinstance(t, (T.StructType, T.MapType, T.ArrayType)):
            return F.to_json(F.col(name)).cast("binary")
        return F.col(name).cast("string").cast("binary")

    out = [to_binary("value").alias("value"),
           (to_binary("key") if "key" in cols else F.lit(None).cast("binary")).alias("key")]
    for opt, cast in (("topic", "string"), ("partition", "int"), ("error", "string")):
        if opt in cols:
            out.append(F.col(opt).cast(cast).alias(opt))
    if "headers" in cols:
        out.append(F.col("headers"))
    hashed = [F.col("key"), F.col("value")] + [F.col(c) for c in ("topic", "headers", "error") if c in cols]
    return df.select(*out).withColumn(HASH_COL, F.xxhash64(*hashed))
