"""The benchmark's job: a passthrough of the source records' key and value.

Used by ``benchmarks/sink_throughput.py`` for both sinks, so that the only
difference between the two queries is the sink.
"""


def transform(df, ctx):
    return df.select("key", "value")
