"""The real nodes' lock (tests/harness/node_lock.py): tests that use the nodes share it, a test that stops a node
holds it alone, and a file keeps its hold from its first real-node test to its last."""
from __future__ import annotations

import threading
import time

import pytest

from tests.harness.node_lock import EXCLUSIVE_MARK, NodeLock

pytestmark = pytest.mark.unit


class Item:
    def __init__(self, path: str, *, fixtures=(), marks=()):
        self.fspath, self.fixturenames, self.marks, self.nodeid = path, list(fixtures), set(marks), path

    def get_closest_marker(self, name):
        return name if name in self.marks else None


def hold(lock, item, seconds, log, name):
    lock.enter(item)
    log.append((name, "in", time.monotonic()))
    time.sleep(seconds)
    log.append((name, "out", time.monotonic()))
    lock.leave(item, None)


def test_users_share_and_the_node_stopper_waits_for_them(tmp_path):
    path, log = tmp_path / "nodes.lock", []
    a = threading.Thread(target=hold, args=(NodeLock(path), Item("a.py", fixtures=["nodes"]), 0.6, log, "a"))
    b = threading.Thread(target=hold, args=(NodeLock(path), Item("b.py", marks=["real_nodes"]), 0.6, log, "b"))
    a.start(); b.start(); time.sleep(0.2)
    c = threading.Thread(target=hold, args=(NodeLock(path), Item("c.py", marks=[EXCLUSIVE_MARK]), 0.1, log, "c"))
    c.start()
    for t in (a, b, c):
        t.join(5)
    at = {(n, e): t for n, e, t in log}
    assert at[("b", "in")] < at[("a", "out")]                              # shared: both in at once
    assert at[("c", "in")] >= max(at[("a", "out")], at[("b", "out")])     # alone: after both left


def test_a_test_off_the_nodes_takes_nothing_and_a_file_keeps_its_hold(tmp_path):
    path = tmp_path / "nodes.lock"
    mine, other = NodeLock(path), NodeLock(path)
    mine.enter(Item("unit.py"))
    assert mine._fd is None
    first, second = Item("m.py", fixtures=["nodes"]), Item("m.py", fixtures=["nodes"])
    mine.enter(first)
    mine.leave(first, second)          # the same file next: still held
    got = threading.Event()
    t = threading.Thread(target=lambda: (other.enter(Item("x.py", marks=[EXCLUSIVE_MARK])), got.set()))
    t.start()
    assert not got.wait(0.3)
    mine.enter(second)
    mine.leave(second, Item("n.py"))   # another file next: released
    assert got.wait(5)
    other.release()
    t.join(5)
