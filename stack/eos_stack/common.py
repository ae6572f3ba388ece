"""Shared plumbing of the local stack: folders, tools, daemons, the env file.

Everything downloaded or built lives under one cache folder (``EOS_CACHE``,
default ``~/.cache/eos``) so a second run on the same machine is fast; the
running servers' data, logs and pid files live under one state folder
(``EOS_STATE``, default ``<repo>/.stack``), which ``stack-down --purge`` removes.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


class StackError(RuntimeError):
    """A stack part could not start; the message says what to do next."""


def log(msg: str) -> None:
    print(f"[stack] {msg}", file=sys.stderr, flush=True)


@dataclass
class Stack:
    cache: Path = field(default_factory=lambda: Path(os.environ.get("EOS_CACHE", Path.home() / ".cache" / "eos")))
    state: Path = field(default_factory=lambda: Path(os.environ.get("EOS_STATE", REPO / ".stack")))

    def __post_init__(self) -> None:
        self.cache = Path(self.cache).resolve()
        self.state = Path(self.state).resolve()
        self.cache.mkdir(parents=True, exist_ok=True)
        self.state.mkdir(parents=True, exist_ok=True)

    @property
    def env_file(self) -> Path:
        return self.state / "env"

    def dir(self, *parts: str) -> Path:
        p = self.state.joinpath(*parts)
        p.mkdir(parents=True, exist_ok=True)
        return p

    def cache_dir(self, *parts: str) -> Path:
        p = self.cache.joinpath(*parts)
        p.mkdir(parents=True, exist_ok=True)
        return p

    # -- env file -----------------------------------------------------------
    def read_env(self) -> dict[str, str]:
        return read_env_file(self.env_file)

    def update_env(self, values: dict[str, str]) -> None:
        env = self.read_env()
        env.update(values)
        tmp = self.env_file.with_suffix(".tmp")
        tmp.write_text("".join(f"{k}={v}\n" for k, v in sorted(env.items())))
        tmp.replace(self.env_file)

    def drop_env(self, keys: list[str]) -> None:
        env = self.read_env()
        for k in keys:
            env.pop(k, None)
        self.env_file.write_text("".join(f"{k}={v}\n" for k, v in sorted(env.items())))

    # -- daemons ------------------------------------------------------------
    def pidfile(self, name: str) -> Path:
        return self.dir("run") / f"{name}.pid"

    def running_pid(self, name: str) -> int | None:
        """The pid of daemon ``name`` if its recorded process is still alive."""
        pf = self.pidfile(name)
        if not pf.exists():
            return None
        try:
            pid = int(pf.read_text().strip())
            os.kill(pid, 0)
        except (ValueError, ProcessLookupError, PermissionError):
            return None
        # A recycled pid belongs to another program: check it is ours.
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return None
        marker = (self.dir("run") / f"{name}.marker")
        if marker.exists() and marker.read_text().encode() not in cmdline:
            return None
        if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            return None
        return pid

    def start_daemon(self, name: str, argv: list[str], *, env: dict[str, str] | None = None,
                     cwd: Path | None = None, marker: str | None = None) -> int:
        logf = self.dir("logs") / f"{name}.log"
        out = open(logf, "ab")
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            cwd=str(cwd) if cwd else None, env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        self.pidfile(name).write_text(str(proc.pid))
        (self.dir("run") / f"{name}.marker").write_text(marker or argv[0])
        return proc.pid

    def stop_daemon(self, name: str, *, grace: float = 20.0) -> bool:
        """SIGTERM, wait up to ``grace`` seconds for a clean shutdown, then SIGKILL."""
        pid = self.running_pid(name)
        if pid is None:
            self.pidfile(name).unlink(missing_ok=True)
            return False
        log(f"stopping {name} (pid {pid})")
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and self.running_pid(name) is not None:
            time.sleep(0.2)
        if self.running_pid(name) is not None:
            log(f"{name} did not stop within {grace:.0f}s, sending SIGKILL")
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.pidfile(name).unlink(missing_ok=True)
        return True

    def log_tail(self, name: str, lines: int = 30) -> str:
        logf = self.state / "logs" / f"{name}.log"
        if not logf.exists():
            return "(no log)"
        return "\n".join(logf.read_text(errors="replace").splitlines()[-lines:])


def read_env_file(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if "=" in line and not line.startswith("#"):
                k, v = line.split("=", 1)
                env[k.strip()] = v.strip()
    return env


def require_tool(name: str, hint: str) -> str:
    path = shutil.which(name)
    if not path:
        raise StackError(f"'{name}' was not found on PATH. {hint}")
    return path


def write_if_changed(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` unless it holds it already, atomically (a file beside it renamed over it): a
    daemon that watches the file never reads it half written. containerd reloads its CNI configuration on every
    write to it, and a reload that reads a truncated file drops the node's networks until the next one. True
    when written."""
    try:
        if path.read_text() == text:
            return False
    except FileNotFoundError:
        pass
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def keep_newest(paths, keep: int = 3, mtime=lambda p: p.stat().st_mtime) -> None:
    """Delete all but the ``keep`` newest (by ``mtime``) of ``paths``, files or folders: builds the cache holds
    one of per input (another clone, another source change) and keeps only a few of."""
    for old in sorted(paths, key=mtime, reverse=True)[keep:]:
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)


def stop_process(proc: "subprocess.Popen | None", grace: float = 20) -> None:
    """SIGTERM ``proc`` if it still runs, SIGKILL it after ``grace`` seconds; reaped either way."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def http_ok(url: str, timeout: float = 3) -> bool:
    """``GET url`` answers 200 (a health or readiness endpoint); False while it refuses, fails or is not up."""
    import urllib.request
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status == 200
    except Exception:  # noqa: BLE001 - not up yet
        return False


def poll(check, timeout: float, *, interval: float = 0.5, before=None):
    """Call ``check()`` until it returns a truthy value or ``timeout`` seconds pass.

    Returns ``(value, None)``, or ``(None, last exception or None)`` at the deadline; an exception
    of ``check`` is retried. ``before()`` runs ahead of every try and may raise to give up early.
    """
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        if before is not None:
            before()
        try:
            value = check()
            if value:
                return value, None
        except Exception as exc:  # noqa: BLE001 - reported by the caller if it never succeeds
            last_exc = exc
        time.sleep(interval)
    return None, last_exc


def timed_out(what: str, timeout: float, last_exc: Exception | None) -> str:
    return f"timed out after {timeout:.0f}s waiting for {what}{f' (last error: {last_exc})' if last_exc else ''}"


def wait_for(check, what: str, timeout: float, *, on_fail=None, interval: float = 0.5):
    """Poll ``check()`` until it returns a truthy value; raise StackError on timeout."""
    value, last_exc = poll(check, timeout, interval=interval)
    if value:
        return value
    extra = f"\n{on_fail()}" if on_fail else ""
    raise StackError(timed_out(what, timeout, last_exc) + extra)


def run(argv: list[str], *, what: str, cwd: Path | None = None, env: dict[str, str] | None = None,
        timeout: float | None = None) -> str:
    """Run a build or set-up step; on failure raise StackError with its output tail."""
    proc = subprocess.run(argv, cwd=str(cwd) if cwd else None, env={**os.environ, **(env or {})},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-40:])
        raise StackError(f"{what} failed (exit {proc.returncode}): {' '.join(argv)}\n{tail}")
    return proc.stdout
