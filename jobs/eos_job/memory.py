"""How a driver container's memory limit is split between the JVM heap, the JVM's other memory and Python.

The driver Pod's ``job.driver.memory`` is a hard cgroup limit: the kernel kills the container (``OOMKilled``)
when the sum of its processes passes it. Inside it live the driver JVM (heap, plus metaspace, thread stacks,
code cache, direct buffers: the *overhead*), the runtime's Python process, and in local deploy mode one
PySpark worker per core running the sink's slot tasks (a Python interpreter with pyarrow and a Kafka
producer each). A fixed heap (Spark's default ``1g``) in a ``1Gi`` container leaves the rest nothing, so a
driver under load is killed as its heap grows. Here the heap is what is left:

- Python: ``PYTHON_BASE_MIB`` for the runtime's own process, and ``PYTHON_WORKER_MIB`` for each worker (local
  mode: as many as the container's CPUs, rounded up; cluster mode: none, the tasks run on executors);
- JVM overhead: ``max(OVERHEAD_MIN_MIB, OVERHEAD_FRACTION x heap)``, the rule Spark itself uses for the
  overhead it adds to an executor's heap on Kubernetes, with a floor of 320 MiB rather than Spark's 384 so that
  the default container (1Gi, one CPU) holds the smallest heap Spark starts with;
- heap: the rest, rounded down to a multiple of 32 MiB, and never below ``MIN_HEAP_MIB``: Spark refuses to start
  when the JVM's usable heap (``Runtime.maxMemory``, about 29/30 of ``-Xmx`` with the serial collector a
  one-CPU container gets) is under 450 MiB (``INVALID_DRIVER_MEMORY``: seen on a real node with ``-Xmx320m``,
  309 MiB usable); a container too small for it is refused, naming the minimum.

The Python shares are estimates of what those processes hold (the runtime with PySpark, pyarrow and the Kafka
client imported; a worker forked from PySpark's daemon), not measurements; the heap is a ceiling the JVM grows
to, so the sum stays under the limit when it does.

The operator computes the split from the spec and passes the heap to the runtime (``DRIVER_HEAP_ENV``), which
sets ``spark.driver.memory`` from it before the JVM starts (eos_job.session).

Executor Pods (cluster deploy mode) are sized by Spark itself: their memory request and limit are
``spark.executor.memory`` (the heap) plus ``spark.executor.memoryOverhead``. The operator splits
``job.executor.memory`` the same way (no runtime process there, one PySpark worker per task slot,
``spark.executor.cores``) and passes the heap and the rest as the overhead, so the Pod's limit is the spec's
``job.executor.memory`` itself, not the heap plus Spark's own overhead on top.

The split is derived, never stored: the spec's fields (and so the operator's restart decision, which compares
specs) are the same whichever split an operator version computes for them.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

DRIVER_HEAP_ENV = "EOS_DRIVER_HEAP"
PYTHON_BASE_MIB = 160
PYTHON_WORKER_MIB = 64
OVERHEAD_MIN_MIB = 320
OVERHEAD_FRACTION = 0.10
MIN_HEAP_MIB = 480
_ROUND_MIB = 32
_MIB = 1024 * 1024
_FACTORS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
            "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "m": 10**-3}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")


def quantity(text: str) -> float:
    """A Kubernetes quantity in the spec's form (``QUANTITY_PATTERN``: ``2Gi``, ``1.5``, ``500m``) as a number."""
    found = _QUANTITY.match(text)
    if not found:
        raise ValueError(f"{text!r} is not a quantity such as 2Gi, 512Mi or 500m")
    return float(found.group(1)) * _FACTORS[found.group(2) or ""]


@dataclass(frozen=True)
class MemorySplit:
    total_mib: int
    python_mib: int
    overhead_mib: int
    heap_mib: int

    @property
    def fits(self) -> bool:
        return self.heap_mib >= MIN_HEAP_MIB and self.heap_mib + self.overhead_mib + self.python_mib <= self.total_mib

    @property
    def spark_heap(self) -> str:
        """``spark.driver.memory``'s value."""
        return f"{max(self.heap_mib, MIN_HEAP_MIB)}m"

    def minimum_total_mib(self) -> int:
        """The smallest container that fits ``MIN_HEAP_MIB`` of heap with this split's Python share."""
        return MIN_HEAP_MIB + max(OVERHEAD_MIN_MIB, math.ceil(OVERHEAD_FRACTION * MIN_HEAP_MIB)) + self.python_mib

    def describe(self) -> str:
        return (f"{self.total_mib} MiB: JVM heap {self.heap_mib} MiB, JVM overhead {self.overhead_mib} MiB, "
                f"Python {self.python_mib} MiB")


