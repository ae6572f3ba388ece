"""Slots from the source's partitions (``job.slotsFrom: sourcePartitions``): no shuffle for a map-only job.

By default the output is cut into slots by ``repartition(P, key)``: a shuffle, whatever the job. A map-only
job (filter, project, per-record functions) reading Kafka needs none: Spark reads each source topic-partition's
offset range of batch N in one task, and the offset log fixes those ranges before the batch runs, so a replay
of N gives every task the same records. The slot of a task is then the rank of its topic-partition among the
partitions batch N's offset log names, sorted by (topic, partition): a pure function of ``offsets/N``, the same
on every replay, whatever order Spark lists the ranges in (the driver reads that order from the batch's
RDD and hands each task its slot by index; ``mapInArrow`` over the foreachBatch DataFrame runs on that same
RDD, so its tasks are those).

What it relies on, checked before any slot runs (else the batch fails and nothing is written):

* the plan is narrow: one Kafka scan, no exchange (no shuffle, aggregation, join with a shuffle) between it and
  the sink, so a task's rows are exactly its topic-partition's range;
* each topic-partition is one task (``minPartitions`` and ``maxRecordsPerPartition`` are refused by the spec);
* the batch's topic-partitions number at most P (``job.parallelism``): P transactional ids per generation.

Empty ranges get no task and their slots no commit; the driver expects commits from the slots that ran.
"""
from __future__ import annotations

from . import faults
from .contract import SpecRefused
from .protocol import Ranges


def ranks(planned: Ranges) -> dict[tuple[str, int], int]:
    """Slot of every topic-partition batch N's offset log names: its rank by (topic, partition)."""
    order = sorted((t, int(p)) for t, parts in planned.items() for p in parts)
    if faults.unsafe("slot-order"):
        # Negative control: rank the other way round, so a replay may give a slot another partition's records.
        order.reverse()
    return {tp: i for i, tp in enumerate(order)}


def scan_partitions(jdf) -> list[tuple[str, int]]:
    """The topic-partition each task of ``jdf``'s executed plan reads, by task index; refuses plans whose
    tasks are not one source partition each.

    A ``foreachBatch`` DataFrame is a scan of the RDD Spark already built for the batch (``Scan
    ExistingRDD``): its lineage down to the Kafka source's ``DataSourceRDD`` must be one-to-one (no shuffle,
    no union or coalesce), so task i reads the source's input partition i."""
    plan = jdf.queryExecution().executedPlan()
    names, leaves = [], []
    stack = [plan]
    while stack:
        node = stack.pop()
        names.append(node.nodeName())
        children = node.children()
        if children.size() == 0:
            leaves.append(node)
        stack.extend(children.apply(i) for i in range(children.size()))
    shuffles = sorted({n for n in names if "Exchange" in n or "StateStore" in n or "Aggregate" in n})
    if shuffles or len(leaves) != 1:
        _not_map_only(", ".join(shuffles) or "inputs " + ", ".join(sorted(n.nodeName() for n in leaves)))
    leaf = leaves[0]
    if not leaf.nodeName().startswith("Scan ExistingRDD"):
        _not_map_only(f"input {leaf.nodeName()}")
    rdd = leaf.rdd()
    while rdd.dependencies().size():
        deps = rdd.dependencies()
        kind = deps.apply(0).getClass().getSimpleName()
        if deps.size() != 1 or kind != "OneToOneDependency":
            _not_map_only(f"a {kind} in its lineage ({rdd.getClass().getSimpleName()})")
        rdd = deps.apply(0).rdd()
    if rdd.getClass().getSimpleName() != "DataSourceRDD":
        _not_map_only(f"input {rdd.getClass().getSimpleName()}")
    out = []
    for part in rdd.partitions():
        one = part.inputPartition()          # Spark 4: Option[InputPartition], one range per task
        if not one.isDefined():
            raise SpecRefused("job.slotsFrom sourcePartitions: a task of the batch reads no source range; set "
                            "job.slotsFrom key; nothing was written")
        tp = one.get().offsetRange().topicPartition()
        out.append((str(tp.topic()), int(tp.partition())))
    if len(set(out)) != len(out):
        raise SpecRefused("job.slotsFrom sourcePartitions: a source partition is read by several tasks "
                        "(source.options minPartitions or maxRecordsPerPartition?): remove those options or set "
                        "job.slotsFrom key; nothing was written")
    return out


def _not_map_only(what: str):
    raise SpecRefused(f"job.slotsFrom sourcePartitions needs a map-only job (one Kafka source, no shuffle), but the "
                    f"batch's plan has {what}: set job.slotsFrom key (the output is then repartitioned by key), or "
                    "drop the aggregation, join or repartition; nothing was written")


def slot_map(read: list[tuple[str, int]], planned: Ranges, slots: int) -> tuple[int, ...]:
    """The slot of each task (by index): the rank of the topic-partition it reads in batch N's offset log."""
    ranked = ranks(planned)
    if len(ranked) > slots:
        raise SpecRefused(f"job.slotsFrom sourcePartitions: the source has {len(ranked)} partitions and "
                        f"job.parallelism is {slots}: set job.parallelism to at least {len(ranked)} (an upgrade "
                        "under a new generation) or job.slotsFrom key; nothing was written")
    unknown = [tp for tp in read if tp not in ranked]
    if unknown:
        raise RuntimeError(f"the batch reads {unknown}, which its offset log does not name; nothing was written")
    return tuple(ranked[tp] for tp in read)
