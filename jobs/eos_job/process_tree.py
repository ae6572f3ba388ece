"""A process and everything descending from it, SIGKILLed at once, as a container kill or a crashed node does.

What the fault hooks' driver kill (``eos_job.faults.kill_driver``) uses, and the kill of a driver run as a
local process (``examples.colors.local_run``); the tests also find a local driver's processes with ``descendants``.
(A Pod's processes on a node are found through its cgroup instead: ``tests/harness/real_nodes.py``.)
A process group alone is not enough: PySpark's daemon puts its workers in process groups of their own, and a
worker left running could go on and commit.
"""
from __future__ import annotations

import contextlib
import os
import signal

# Indirections the unit tests replace.
_killpg = os.killpg
_kill = os.kill


def kill_tree(tree: list[int], groups: set[int] = frozenset()) -> None:
    """SIGKILL the processes ``tree`` (``descendants``), their process groups and ``groups``; the calling
    process and its group last (its group only if named, or if the process is in ``tree``)."""
    me, mine = os.getpid(), os.getpgrp()
    groups = set(groups)
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            group = os.getpgid(pid)
            if group != mine or me in tree:
                groups.add(group)
    for pid in tree:
        if pid != me:
            with contextlib.suppress(ProcessLookupError):
                _kill(pid, signal.SIGKILL)
    for group in sorted(groups, key=lambda g: g == mine):     # our own group last: it holds this process
        with contextlib.suppress(ProcessLookupError):
            _killpg(group, signal.SIGKILL)
    if me in tree:
        _kill(me, signal.SIGKILL)


def descendants(root: int) -> list[int]:
    """``root`` and every process descending from it, parents before children (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])   # the name in parentheses may hold spaces
        children.setdefault(ppid, []).append(int(entry))
    if not os.path.exists(f"/proc/{root}"):
        return []
    order, i = [root], 0
    while i < len(order):
        order.extend(sorted(children.get(order[i], [])))
        i += 1
    return order
