"""The local S3 server (MinIO) and the S3A jars the stack provides.

Against the real server ``eos_stack`` runs: it checks credentials, stores, lists,
copies and deletes objects, and keeps them (at the same address) across a stop
and start (of a server started the same way for that test alone, ``private_s3``:
the stack's serves the tests running beside it). The S3A jars: ``test_s3a_jars.py``.
"""
from __future__ import annotations

import urllib.request
import uuid

import pytest
from pyarrow import fs as pafs

from eos_stack import s3

S3_KEYS = ("S3_ENDPOINT", "S3_ACCESS_KEY", "S3_SECRET_KEY", "S3_BUCKET", "S3_REGION")


@pytest.fixture(scope="module")
def env(stack_env) -> dict[str, str]:
    missing = [k for k in (*S3_KEYS, "SPARK_S3_JARS") if not stack_env.get(k)]
    if missing:
        pytest.fail(f"the local stack started but .stack/env has no {', '.join(missing)}", pytrace=False)
    return stack_env


def s3fs(env: dict[str, str], *, access_key: str | None = None, secret_key: str | None = None,
         attempts: int = 3) -> pafs.S3FileSystem:
    return pafs.S3FileSystem(access_key=access_key or env["S3_ACCESS_KEY"],
                             secret_key=secret_key or env["S3_SECRET_KEY"],
                             endpoint_override=env["S3_ENDPOINT"].removeprefix("http://"), scheme="http",
                             region=env["S3_REGION"], connect_timeout=3, request_timeout=10,
                             retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=attempts))


@pytest.fixture
def fs(env) -> pafs.S3FileSystem:
    return s3fs(env)


@pytest.fixture
def prefix(env, fs):
    """A fresh key prefix in the stack's bucket, emptied afterwards."""
    p = f"{env['S3_BUCKET']}/test-s3-{uuid.uuid4().hex[:10]}"
    yield p
    if fs.get_file_info(p).type != pafs.FileType.NotFound:
        fs.delete_dir(p)  # the objects and the directory markers pyarrow leaves when a "folder" empties


def put(fs: pafs.S3FileSystem, path: str, data: bytes) -> None:
    with fs.open_output_stream(path) as out:
        out.write(data)


def get(fs: pafs.S3FileSystem, path: str) -> bytes:
    with fs.open_input_stream(path) as f:
        return f.read()


def test_server_answers_with_the_stack_credentials(env, fs):
    assert env["S3_ENDPOINT"].startswith("http://127.0.0.1:"), env["S3_ENDPOINT"]
    with urllib.request.urlopen(f"{env['S3_ENDPOINT']}/minio/health/ready", timeout=10) as resp:
        assert resp.status == 200
    info = fs.get_file_info(env["S3_BUCKET"])
    assert info.type == pafs.FileType.Directory, info
    fs.get_file_info(pafs.FileSelector(env["S3_BUCKET"], recursive=False))  # an authenticated ListObjects


@pytest.mark.parametrize("which,code", [("secret", "SIGNATURE_DOES_NOT_MATCH"), ("access", "INVALID_ACCESS_KEY_ID")])
def test_wrong_credentials_are_refused(env, fs, prefix, which, code):
    put(fs, f"{prefix}/kept", b"x")
    wrong = s3fs(env, attempts=1, **({"secret_key": env["S3_SECRET_KEY"] + "x"} if which == "secret"
                                     else {"access_key": "nobody" + uuid.uuid4().hex[:8]}))
    with pytest.raises(OSError, match="ACCESS_DENIED during HeadObject"):  # a HEAD answer has no body: 403 only
        get(wrong, f"{prefix}/kept")
    with pytest.raises(OSError, match=f"{code} during CreateMultipartUpload"):
        put(wrong, f"{prefix}/intruder", b"y")
    with pytest.raises(OSError, match=f"{code} during ListObjectsV2"):
        wrong.get_file_info(pafs.FileSelector(prefix))
    assert fs.get_file_info(f"{prefix}/intruder").type == pafs.FileType.NotFound
    assert get(fs, f"{prefix}/kept") == b"x"


def test_put_get_list_delete(fs, prefix):
    objects = {f"{prefix}/a.txt": b"alpha", f"{prefix}/dir/b.bin": bytes(range(256)) * 4096,  # 1 MiB
               f"{prefix}/dir/c.txt": b""}
    for path, data in objects.items():
        put(fs, path, data)
    for path, data in objects.items():
        assert get(fs, path) == data

    listed = {i.path: i.size for i in fs.get_file_info(pafs.FileSelector(prefix, recursive=True))
              if i.type == pafs.FileType.File}
    assert listed == {p: len(d) for p, d in objects.items()}
    top = {i.path: i.type for i in fs.get_file_info(pafs.FileSelector(prefix, recursive=False))}
    assert top == {f"{prefix}/a.txt": pafs.FileType.File, f"{prefix}/dir": pafs.FileType.Directory}

    put(fs, f"{prefix}/a.txt", b"overwritten")
    assert get(fs, f"{prefix}/a.txt") == b"overwritten"

    fs.delete_file(f"{prefix}/a.txt")
    assert fs.get_file_info(f"{prefix}/a.txt").type == pafs.FileType.NotFound
    with pytest.raises(FileNotFoundError):
        get(fs, f"{prefix}/a.txt")
    fs.delete_dir_contents(prefix)
    assert [i for i in fs.get_file_info(pafs.FileSelector(prefix, recursive=True, allow_not_found=True))
            if i.type == pafs.FileType.File] == []


def test_server_side_copy(fs, prefix):
    data = uuid.uuid4().bytes * 1000
    put(fs, f"{prefix}/src", data)
    fs.copy_file(f"{prefix}/src", f"{prefix}/copy/dst")
    assert get(fs, f"{prefix}/copy/dst") == data
    assert get(fs, f"{prefix}/src") == data  # a copy, not a move
    fs.move(f"{prefix}/src", f"{prefix}/moved")  # S3 has no rename: copy and delete
    assert get(fs, f"{prefix}/moved") == data
    assert fs.get_file_info(f"{prefix}/src").type == pafs.FileType.NotFound


@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "sigkill"])
def test_stop_and_start_keep_address_and_data(private_s3, kill):
    st, env = private_s3.stack, private_s3.env
    fs = s3fs(env)
    prefix = f"{env['S3_BUCKET']}/test-s3-{uuid.uuid4().hex[:10]}"
    data = uuid.uuid4().bytes * 64
    put(fs, f"{prefix}/durable", data)
    endpoint = s3.endpoint(st)
    assert endpoint == env["S3_ENDPOINT"]
    try:
        s3.stop_server(st, kill=kill)
        assert s3.status(st)[0] == "stopped"
        assert not s3.answers(st)
        with pytest.raises(OSError):
            get(s3fs(env, attempts=1), f"{prefix}/durable")
    finally:
        s3.start_server(st)
    assert s3.endpoint(st) == endpoint
    assert s3.status(st)[0] == "running"
    assert get(fs, f"{prefix}/durable") == data  # the client made before the stop works again
    assert get(s3fs(env), f"{prefix}/durable") == data
    assert fs.get_file_info(env["S3_BUCKET"]).type == pafs.FileType.Directory
