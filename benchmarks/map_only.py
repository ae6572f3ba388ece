"""The sink benchmark's map-only job: a filter and a projection, no state, no shuffle of its own.

Drops every record whose key (``%010d``, see ``kafka_io.produce_records``) ends in the digit
``args.dropDigit`` (default ``0``: a tenth of the records, the same ones on every run and for both sinks)
and keeps only key and value of the others. Used by ``benchmarks/sink_throughput.py`` (shape ``map``)
for both sinks, so that the only difference between the two queries is the sink.
"""
from pyspark.sql import functions as F

DROP_DIGIT = "0"


def transform(df, ctx):
    digit = ctx.args.get("dropDigit", DROP_DIGIT)
    kept = df.where(F.substring(F.col("key").cast("string"), -1, 1) != F.lit(digit))
    return kept.select("key", "value")
