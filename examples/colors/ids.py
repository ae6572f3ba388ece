"""The colors events passed through, one output record per kept input record: the unique-id stream.

Input value: JSON ``{"id": 17, "color": "red"}``. Output: key = the id, value =
the event as read, for every event the colors job counts (orange dropped). An
audit then checks the output as a set of ids (``eos_job.verify.audit_ids``):
a lost transaction of any batch shows as missing ids, a duplicate as an id seen
twice, which final counts per color can hide.
"""
from pyspark.sql import functions as F

from examples.colors.job import EVENT_SCHEMA


def transform(df, ctx):
    dropped = {c.strip() for c in ctx.args.get("drop", "orange").split(",") if c.strip()}
    events = df.select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"), F.col("value"))
    kept = events.where(F.col("e.color").isNotNull() & ~F.col("e.color").isin(*dropped))
    return kept.select(F.col("e.id").cast("string").alias("key"), F.col("value").cast("string").alias("value"))
