"""The colors example: events carry a color; drop orange, count per color, emit updated counts.

Input value: JSON ``{"id": 17, "color": "red"}``. Output: key = color, value =
JSON ``{"color": "red", "count": 42}`` for every color whose count changed in
the micro-batch (update mode). ``args.version``, if set, adds ``"version": <value>``
to every output record.
"""
from pyspark.sql import functions as F

EVENT_SCHEMA = "id long, color string"


def transform(df, ctx):
    dropped = {c.strip() for c in ctx.args.get("drop", "orange").split(",") if c.strip()}
    events = df.select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"))
    kept = events.where(F.col("e.color").isNotNull() & ~F.col("e.color").isin(*dropped))
    counts = kept.groupBy(F.col("e.color").alias("color")).count()
    fields = [F.col("color"), F.col("count")]
    if ctx.args.get("version"):
        # An output-only change (same key and count): lets an upgrade be seen in the output.
        fields.append(F.lit(ctx.args["version"]).alias("version"))
    return counts.select(F.col("color").alias("key"), F.to_json(F.struct(*fields)).alias("value"))
