"""The unique-id stream, map-only, whose output names the source partition each record came from: what the
source-partition slots test checks every record's slot against."""
from pyspark.sql import functions as F

from examples.colors.job import EVENT_SCHEMA


def transform(df, ctx):
    events = df.select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"), F.col("partition"))
    kept = events.where(F.col("e.color").isNotNull() & (F.col("e.color") != "orange"))
    value = F.to_json(F.struct(F.col("e.id").alias("id"), F.col("partition").alias("sourcePartition")))
    return kept.select(F.col("e.id").cast("string").alias("key"), value.alias("value"))
