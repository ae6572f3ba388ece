"""The storage layer's local half, and how S3 locations are named (the S3 half runs against the stack's
S3 server in tests/stack/test_s3.py and tests/e2e/test_s3_checkpoint.py)."""
from pathlib import PurePosixPath

import pytest

from eos_job import storage
from eos_job.storage import Loc

pytestmark = pytest.mark.unit


def test_local_locations_behave_like_paths(tmp_path):
    root = Loc.of(f"file://{tmp_path}/ckpt")
    assert not root.exists() and root.iterdir() == [] and root.files() == []
    (root / "offsets" / "0").write_text("v1\n{}\n")
    (root / "state/0/1/1.delta").write_bytes(b"\x00\x01")
    assert root.is_dir() and (root / "offsets/0").is_file() and (root / "offsets/0").read_text() == "v1\n{}\n"
    assert root.files() == [PurePosixPath("offsets/0"), PurePosixPath("state/0/1/1.delta")]
    assert sorted(p.name for p in root.iterdir()) == ["offsets", "state"]
    assert (root / "offsets/0").size() == 6
    assert not list((tmp_path / "ckpt" / "offsets").glob(".*.tmp")), "a write leaves no temporary file"


def test_copy_unlink_and_rmtree(tmp_path):
    a, b = Loc.of(tmp_path / "a"), Loc.of(tmp_path / "b")
    (a / "x/y").write_text("1")
    (a / "x/y").copy_to(b / "deep/er/y")
    assert (b / "deep/er/y").read_text() == "1"
    (b / "deep/er/y").unlink()
    (b / "deep/er/y").unlink(missing_ok=True)
    with pytest.raises(OSError):
        (b / "deep/er/y").unlink()
    a.rmtree()
    a.rmtree()   # gone already: nothing to do
    assert not a.exists()
    with pytest.raises(FileNotFoundError):
        (a / "x/y").read_text()


def test_names_and_equality(tmp_path):
    loc = Loc.of(str(tmp_path / "s" / "snap"))
    assert loc == Loc.of(f"file://{tmp_path}/s/snap") and loc.uri == str(tmp_path / "s" / "snap")
    assert loc.with_name("snap.partial").name == "snap.partial" and loc.parent == Loc.of(tmp_path / "s")
    assert (loc / "checkpoint" / "offsets").relative_to(loc) == PurePosixPath("checkpoint/offsets")


def test_s3_locations_keep_their_scheme_and_bucket(monkeypatch):
    monkeypatch.delenv("EOS_S3_ENDPOINT", raising=False)
    storage.register_s3("eos-unit", storage.S3Options(endpoint="http://127.0.0.1:1", path_style=True))
    loc = Loc.of("s3a://eos-unit/streams/colors/") / "live"
    assert loc.is_object_store and loc.uri == "s3a://eos-unit/streams/colors/live"
    assert loc.path == "eos-unit/streams/colors/live" and loc.name == "live"
    assert Loc.of("s3://eos-unit/x") == Loc.of("s3a://eos-unit/x")
    with pytest.raises(ValueError, match="needs a bucket"):
        Loc.of("s3a:///no-bucket")


def test_unregistered_buckets_take_the_pod_environment():
    opts = storage.env_options({"EOS_S3_ENDPOINT": "http://minio:9000", "EOS_S3_PATH_STYLE": "true"})
    assert opts == storage.S3Options(endpoint="http://minio:9000", region="us-east-1", path_style=True)
    assert storage.env_options({}) == storage.S3Options()
