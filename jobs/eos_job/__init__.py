"""The job runtime: runs one exactly-once Spark Structured Streaming query.

``eos_job.spec`` holds the resource models shared with the operator;
``eos_job.protocol`` is the exactly-once protocol (ledger, fencing, slots);
``eos_job.sink`` writes a micro-batch by it; ``eos_job.resolution`` is the step
the operator runs before every (re)start; ``eos_job.runtime`` drives the query.
"""

__version__ = "0.1.0"
