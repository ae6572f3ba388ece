"""The colors job with an extra grouping column: its aggregation state cannot be read from a colors checkpoint.

The state key of the colors job is (color: string); this one's is (color: string,
letters: int), so Spark must refuse to start it on the colors job's state.
"""
from pyspark.sql import functions as F

from examples.colors.job import EVENT_SCHEMA


def transform(df, ctx):
    events = df.select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"))
    kept = events.where(F.col("e.color").isNotNull())
    counts = kept.groupBy(F.col("e.color").alias("color"), F.length("e.color").alias("letters")).count()
    return counts.select(F.col("color").alias("key"),
                         F.to_json(F.struct("color", "letters", "count")).alias("value"))
