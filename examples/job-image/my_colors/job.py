"""Count color events per color, dropping the colors ``args.drop`` names (orange by default).

The contract (docs/user-guide.md, "The transformation's contract"): ``transform(df, ctx)`` gets the source as a
streaming DataFrame (Kafka's ``key``, ``value``, ``topic``, ``partition``, ...) and returns ``key`` and ``value``;
``ctx.args`` holds ``spec.job.args``. It must be deterministic: a batch replayed after a crash must give the
same records.
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
        fields.append(F.lit(ctx.args["version"]).alias("version"))
    return counts.select(F.col("color").alias("key"), F.to_json(F.struct(*fields)).alias("value"))
