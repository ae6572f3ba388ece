"""Helpers for user transformations: per-record failures become dead letters, not a stuck query.

A Python UDF that raises fails its Spark task, every retry fails the same way,
and the stream stops (stuck, never lossy). Wrapping the function with
``guarded`` turns a raising record into a row with an ``error`` instead; the
sink writes such rows to ``sink.deadLetterTopic`` with the error, in the slot's
transaction, and counts them::

    parse = guarded(parse_event, "struct<color:string>")
    out = df.select(F.col("key"), parse(F.col("value")).alias("r"))
    out = out.select("key", F.to_json("r.result").alias("value"), F.col("r.error").alias("error"))
"""
from __future__ import annotations

from typing import Callable


def guarded(fn: Callable, return_type):
    """A UDF returning ``struct<result: return_type, error: string>``; ``error`` is set when ``fn`` raised."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    rt = T._parse_datatype_string(return_type) if isinstance(return_type, str) else return_type
    schema = T.StructType([T.StructField("result", rt), T.StructField("error", T.StringType())])

    def call(*args):
        try:
            return (fn(*args), None)
        except Exception as exc:  # noqa: BLE001 - any failure of user code is this record's error
            return (None, f"{type(exc).__name__}: {exc}"[:2000])

    return F.udf(call, schema)
