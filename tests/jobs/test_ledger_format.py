"""The batch-complete record's runtime version (amendment A3): written by this runtime, optional, and dropped by
the readers of the previous build, so a runtime or operator one version older reads a ledger this one wrote."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from eos_job import __version__
from eos_job.ledger_format import BatchCompleteRecord

REPO = Path(__file__).resolve().parents[2]
# A build before amendment A3 (the upgrade e2e's previous build today): it stays here when that one moves on.
BEFORE_A3 = "a4d14b56fcac2045e6c37e83abf9de173e7e69d7"

RECORD = BatchCompleteRecord(7, 2, 120, 1, 3, {"events": {"0": 40, "1": 41}}, 1, 4, runtime_version=__version__)


def test_the_version_round_trips_and_is_left_out_when_unknown():
    assert BatchCompleteRecord.decode(RECORD.encode()) == RECORD
    assert json.loads(RECORD.encode())["runtime_version"] == __version__
    unknown = BatchCompleteRecord(7, 2, 120, 1)
    assert "runtime_version" not in json.loads(unknown.encode())
    assert "kind" not in json.loads(RECORD.encode())   # still a batch-complete record to every reader of partition 0


def test_a_record_of_an_older_runtime_has_no_version():
    older = b'{"batch": 7, "count": 120, "dead_letters": 0, "nondeterministic_slots": 0, ' \
            b'"nondeterministic_slots_total": 0, "skipped_slots": 1, "slots": 2, "source_offsets": {}}'
    assert BatchCompleteRecord.decode(older).runtime_version is None


def previous_protocol(tmp_path: Path):
    """The previous build's ``eos_job/protocol.py`` (where its BatchCompleteRecord lived), imported alone: it
    needs only the standard library and numpy."""
    got = subprocess.run(["git", "-C", str(REPO), "show", f"{BEFORE_A3}:jobs/eos_job/protocol.py"],
                         capture_output=True)
    if got.returncode != 0:
        pytest.fail(f"git show {BEFORE_A3[:12]} failed ({got.stderr.decode().strip()}): this test needs the "
                    "repository's git history; run it in a full clone (git fetch --unshallow)")
    path = tmp_path / "previous_protocol.py"
    path.write_bytes(got.stdout)
    spec = importlib.util.spec_from_file_location("previous_protocol", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_the_previous_build_reads_a_record_this_one_wrote(tmp_path):
    old = previous_protocol(tmp_path).BatchCompleteRecord
    assert "runtime_version" not in old.__dataclass_fields__   # it is the build before the field
    read = old.decode(RECORD.encode())
    assert (read.batch, read.slots, read.count, read.skipped_slots, read.dead_letters, read.source_offsets,
            read.nondeterministic_slots, read.nondeterministic_slots_total) == (7, 2, 120, 1, 3,
                                                                                 {"events": {"0": 40, "1": 41}}, 1, 4)
