"""Slots from the source's partitions: the slot of a task is the rank of its topic-partition in batch N's
offset log, whatever order Spark lists the tasks in; plans that are not one partition per task are refused."""
import pytest

from eos_job import faults, source_slots
from eos_job.contract import JobFailed
from eos_job.protocol import GenerationHistory, effective_generation

PLANNED = {"b": {"0": [0, 10]}, "a": {"1": [5, 9], "0": [0, 3], "10": [0, 0], "2": [1, 4]}}


def test_slot_is_the_rank_in_the_offset_log_whatever_the_task_order():
    assert source_slots.ranks(PLANNED) == {("a", 0): 0, ("a", 1): 1, ("a", 2): 2, ("a", 10): 3, ("b", 0): 4}
    # Spark lists non-empty ranges only, in an order of its own: each task still gets its partition's slot.
    assert source_slots.slot_map([("b", 0), ("a", 2), ("a", 0)], PLANNED, 5) == (4, 2, 0)
    assert source_slots.slot_map([("a", 0), ("a", 2), ("b", 0)], PLANNED, 8) == (0, 2, 4)


def test_more_source_partitions_than_slots_names_the_fix():
    with pytest.raises(JobFailed, match="set job.parallelism to at least 5"):
        source_slots.slot_map([("a", 0)], PLANNED, 4)


def test_a_task_reading_a_partition_the_offset_log_does_not_name_fails():
    with pytest.raises(RuntimeError, match="offset log does not name"):
        source_slots.slot_map([("c", 0)], PLANNED, 5)


def test_the_negative_control_ranks_the_other_way_round(monkeypatch):
    monkeypatch.setenv(faults.UNSAFE_ENV, "slot-order")
    faults.reset()
    try:
        assert source_slots.ranks(PLANNED)[("b", 0)] == 0
    finally:
        monkeypatch.delenv(faults.UNSAFE_ENV)
        faults.reset()


class _Seq:
    def __init__(self, items):
        self.items = list(items)

    def size(self):
        return len(self.items)

    def apply(self, i):
        return self.items[i]


def _named(name):
    return type(name, (), {"getSimpleName": lambda s: name})()


class _Rdd:
    """A JVM RDD as py4j shows it: its class, its one dependency (or none), its partitions."""

    def __init__(self, cls, parent=None, dep="OneToOneDependency", parts=()):
        self.cls, self.parent, self.dep, self.parts = cls, parent, dep, parts

    def getClass(self):  # noqa: N802 - the JVM's names
        return _named(self.cls)

    def dependencies(self):
        if self.parent is None:
            return _Seq([])
        dep = type("Dep", (), {"getClass": lambda s: _named(self.dep), "rdd": lambda s: self.parent})()
        return _Seq([dep])

    def partitions(self):
        return [_Part(t, p) for t, p in self.parts]


class _Part:
    def __init__(self, topic, partition):
        tp = type("TP", (), {"topic": lambda s: topic, "partition": lambda s: partition})()
        rng = type("R", (), {"topicPartition": lambda s: tp})()
        self.ip = type("IP", (), {"offsetRange": lambda s: rng})()

    def inputPartition(self):  # noqa: N802
        return type("Some", (), {"isDefined": lambda s: True, "get": lambda s: self.ip})()


class _Node:
    def __init__(self, name, *children, rdd=None):
        self.name, self.kids, self._rdd = name, children, rdd

    def nodeName(self):  # noqa: N802
        return self.name

    def children(self):
        return _Seq(self.kids)

    def rdd(self):
        return self._rdd


def _jdf(plan):
    qe = type("QE", (), {"executedPlan": lambda s: plan})()
    return type("JDF", (), {"queryExecution": lambda s: qe})()


def _batch_rdd(parts, dep="OneToOneDependency"):
    """What foreachBatch scans: the batch's RDD over the Kafka source's DataSourceRDD."""
    source = _Rdd("DataSourceRDD", parts=parts)
    return _Rdd("MapPartitionsRDD", _Rdd("MapPartitionsRDD", source), dep=dep)


def test_a_narrow_plan_lists_its_tasks_partitions_in_order():
    plan = _Node("MapInArrow", _Node("Scan ExistingRDD", rdd=_batch_rdd([("t", 2), ("t", 0)])))
    assert source_slots.scan_partitions(_jdf(plan)) == [("t", 2), ("t", 0)]


@pytest.mark.parametrize("plan,says", [
    (_Node("Project", _Node("Exchange", _Node("Scan ExistingRDD", rdd=_batch_rdd([("t", 0)])))), "Exchange"),
    (_Node("Project", _Node("Scan ExistingRDD", rdd=_batch_rdd([("t", 0)], dep="ShuffleDependency"))),
     "ShuffleDependency"),
    (_Node("Union", _Node("Scan ExistingRDD", rdd=_batch_rdd([("t", 0)])), _Node("LocalTableScan")),
     "inputs LocalTableScan, Scan ExistingRDD"),
    (_Node("Scan ExistingRDD", rdd=_Rdd("ParallelCollectionRDD")), "input ParallelCollectionRDD"),
    (_Node("Project", _Node("Scan ExistingRDD", rdd=_batch_rdd([("t", 0), ("t", 0)]))), "several tasks"),
])
def test_plans_that_are_not_one_partition_per_task_are_refused(plan, says):
    with pytest.raises(JobFailed, match=says):
        source_slots.scan_partitions(_jdf(plan))


def test_the_generation_history_records_how_slots_were_derived():
    h = GenerationHistory().with_generation(0, 4, 0).with_generation(1, 4, 30, "sourcePartitions")
    assert GenerationHistory.decode(h.encode()) == h
    assert h.slots_from(0) == "key" and h.slots_from(1) == "sourcePartitions"
    assert b"slotsFrom" not in GenerationHistory().with_generation(0, 4, 0).encode()   # old records unchanged
    assert effective_generation(0, 4, h, "sourcePartitions") == 1   # re-created, same derivation: continue
    assert effective_generation(0, 4, h, "key") == 2                # another derivation: a new generation
