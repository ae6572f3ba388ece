"""The class-data archive option: passed to the driver's JVM only when the archive exists."""
from __future__ import annotations

import pytest

from eos_job import cds
from eos_job.session import ARCHIVE_ENV, shared_archive_options

pytestmark = pytest.mark.unit


def test_the_archive_is_mapped_only_when_it_exists(tmp_path):
    archive = tmp_path / "spark.jsa"
    assert shared_archive_options({}) == ""
    assert shared_archive_options({ARCHIVE_ENV: str(archive)}) == ""          # named, but not made yet
    archive.write_bytes(b"x")
    assert shared_archive_options({ARCHIVE_ENV: str(archive)}) == f"-XX:SharedArchiveFile={archive}"


def test_the_training_command_needs_one_file():
    assert cds.main([]) == 2
