"""The unique-id stream through a stateful operator: events deduplicated by id (Spark's streaming
``dropDuplicates``, every id seen kept in its state store), so an id sent again is output once only if the state
carried from batch to batch, through snapshots and upgrades, still holds it. The value names the spec that wrote
it (``job.args.version``, absent at first): the upgrade test reads each upgrade's output gap from it."""
from pyspark.sql import functions as F

from examples.colors.job import EVENT_SCHEMA


def transform(df, ctx):
    version = ctx.args.get("version") or None
    events = df.select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"))
    kept = events.where(F.col("e.color").isNotNull() & (F.col("e.color") != "orange")).select("e.id", "e.color")
    value = F.to_json(F.struct("id", "color", F.lit(version).cast("string").alias("version")))
    return kept.dropDuplicates(["id"]).select(F.col("id").cast("string").alias("key"), value.alias("value"))
