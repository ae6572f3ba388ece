"""The driver container's memory split (eos_job.memory): the heap is what is left after Python and the JVM's
other memory, so the container's processes together stay under its limit."""
from __future__ import annotations

import pytest

from eos_job.memory import MIN_HEAP_MIB, MemorySplit, driver_split, quantity
from eos_job.spec import ExactlyOnceStreamSpec, semantic_errors
from tests.operator.fakes import base_spec

pytestmark = pytest.mark.unit


def test_quantities_in_the_specs_forms():
    assert quantity("2Gi") == 2 * 2**30 and quantity("512Mi") == 512 * 2**20 and quantity("1G") == 10**9
    assert quantity("500m") == pytest.approx(0.5) and quantity("1.5") == 1.5 and quantity("3") == 3
    with pytest.raises(ValueError, match="not a quantity"):
        quantity("2 GiB")


@pytest.mark.parametrize("memory, cpu, local, heap, python", [
    ("2Gi", "1", True, 1344, 320),      # the default: 192 for the runtime, 128 for one worker
    ("1Gi", "1", True, 320, 320),       # the old default still fits, with a small heap
    ("1Gi", "500m", True, 320, 320),    # half a CPU: still one worker
    ("8Gi", "2", True, 7040, 448),      # large: the overhead is 10 % of the heap
    ("1Gi", "1", False, 448, 192),      # cluster mode: the tasks run on executors, no worker here
])
def test_the_split_of_a_driver_container(memory, cpu, local, heap, python):
    split = driver_split(memory, cpu, local_mode=local)
    assert (split.heap_mib, split.python_mib) == (heap, python)
    assert split.fits and split.heap_mib + split.overhead_mib + split.python_mib <= split.total_mib
    assert split.spark_heap == f"{heap}m"


def test_every_size_that_fits_stays_under_its_limit_and_the_heap_uses_the_room():
    for total in range(960, 16384, 32):
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
    assert not MemorySplit(total_mib=1024, python_mib=320, overhead_mib=384, heap_mib=1024).fits


def test_a_container_too_small_for_a_driver_is_refused_naming_the_field_and_the_minimum():
    raw = base_spec()
    raw["job"]["driver"] = {"memory": "512Mi", "cpu": "1"}
    (error,) = semantic_errors(ExactlyOnceStreamSpec.model_validate(raw))
    assert error.startswith("job.driver.memory: 512Mi cannot hold a driver (local deploy mode, job.driver.cpu 1)")
    assert f"at least {MIN_HEAP_MIB + 384 + 320}Mi" in error and "set job.driver.memory to 960Mi or more" in error
    raw["job"]["driver"] = {"memory": "960Mi", "cpu": "1"}
    assert semantic_errors(ExactlyOnceStreamSpec.model_validate(raw)) == []
