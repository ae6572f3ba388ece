"""The colors job with a random number in every output record: a replay never reproduces its output.

The counts stay right; the records differ, so a replayed batch's slot digests differ from what
the sink holds, which the runtime detects and the operator reports.
"""
from pyspark.sql import functions as F

from examples.colors.job import EVENT_SCHEMA


def transform(df, ctx):
    events = df.select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"))
    kept = events.where(F.col("e.color").isNotNull() & (F.col("e.color") != "orange"))
    counts = kept.groupBy(F.col("e.color").alias("color")).count()
    return counts.select(F.col("color").alias("key"),
                         F.to_json(F.struct("color", "count", F.rand().alias("drawn"))).alias("value"))
