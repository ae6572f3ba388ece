"""The order the real-stack tiers run in (tests/conftest.py): every end-to-end file is placed, longest first
(``E2E_LONG_FIRST``, measured) or with the rest (``E2E_SHORT``), so a new or renamed file cannot drop out of the
measured order unnoticed, and the sort puts the longest files first."""
from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import conftest

E2E = conftest.REPO / "tests" / "e2e"


def e2e_tier_files() -> set[str]:
    """The test files of the e2e tier (the chaos tier's test_chaos*.py are a tier of their own)."""
    return {p.name for p in E2E.glob("test_*.py") if conftest.tier_of(item(p.name)) == "e2e"}


def item(name: str, folder: Path = E2E) -> SimpleNamespace:
    return SimpleNamespace(fspath=folder / name, fixturenames=())


def test_every_e2e_file_is_placed_once():
    files, long, short = e2e_tier_files(), list(conftest.E2E_LONG_FIRST), conftest.E2E_SHORT
    assert len(files) > len(long), files
    unplaced = sorted(files - set(long) - short)
    assert not unplaced, (f"{unplaced}: add each to tests/conftest.py, E2E_LONG_FIRST at the rank of its seconds in "
                          "the last measured run (docs/measurements.md), or E2E_SHORT")
    stale = sorted((set(long) | short) - files)
    assert not stale, f"{stale}: named in tests/conftest.py but no e2e file of that name (renamed? moved?)"
    assert len(set(long)) == len(long) and not set(long) & short, "a file named twice"


def test_the_longest_e2e_files_run_first_in_their_measured_order():
    names = sorted(e2e_tier_files())
    unit = item("test_protocol.py", conftest.REPO / "tests" / "jobs")
    items = [item(n) for n in names] + [item("test_chaos.py"), unit]
    random.Random(9).shuffle(items)
    ordered = [Path(str(i.fspath)).name for i in sorted(items, key=conftest.run_order)]
    assert ordered[:2] == ["test_protocol.py", "test_chaos.py"]   # the unit tier, then the chaos tier
    e2e = ordered[2:]
    assert e2e[:len(conftest.E2E_LONG_FIRST)] == list(conftest.E2E_LONG_FIRST)
    assert set(e2e[len(conftest.E2E_LONG_FIRST):]) == conftest.E2E_SHORT


@pytest.mark.parametrize("name", ["test_chaos.py", "test_chaos_lifecycle.py"])
def test_the_chaos_files_are_a_tier_of_their_own(name):
    assert conftest.tier_of(item(name)) == "chaos" and name not in e2e_tier_files()
