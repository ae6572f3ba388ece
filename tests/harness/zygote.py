"""A fork server for the process kubelet: Pod processes forked from one process that imported their code once.

A fresh ``python`` with confluent_kafka, pydantic and pyarrow holds ~80 MB of its own; hundreds of Pods of
one program (the driver stand-in) would need gigabytes. So the kubelet starts ``python -m MODULE --zygote``
once (``Zygote``), a single-threaded process that imported MODULE; MODULE's ``__main__`` calls ``serve(main)``.
For each Pod the kubelet sends a request (a JSON line: argv, env, cwd, log file) and the zygote forks a
child that starts a session of its own (the kubelet signals its process group), sends its output to the
log file, makes the Pod's mounts in a mount namespace of its own if it has any, takes the Pod's environment
and working directory and runs ``main(argv)``. The zygote answers
with the child's pid, and with its exit code once it reaped it (``os.waitstatus_to_exitcode``: -N for a
signal, as ``subprocess``). The kubelet holds a ``Forked`` per child: the part of ``subprocess.Popen`` it uses.

The children share the zygote's pages until they write to them; ``gc.freeze()`` keeps the collector of a
child from touching (and so copying) every imported object.
"""
from __future__ import annotations

import ctypes
import gc
import json
import logging
import os
import select
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]
CLONE_NEWNS = 0x00020000


class Forked:
    """A child of the zygote: ``pid``, ``poll()``, ``wait()`` and ``returncode``, as ``subprocess.Popen``."""

    def __init__(self, pid: int):
        self.pid, self.returncode, self._ended = pid, None, threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
        return self.returncode

    def ended(self, code: int) -> None:
        self.returncode = code
        self._ended.set()


class Zygote:
    """The kubelet's side: ``python -m <module> --zygote`` started with ``env``; ``spawn`` forks one child."""

    def __init__(self, module: str, env: dict[str, str]):
        self.proc = subprocess.Popen([sys.executable, "-m", module, "--zygote"], cwd=REPO, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._lock, self._pids = threading.Lock(), []
        self._children: dict[int, Forked] = {}
        self._changed = threading.Condition()
        threading.Thread(target=self._read, name=f"zygote-{module}", daemon=True).start()

    def spawn(self, argv: list[str], env: dict[str, str], cwd: str, log_path: Path, *,
              mounts: list[str] | None = None) -> Forked:
        """``mounts``: a command the child runs in a mount namespace of its own first (as root), which makes
        the Pod's mounts there (``pod_setup.namespaced_argv``'s steps); the child then enters ``cwd``."""
        with self._lock:   # one request at a time: the next pid line answers it
            request = {"argv": argv, "env": env, "cwd": cwd, "log": str(log_path), "mounts": mounts}
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
            with self._changed:
                if not self._changed.wait_for(lambda: self._pids or self.proc.poll() is not None, 30):
                    raise OSError("the zygote did not fork within 30s")
                if not self._pids:
                    raise OSError(f"the zygote exited with {self.proc.returncode}")
                return self._children[self._pids.pop(0)]

    def _read(self) -> None:
        for line in self.proc.stdout:
            msg = json.loads(line)
            with self._changed:
                if "pid" in msg:
                    self._children[msg["pid"]] = Forked(msg["pid"])
                    self._pids.append(msg["pid"])
                    self._changed.notify_all()
                elif msg["exit"] in self._children:
                    self._children.pop(msg["exit"]).ended(msg["code"])
        with self._changed:   # the zygote is gone, and with it what its children's exit codes were
            for child in self._children.values():
                child.ended(255)
            self._children.clear()
            self._changed.notify_all()

    def close(self) -> None:
        """Call once its children ended: closing its input ends the zygote."""
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def serve(main: Callable[[list[str]], int]) -> int:
    """The zygote's loop (single-threaded, so a fork copies no lock another thread holds)."""
    gc.freeze()
    ins, out = sys.stdin.buffer, sys.stdout.buffer
    while True:
        ready, _, _ = select.select([ins], [], [], 0.2)
        if ready:
            line = ins.readline()
            if not line:
                return 0
            out.write(json.dumps({"pid": _fork(main, json.loads(line))}).encode() + b"\n")
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            out.write(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
        out.flush()


def _fork(main: Callable[[list[str]], int], req: dict) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        os.setsid()
        log = os.open(req["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        if req.get("mounts"):
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.unshare(CLONE_NEWNS) != 0:
                raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS) failed")
            subprocess.run(["mount", "--make-rprivate", "/"], check=True)
            subprocess.run(req["mounts"], check=True)
        os.environ.clear()
        os.environ.update(req["env"])
        os.chdir(req["cwd"])
        code = main(req["argv"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - a child never returns into the zygote's loop
        logging.getLogger(__name__).exception("the forked program failed")
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
