"""A broken upgrade of ``ids_by_partition`` that writes part of a batch: the records of source partition 1 make
its task fail (after a pause, so the other partitions' slots commit first), every time the batch runs. What
the rollback over a partially committed batch needs (tests/e2e/test_rollback_partial_e2e.py)."""
import time

from pyspark.sql import functions as F

from tests.e2e.jobs.ids_by_partition import transform as passed_through

BROKEN_PARTITION = 1
PAUSE_S = 20


@F.udf("string")
def _checked(partition, value):
    if partition == BROKEN_PARTITION:
        time.sleep(PAUSE_S)   # the other slots' transactions commit meanwhile
        raise RuntimeError(f"broken upgrade: cannot handle source partition {partition}")
    return value


def transform(df, ctx):
    out = passed_through(df, ctx)
    return out.withColumn("value", _checked(F.get_json_object("value", "$.sourcePartition").cast("int"),
                                            F.col("value")))
