"""A real S3-compatible object store: the MinIO server, single node, single drive.

The server is built once with ``go install`` from the Go module proxy (pinned
pseudo-version) into ``<cache>/bin/minio-<version>/minio``. Its data, the root
credentials (generated once, kept in ``<state>/s3/credentials.json``, never
logged) and the port (chosen once, kept in ``<state>/s3/ports.json``) live under
``<state>/s3``, so a stopped server comes back at the same address with the same
objects: tests and chaos helpers (:func:`stop_server`, :func:`start_server`,
:func:`restart`) rely on that. ``up`` also creates the bucket :data:`BUCKET`.
It listens on 127.0.0.1 only; the web console is off.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

from .common import Stack, StackError, free_port, log, port_open
from .go_build import go_install

MODULE = "github.com/minio/minio"
VERSION = "v0.0.0-20260212201848-7aac2a2c5b7c"  # master of 2026-02-12 (MinIO publishes no tagged module versions)
NAME = "s3"
BUCKET = "eos"
REGION = "us-east-1"
START_TIMEOUT = 90.0  # first start formats the drive; two busy cores
STOP_GRACE = 20.0
ENV_KEYS = ["S3_ENDPOINT", "S3_ACCESS_KEY", "S3_SECRET_KEY", "S3_BUCKET", "S3_REGION"]


# -- binary --------------------------------------------------------------------
def minio_bin(st: Stack) -> Path:
    return st.cache / "bin" / f"minio-{VERSION}" / "minio"


def ensure_binary(st: Stack) -> Path:
    return go_install(st, minio_bin(st), f"{MODULE}@{VERSION}", what="s3",
                      estimate="a cold build takes about 3 minutes on 2 cores")


# -- state ---------------------------------------------------------------------
def home(st: Stack) -> Path:
    return st.dir("s3")


def data_dir(st: Stack) -> Path:
    return home(st) / "data"


def port(st: Stack) -> int:
    """The S3 API port: chosen once, then persisted (a restarted server keeps its address)."""
    pf = home(st) / "ports.json"
    if pf.exists():
        return int(json.loads(pf.read_text())["api"])
    chosen = free_port()
    pf.write_text(json.dumps({"api": chosen}))
    return chosen


def endpoint(st: Stack) -> str:
    return f"http://127.0.0.1:{port(st)}"


def credentials(st: Stack) -> dict[str, str]:
    """The root access and secret key: generated once, readable by the owner only."""
    cf = home(st) / "credentials.json"
    if cf.exists():
        return json.loads(cf.read_text())
    creds = {"access_key": f"eos{secrets.token_hex(8)}", "secret_key": secrets.token_urlsafe(30)}
    tmp = cf.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(creds, f)
    tmp.replace(cf)
    return creds


def connection_env(st: Stack) -> dict[str, str]:
    creds = credentials(st)
    return {"S3_ENDPOINT": endpoint(st), "S3_ACCESS_KEY": creds["access_key"],
            "S3_SECRET_KEY": creds["secret_key"], "S3_BUCKET": BUCKET, "S3_REGION": REGION}


def filesystem(st: Stack):
    """A ``pyarrow.fs.S3FileSystem`` on the server with the root credentials."""
    try:
        from pyarrow import fs
    except ImportError:
        raise StackError("pyarrow is not installed in this Python environment; run `make venv` "
                         "and use .venv/bin/python") from None
    creds = credentials(st)
    return fs.S3FileSystem(access_key=creds["access_key"], secret_key=creds["secret_key"],
                           endpoint_override=f"127.0.0.1:{port(st)}", scheme="http", region=REGION,
                           connect_timeout=5, request_timeout=30, allow_bucket_creation=True)


# -- readiness -----------------------------------------------------------------
def answers(st: Stack) -> bool:
    """MinIO's unauthenticated readiness probe says 200 once the drive is online, but after a SIGKILL the object
    layer may still answer 503 ``XMinioServerNotInitialized`` (seen in CI: a listing right after the restart
    failed). So an anonymous listing of the bucket must also be refused (403) or answered, not 503."""
    try:
        with urllib.request.urlopen(f"{endpoint(st)}/minio/health/ready", timeout=3) as resp:
            if resp.status != 200:
                return False
        with urllib.request.urlopen(f"{endpoint(st)}/{BUCKET}?list-type=2&max-keys=1", timeout=3):
            return True
    except urllib.error.HTTPError as err:
        return err.code != 503           # 403/404: the object layer answers; 503: not initialised yet
    except (urllib.error.URLError, OSError):
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (ProcessLookupError, PermissionError, OSError):
        return False


def wait_ready(st: Stack, pid: int, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            _reap(pid)
            raise StackError(f"the MinIO server exited during start-up; {st.state}/logs/{NAME}.log ends with:\n"
                             f"{st.log_tail(NAME, 40)}")
        if answers(st):
            return
        time.sleep(0.3)
    raise StackError(f"timed out after {timeout:.0f}s waiting for MinIO at {endpoint(st)}/minio/health/ready\n"
                     f"{st.log_tail(NAME, 40)}")


def ensure_bucket(st: Stack) -> None:
    s3 = filesystem(st)
    from pyarrow import fs as pafs
    try:
        info = s3.get_file_info(BUCKET)
        if info.type == pafs.FileType.NotFound:
            s3.create_dir(BUCKET)
            log(f"s3: created bucket {BUCKET}")
        elif info.type != pafs.FileType.Directory:
            raise StackError(f"s3: {BUCKET} exists but is not a bucket ({info})")
    except OSError as exc:
        raise StackError(f"s3: the server at {endpoint(st)} answers but refused the stack's credentials or "
                         f"the bucket request ({exc}); `python -m eos_stack down s3 --purge` starts afresh") from exc


# -- lifecycle -----------------------------------------------------------------
def start_server(st: Stack) -> int:
    """Start the server on its kept port and data (reuse it if it runs); wait until it answers."""
    pid = st.running_pid(NAME)
    if pid is not None:
        wait_ready(st, pid)
        return pid
    exe = ensure_binary(st)
    p = port(st)
    deadline = time.monotonic() + 15  # a just-stopped server may hold its socket a moment longer
    while port_open(p) and time.monotonic() < deadline:
        time.sleep(0.2)
    if port_open(p):
        raise StackError(f"the S3 port {p} (kept in {home(st)}/ports.json) is in use by another program; "
                         "stop it, or `python -m eos_stack down s3 --purge` to choose a new port")
    creds = credentials(st)
    data_dir(st).mkdir(parents=True, exist_ok=True)
    certs = home(st) / "certs"
    certs.mkdir(exist_ok=True)
    env = {"MINIO_ROOT_USER": creds["access_key"], "MINIO_ROOT_PASSWORD": creds["secret_key"],
           "MINIO_BROWSER": "off", "MINIO_UPDATE": "off", "MINIO_REGION": REGION,
           "HOME": str(home(st))}
    t0 = time.monotonic()
    # --anonymous keeps credentials out of the log.
    pid = st.start_daemon(NAME, [str(exe), "server", "--anonymous", "--address", f"127.0.0.1:{p}",
                                 "--certs-dir", str(certs), str(data_dir(st))],
                          env=env, cwd=home(st), marker=str(data_dir(st)))
    log(f"MinIO starting (pid {pid}) at {endpoint(st)}")
    wait_ready(st, pid)
    log(f"MinIO answered after {time.monotonic() - t0:.1f}s")
    return pid


def stop_server(st: Stack, *, kill: bool = False) -> None:
    """Stop the server (SIGTERM, then SIGKILL after the grace; ``kill=True``: SIGKILL at once).
    Port, credentials and data stay: :func:`start_server` brings the same store back."""
    pid = st.running_pid(NAME)
    if pid is None:
        st.pidfile(NAME).unlink(missing_ok=True)
        return
    if kill:
        log(f"killing MinIO (pid {pid}) with SIGKILL")
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and st.running_pid(NAME) is not None:
            _reap(pid)
            time.sleep(0.1)
        st.pidfile(NAME).unlink(missing_ok=True)
    else:
        st.stop_daemon(NAME, grace=STOP_GRACE)
    _reap(pid)


def restart(st: Stack) -> None:
    stop_server(st)
    start_server(st)


def up(st: Stack) -> dict[str, str]:
    ensure_binary(st)
    start_server(st)
    ensure_bucket(st)
    return connection_env(st)


def down(st: Stack, purge: bool = False) -> None:
    stop_server(st)
    if purge:
        shutil.rmtree(st.state / "s3", ignore_errors=True)
        st.drop_env(ENV_KEYS)


def status(st: Stack) -> tuple[str, str]:
    exe = minio_bin(st)
    if not os.access(exe, os.X_OK):
        return "missing", f"{exe} not built yet (`up s3` builds it)"
    pid = st.running_pid(NAME)
    if pid is None:
        return "stopped", f"MinIO {VERSION}" + (" (data kept)" if data_dir(st).is_dir() else "")
    if not answers(st):
        return "stopped", f"pid {pid} alive but {endpoint(st)} is not ready (starting?)"
    return "running", f"MinIO at {endpoint(st)}, bucket {BUCKET} (pid {pid})"


def _reap(pid: int) -> None:
    """Collect the exit status if the server is our own child, so stopped servers do not linger as zombies."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
