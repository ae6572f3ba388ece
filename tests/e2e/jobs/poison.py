"""A test transformation with poison records: some raise in user code, some are too large for Kafka."""
import json

from pyspark.sql import functions as F

from eos_job.transform import guarded


def parse(raw: bytes) -> str:
    event = json.loads(raw)  # raises on the records that are not JSON
    if event.get("big"):
        return "x" * 2_000_000  # larger than the producer's message.max.bytes: refused by Kafka
    return json.dumps({"id": event["id"], "ok": True})


def transform(df, ctx):
    p = guarded(parse, "string")
    out = df.select(F.col("key"), p(F.col("value")).alias("r"), F.col("value").alias("raw"))
    # A failed record keeps its original value so the dead letter carries what came in.
    return out.select("key", F.coalesce(F.col("r.result"), F.col("raw").cast("string")).alias("value"),
                      F.col("r.error").alias("error"))
