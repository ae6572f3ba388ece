"""Who may use the real nodes while a test stops one: a file lock shared by every test that uses them and taken
alone by a test marked ``stops_a_node``.

``make test`` runs two tests at a time (pytest-xdist). A test that stops a node's kubelet (node loss) would take
the other worker's Pods with it if they were bound to that node, and the node lifecycle controller would evict
them. Marking it ``serial`` kept it apart, but a serial test runs alone after the rest: its whole duration is
added to the run's wall time. Here the other worker goes on with everything that does not touch the real nodes
(the job-runtime e2e tests and the unit-stack, stack and chart tests that run no Pod there), and only a
real-node test waits.

The lock is held per test file, not per test: a module-scoped fixture (an operator Deployment, a stream placed
once for several tests) keeps its Pods between that file's tests, so the lock is taken before the file's first
real-node test and released after its last (``nextitem`` in another file, or none). flock(2) locks belong to the
open file, so one worker's lock is released by closing it, and a worker that dies releases it with its process.
"""
from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

EXCLUSIVE_MARK = "stops_a_node"


def uses_nodes(item) -> bool:
    """Whether the test's Pods (or its checks) run on the real nodes: the `nodes` fixture, directly or through
    another fixture (`on_nodes`, `restricted_ns`, NodePods), or the ``real_nodes`` mark."""
    return "nodes" in getattr(item, "fixturenames", ()) or item.get_closest_marker("real_nodes") is not None


class NodeLock:
    """One worker's hold on the lock: :meth:`enter` before a test's setup, :meth:`leave` after its teardown."""

    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = None
        self._file: str | None = None
        self._exclusive = False

    def enter(self, item) -> None:
        if not uses_nodes(item) and item.get_closest_marker(EXCLUSIVE_MARK) is None:
            return
        exclusive = item.get_closest_marker(EXCLUSIVE_MARK) is not None
        if self._fd is not None and self._file == str(item.fspath) and self._exclusive == exclusive:
            return   # the same file goes on under the same hold
        self.release()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        t0 = time.monotonic()
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        waited = time.monotonic() - t0
        if waited > 1:
            print(f"\n[node lock] {item.nodeid} waited {waited:.0f}s for the real nodes "
                  f"({'alone' if exclusive else 'shared'})")
        self._fd, self._file, self._exclusive = fd, str(item.fspath), exclusive

    def leave(self, item, nextitem) -> None:
        if self._fd is None:
            return
        if nextitem is not None and str(nextitem.fspath) == self._file:
            return   # the file's module fixtures may still hold Pods on the nodes
        self.release()

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)   # closing the open file drops its flock
            self._fd, self._file = None, None
