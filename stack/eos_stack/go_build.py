"""Building the stack's Go binaries from the Go module proxy (the Kubernetes control plane, the real nodes'
kubelet and CoreDNS, helm, MinIO, Prometheus, the GitOps check): Go's caches under the stack cache, the Go
version checked, a long build's heartbeat, one build at a time per output folder."""
from __future__ import annotations

import fcntl
import os
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

from .common import Stack, StackError, log, require_tool

GO_MIN = (1, 25)


def go_env(st: Stack) -> dict[str, str]:
    """The Go settings every build of the stack uses: all caches under the stack cache."""
    return {
        "GOPATH": str(st.cache / "gopath"),
        "GOMODCACHE": str(st.cache / "gomod"),
        "GOCACHE": str(st.cache / "gobuild"),
        "GOFLAGS": "-modcacherw",
        "GOTOOLCHAIN": "local",
        "CGO_ENABLED": "0",
    }


def require_go(minimum: tuple[int, int] = GO_MIN) -> str:
    """The go command, at least ``minimum`` (a module whose go.mod asks for a newer Go fails to build with
    GOTOOLCHAIN=local: say so first)."""
    want = f"{minimum[0]}.{minimum[1]}+"
    go = require_tool("go", f"install Go {want} (https://go.dev/doc/install, or your package manager) "
                            "so the stack can build the Kubernetes control plane and helm")
    out = subprocess.run([go, "env", "GOVERSION"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True).stdout.strip()
    m = re.match(r"go(\d+)\.(\d+)", out)
    if not m or (int(m.group(1)), int(m.group(2))) < minimum:
        raise StackError(f"found Go '{out or 'unknown version'}' at {go}; install Go {want}")
    return go


def run_logged_build(argv: list[str], *, what: str, cwd: Path, env: dict[str, str],
                     logfile: Path, every: float = 60.0) -> None:
    """Run a long Go build, logging a heartbeat so a cold build does not look hung."""
    t0 = time.monotonic()
    with open(logfile, "w") as out:
        proc = subprocess.Popen(argv, cwd=str(cwd), env={**os.environ, **env}, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        done = threading.Event()

        def beat() -> None:
            while not done.wait(every):
                log(f"{what}: still building ({(time.monotonic() - t0) / 60:.0f} min so far, log {logfile})")

        threading.Thread(target=beat, daemon=True).start()
        try:
            rc = proc.wait()
        except BaseException:
            proc.terminate()
            proc.wait()
            raise
        finally:
            done.set()
    if rc != 0:
        tail = "\n".join(logfile.read_text(errors="replace").splitlines()[-40:])
        raise StackError(f"{what} failed (exit {rc}): {' '.join(argv)}\n{tail}")
    log(f"{what}: done in {(time.monotonic() - t0) / 60:.1f} min")


def build_once(out: Path, waiting: str, present: Callable[[], bool], build: Callable[[], None]) -> None:
    """Run ``build`` into ``out`` unless ``present()``, one `up` at a time (a lock file beside ``out``): a
    second `up` says ``waiting`` and finds the binaries the first one built."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(out.name + ".lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(waiting)
            fcntl.flock(lock, fcntl.LOCK_EX)
        if not present():
            build()


def go_install(st: Stack, exe: Path, package: str, *, what: str, estimate: str, flags: tuple[str, ...] = ()) -> Path:
    """``go install PACKAGE@VERSION`` into ``exe``'s folder (``<cache>/bin/<name>-<version>/``) unless ``exe`` is
    there already; ``what`` names the part in messages, ``estimate`` says how long a cold build takes."""
    if os.access(exe, os.X_OK):
        return exe
    go = require_go()
    exe.parent.mkdir(parents=True, exist_ok=True)
    log(f"{what}: building {package} with go install into {exe.parent} ({estimate})")
    run_logged_build([go, "install", *flags, package], what=f"{what}: go install", cwd=st.cache,
                     logfile=st.dir("logs") / f"{what}-build.log", env={**go_env(st), "GOBIN": str(exe.parent)})
    if not os.access(exe, os.X_OK):
        raise StackError(f"go install of {package} finished but {exe} is missing")
    return exe
