"""The driver container's memory split (eos_job.memory): the heap is what is left after Python and the JVM's
other memory, so the container's processes together stay under its limit."""
from __future__ import annotations

import pytest

from eos_job.memory import (MIN_HEAP_MIB, MemorySplit, driver_split, executor_spark_conf, executor_split,
                            quantity)
from eos_job.spec import ExactlyOnceStreamSpec, semantic_errors
from tests.operator.fakes import base_spec

pytestmark = pytest.mark.unit


def test_quantities_in_the_specs_forms():
    assert quantity("2Gi") == 2 * 2**30 and quantity("512Mi") == 512 * 2**20 and quantity("1G") == 10**9
    assert quantity("500m") == pytest.approx(0.5) and quantity("1.5") == 1.5 and quantity("3") == 3
    with pytest.raises(ValueError, match="not a quantity"):
        quantity("2 GiB")


@pytest.mark.parametrize("memory, cpu, local, heap, python", [
    ("1Gi", "1", True, 480, 224),       # the default: 160 for the runtime, 64 for one worker; Spark's minimum heap
    ("2Gi", "1", True, 1504, 224),
    ("1Gi", "500m", True, 480, 224),    # half a CPU: still one worker
    ("8Gi", "2", True, 7168, 288),      # large: the overhead is 10 % of the heap
    ("1Gi", "1", False, 544, 160),      # cluster mode: the tasks run on executors, no worker here
])
def test_the_split_of_a_driver_container(memory, cpu, local, heap, python):
    split = driver_split(memory, cpu, local_mode=local)
    assert (split.heap_mib, split.python_mib) == (heap, python) and heap >= MIN_HEAP_MIB
    assert split.fits and split.heap_mib + split.overhead_mib + split.python_mib <= split.total_mib
    assert split.spark_heap == f"{heap}m"


def test_every_size_that_fits_stays_under_its_limit_and_the_heap_uses_the_room():
    for total in range(512, 16384, 32):
        for cpu in ("1", "2", "4"):
            split = driver_split(f"{total}Mi", cpu, local_mode=True)
            if not split.fits:
                assert total < split.minimum_total_mib()
                continue
            used = split.heap_mib + split.overhead_mib + split.python_mib
            assert used <= total, split
            assert total - used < 32 * 1.1 + 1, f"{total - used} MiB left unused: {split}"


def test_spark_s_fixed_default_heap_in_the_old_default_container_does_not_fit():
    """What the split replaces: a 1g heap in a 1Gi container leaves Python and the JVM's overhead nothing,
    and the kernel kills the driver as its heap grows."""
    assert not MemorySplit(total_mib=1024, python_mib=224, overhead_mib=320, heap_mib=1024).fits


def test_no_heap_under_spark_s_minimum():
    """Spark refuses a driver whose usable heap (about 29/30 of -Xmx with the serial collector) is under
    450 MiB (INVALID_DRIVER_MEMORY, seen on a real node with -Xmx320m): no split that fits goes under it."""
    assert MIN_HEAP_MIB * 29 / 30 >= 450
    for total in range(512, 4096, 16):
        for cpu in ("1", "2"):
            split = driver_split(f"{total}Mi", cpu, local_mode=True)
            assert not split.fits or split.heap_mib >= MIN_HEAP_MIB, split


def test_a_container_too_small_for_a_driver_is_refused_naming_the_field_and_the_minimum():
    raw = base_spec()
    raw["job"]["driver"] = {"memory": "512Mi", "cpu": "1"}
    (error,) = semantic_errors(ExactlyOnceStreamSpec.model_validate(raw))
    assert error.startswith("job.driver.memory: 512Mi cannot hold a driver (local deploy mode, job.driver.cpu 1)")
    assert f"at least {MIN_HEAP_MIB + 320 + 224}Mi" in error and "set job.driver.memory to 1024Mi or more" in error
    raw["job"]["driver"] = {"memory": "1Gi", "cpu": "2"}     # a second worker: 64 MiB more
    (error,) = semantic_errors(ExactlyOnceStreamSpec.model_validate(raw))
    assert "set job.driver.memory to 1088Mi or more" in error
    raw["job"]["driver"] = {"memory": "1Gi", "cpu": "1"}     # the default fits
    assert semantic_errors(ExactlyOnceStreamSpec.model_validate(raw)) == []


