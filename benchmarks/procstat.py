"""CPU seconds and processes of the machine, from /proc, for the benchmarks.

* ``procs()``: every process's parent, name, CPU seconds and start time;
  ``children()`` and ``tree()`` walk the parent links; ``my_tree()`` is this
  process and its descendants.
* ``machine_busy()``: busy seconds of all CPUs since boot.
* ``pod_uid()``: the Kubernetes Pod a process runs in, from its cgroup (the real nodes' Pods).
* ``foreign_processes()``: java and pytest processes that are not ours: other
  work on the shared machine, recorded next to a measurement.
* ``CpuMeter``: CPU seconds by component, sampled by a thread. A benchmark
  subclasses it with ``GROUPS`` and ``classify`` (which process belongs to
  which component) and ``delta`` (the sums it reports).

Used by the sink benchmark (``sink_meters.py``) and ``executors_run.py``.
"""
from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path

CLK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def procs() -> dict[int, tuple[int, str, float, int]]:
    """pid -> (ppid, comm, CPU seconds of the process's threads, start time)."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        rp = stat.rindex(")")
        fields = stat[rp + 2:].split()
        out[int(d)] = (int(fields[1]), stat[stat.index("(") + 1:rp],
                       (int(fields[11]) + int(fields[12])) / CLK, int(fields[19]))   # utime + stime, own threads
    return out


def machine_busy() -> float:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - (v[4] if len(v) > 4 else 0)) / CLK   # all but idle and iowait


# A kubelet puts a Pod's containers under a cgroup named after the Pod's uid: ``pod<uid>`` with '-' (cgroupfs
# driver, the stack's real nodes) or '_' (systemd driver).
POD_CGROUP = re.compile(r"pod([0-9a-f]{8}(?:[-_][0-9a-f]{4}){3}[-_][0-9a-f]{12})")


def pod_uid(pid: int) -> str | None:
    """The uid of the Pod whose cgroup holds process ``pid`` (any container of it, the sandbox's pause too); None
    for a process of no Pod, or one gone. A container's processes are not this machine's processes' children (the
    container runtime's shim is their parent), so this is how a Pod's are found."""
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None
    m = POD_CGROUP.search(text)
    return m.group(1).replace("_", "-") if m else None


def children(ps: dict[int, tuple]) -> dict[int, list[int]]:
    """ppid -> its children's pids, from ``procs()``."""
    kids: dict[int, list[int]] = {}
    for pid, (ppid, *_rest) in ps.items():
        kids.setdefault(ppid, []).append(pid)
    return kids


def tree(kids: dict[int, list[int]], root: int) -> list[int]:
    """``root`` and all its descendants."""
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def my_tree() -> set[int]:
    return set(tree(children(procs()), os.getpid()))


def foreign_processes(skip: set[int]) -> list[str]:
    """java and pytest processes on the machine but those in ``skip`` (the benchmark's own, the stack's broker):
    other engineers' tests, whose CPU disturbs the measurement."""
    out = []
    for pid, (_ppid, comm, _cpu, _st) in procs().items():
        if pid in skip:
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if comm == "java" or "pytest" in cmd:
            out.append(f"{pid} {comm} {cmd[:80]}")
    return out


class CpuMeter:
    """CPU seconds by component, from /proc, sampled every ``interval`` seconds by a thread.

    Each sample reads every process, asks ``classify`` which of them belong to which group (the others are not
    counted) and adds each one's increment since the previous sample to its group. Processes that come and go
    are counted, less their last interval; a process is known by pid and start time, so a reused pid is a new
    process. ``snapshot()`` adds ``machine``, the busy time of all CPUs, for the rest of the machine.
    Without /proc the meter does nothing and its snapshots are empty.
    """
    GROUPS: tuple[str, ...] = ()

    def __init__(self, interval: float = 0.5):
        self.ok = Path("/proc/stat").exists()
        self.totals = {g: 0.0 for g in self.GROUPS}
        self.last: dict[tuple[int, int], float] = {}
        self.lock = threading.Lock()
        self.sampling = threading.Lock()
        if self.ok:
            self._sample(baseline=True)
            threading.Thread(target=self._loop, args=(interval,), daemon=True, name="cpu-meter").start()

    def classify(self, ps: dict[int, tuple], kids: dict[int, list[int]]) -> dict[int, str]:
        """pid -> group of the processes to count, from ``procs()`` and ``children()``."""
        raise NotImplementedError

    def forget(self, key: tuple[int, int]) -> None:
        """A process (pid, start time) is gone: drop what a subclass keeps about it."""

    def _sample(self, baseline: bool = False) -> None:
        with self.sampling:
            ps = procs()
            groups = self.classify(ps, children(ps))
            with self.lock:
                seen = set()
                for pid, g in groups.items():
                    key = (pid, ps[pid][3])
                    seen.add(key)
                    cur = ps[pid][2]
                    prev = self.last.get(key)
                    if prev is None:
                        prev = cur if baseline else 0.0   # born since the last sample: all of it is new
                    self.totals[g] += max(0.0, cur - prev)
                    self.last[key] = cur
                for key in [k for k in self.last if k not in seen]:
                    del self.last[key]
                    self.forget(key)

    def _loop(self, interval: float) -> None:
        while True:
            time.sleep(interval)
            try:
                self._sample()
            except Exception:  # noqa: BLE001 - a process vanished mid-read: the next sample
                pass

    def snapshot(self) -> dict[str, float]:
        if not self.ok:
            return {}
        self._sample()
        with self.lock:
            snap = dict(self.totals)
        snap["machine"] = machine_busy()
        return snap

    @staticmethod
    def difference(a: dict, b: dict) -> dict[str, float]:
        """CPU seconds by group (and ``machine``) between two snapshots."""
        return {k: round(b[k] - a[k], 2) for k in a}
