"""The deduplicating unique-id job (``ids_deduped.py``) keyed by (id, color) instead of id: its state store's key
schema differs, so Spark must refuse to start it on ``ids_deduped``'s state (the pre-flight test's broken upgrade).
"""
from pyspark.sql import functions as F

from examples.colors.job import EVENT_SCHEMA


def transform(df, ctx):
    events = df.select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"))
    kept = events.where(F.col("e.color").isNotNull() & (F.col("e.color") != "orange")).select("e.id", "e.color")
    value = F.to_json(F.struct("id", "color"))
    return kept.dropDuplicates(["id", "color"]).select(F.col("id").cast("string").alias("key"), value.alias("value"))