def _cluster(executor: dict, spark_conf: dict | None = None) -> ExactlyOnceStreamSpec:
    raw = base_spec()
    raw["job"].update({"deployMode": "cluster", "executor": executor, "sparkConf": spark_conf or {}})
    return ExactlyOnceStreamSpec.model_validate(raw)


@pytest.mark.parametrize("memory, slots, heap", [
    ("1Gi", 1, 640),      # the default executor: 64 MiB for its one worker, 320 of JVM overhead
    ("4Gi", 1, 3648),
    ("4Gi", 4, 3488),     # spark.executor.cores 4: four workers at once
    ("864Mi", 1, 480),    # the smallest that fits
])
def test_an_executor_s_heap_and_overhead_add_up_to_its_container(memory, slots, heap):
    """Spark sizes an executor Pod's memory request and limit as spark.executor.memory plus
    spark.executor.memoryOverhead: the operator's pair adds up to job.executor.memory, the heap leaving room
    for the JVM's overhead and the Python workers."""
    split = executor_split(memory, slots)
    assert split.fits and split.heap_mib == heap and split.python_mib == 64 * slots
    conf = executor_spark_conf(_cluster({"memory": memory}, {"spark.executor.cores": str(slots)}))
    assert conf["spark.executor.memory"] == f"{heap}m"
    overhead = int(conf["spark.executor.memoryOverhead"].removesuffix("m"))
    assert heap + overhead == split.total_mib == quantity(memory) // 2**20
    assert overhead >= split.overhead_mib + split.python_mib


def test_every_executor_size_that_fits_is_exactly_its_limit():
    for total in range(512, 16384, 32):
        for slots in ("1", "2", "4"):
            spec = _cluster({"memory": f"{total}Mi"}, {"spark.executor.cores": slots})
            split = executor_split(f"{total}Mi", int(slots))
            if not split.fits:
                assert total < split.minimum_total_mib() and semantic_errors(spec)
                continue
            conf = executor_spark_conf(spec)
            assert sum(int(conf[k].removesuffix("m")) for k in conf) == total, (total, slots, conf)


def test_an_executor_sized_by_the_user_s_spark_conf_is_left_as_the_user_set_it():
    """spark.executor.memory or spark.executor.memoryOverhead in job.sparkConf: the operator sets neither, and
    does not refuse a job.executor.memory it no longer uses."""
    assert executor_spark_conf(_cluster({"memory": "1Gi"}, {"spark.executor.memory": "3g"})) == {}
    assert executor_spark_conf(_cluster({"memory": "1Gi"}, {"spark.executor.memoryOverhead": "1g"})) == {}
    assert semantic_errors(_cluster({"memory": "512Mi"}, {"spark.executor.memory": "3g"})) == []


def test_an_executor_too_small_is_refused_in_cluster_mode_naming_the_field_and_the_minimum():
    (error,) = semantic_errors(_cluster({"memory": "512Mi"}))
    assert error.startswith("job.executor.memory: 512Mi cannot hold an executor running 1 task(s) at once")
    assert "set job.executor.memory to 864Mi or more" in error
    (error,) = semantic_errors(_cluster({"memory": "864Mi"}, {"spark.executor.cores": "4"}))
    assert "set job.executor.memory to 1056Mi or more" in error
    # Local deploy mode runs no executor Pod: its executor fields are not used, so not refused.
    raw = base_spec()
    raw["job"]["executor"] = {"memory": "512Mi"}
    assert semantic_errors(ExactlyOnceStreamSpec.model_validate(raw)) == []