def driver_split(memory: str, cpu: str, *, local_mode: bool) -> MemorySplit:
    """The split of a driver container of ``memory`` and ``cpu`` (the spec's quantities)."""
    workers = max(1, math.ceil(quantity(cpu) - 1e-9)) if local_mode else 0
    return _split(int(quantity(memory) // _MIB), PYTHON_BASE_MIB + PYTHON_WORKER_MIB * workers)


def executor_split(memory: str, task_slots: int) -> MemorySplit:
    """The split of an executor container of ``memory`` running ``task_slots`` tasks at once (one PySpark
    worker each; no runtime process)."""
    return _split(int(quantity(memory) // _MIB), PYTHON_WORKER_MIB * max(1, task_slots))


def _split(total: int, python: int) -> MemorySplit:
    room = total - python
    heap = min(room - OVERHEAD_MIN_MIB, room * 10 // 11)     # heap + 10 % of it = room
    heap = max(0, heap // _ROUND_MIB * _ROUND_MIB)
    overhead = max(OVERHEAD_MIN_MIB, math.ceil(OVERHEAD_FRACTION * heap))
    return MemorySplit(total_mib=total, python_mib=python, overhead_mib=overhead, heap_mib=heap)


def driver_split_of(spec) -> MemorySplit:
    """The split of ``spec``'s driver container (an ExactlyOnceStreamSpec)."""
    driver = spec.job.driver
    return driver_split(driver.memory, driver.cpu, local_mode=spec.job.deploy_mode == "local")


def executor_task_slots(spec) -> int:
    """Tasks an executor runs at once: ``spark.executor.cores`` of ``job.sparkConf``, else Spark's default 1."""
    value = spec.job.spark_conf.get("spark.executor.cores", "1")
    return int(value) if value.isdigit() and int(value) > 0 else 1


def executor_split_of(spec) -> MemorySplit:
    """The split of ``spec``'s executor containers (cluster deploy mode)."""
    return executor_split(spec.job.executor.memory, executor_task_slots(spec))


EXECUTOR_MEMORY_CONF = ("spark.executor.memory", "spark.executor.memoryOverhead")


def executor_spark_conf(spec) -> dict[str, str]:
    """``spark.executor.memory`` and ``spark.executor.memoryOverhead`` (MiB) for ``spec``'s executors: together
    exactly ``job.executor.memory``, the executor Pod's limit that Spark computes from them. None when
    ``job.sparkConf`` sets either: then the sizes are the user's (Spark's defaults for the one not set)."""
    if any(key in spec.job.spark_conf for key in EXECUTOR_MEMORY_CONF):
        return {}
    split = executor_split_of(spec)
    heap = max(split.heap_mib, MIN_HEAP_MIB)
    return {"spark.executor.memory": f"{heap}m",
            "spark.executor.memoryOverhead": f"{max(split.total_mib - heap, OVERHEAD_MIN_MIB)}m"}


def driver_memory_errors(spec) -> list[str]:
    """``job.driver.memory`` (and in cluster mode ``job.executor.memory``) too small for a driver (an executor):
    the message names the minimum for this spec's CPUs and mode."""
    errors = []
    split = driver_split_of(spec)
    if not split.fits:
        mode = "local" if spec.job.deploy_mode == "local" else "cluster"
        errors.append(
            f"job.driver.memory: {spec.job.driver.memory} cannot hold a driver ({mode} deploy mode, "
            f"job.driver.cpu {spec.job.driver.cpu}): it needs at least {split.minimum_total_mib()}Mi "
            f"({MIN_HEAP_MIB} MiB of JVM heap, {OVERHEAD_MIN_MIB} MiB of JVM overhead, {split.python_mib} MiB "
            f"for Python); set job.driver.memory to {split.minimum_total_mib()}Mi or more")
    executor = executor_split_of(spec)
    user_sized = any(key in spec.job.spark_conf for key in EXECUTOR_MEMORY_CONF)
    if spec.job.deploy_mode == "cluster" and not user_sized and not executor.fits:
        errors.append(
            f"job.executor.memory: {spec.job.executor.memory} cannot hold an executor running "
            f"{executor_task_slots(spec)} task(s) at once: it needs at least {executor.minimum_total_mib()}Mi "
            f"({MIN_HEAP_MIB} MiB of JVM heap, {OVERHEAD_MIN_MIB} MiB of JVM overhead, {executor.python_mib} MiB "
            f"for Python workers); set job.executor.memory to {executor.minimum_total_mib()}Mi or more")
    return errors
