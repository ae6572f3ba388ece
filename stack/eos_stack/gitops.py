"""The gitops part: ``gitops-check`` (``stack/gitops-check``), built with ``go build`` and cached by the hash of
its sources.

No daemon: ``up`` makes sure ``<cache>/bin/gitops-check-<hash>/gitops-check`` exists and returns
``GITOPS_CHECK=<path>``. It computes what Flux and Argo CD make of a stream or snapshot: kstatus
(``sigs.k8s.io/cli-utils``, the library itself) and the chart's Argo CD health checks in gopher-lua, the Lua
Argo CD embeds (tests/operator/test_gitops_health.py).

Measured on the two-core machine, shared with other sessions' Spark tests: a cold build (empty Go caches:
21 MB of modules from the proxy, then apimachinery, k8s.io/api's core types, the kstatus library and
gopher-lua compiled) takes 78 s of CPU and 65 s, 114 s and 141 s of wall time in three runs (loads of 5 to
10).
After the kube part's build, which has compiled the same k8s.io/apimachinery and k8s.io/api versions
(``go.mod`` pins those of ``stack/kube-build``) into the shared Go cache, it takes 2-5 s: hence it comes
after kube in ``up``, and adds seconds to a cold ``make test``.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from .common import REPO, Stack, StackError, log
from .go_build import build_once, go_env, require_go, run_logged_build

SOURCE = REPO / "stack" / "gitops-check"
FILES = ("go.mod", "go.sum", "main.go")
ENV_KEYS = ["GITOPS_CHECK"]
HEALTH = REPO / "charts" / "spark-eos-operator" / "health"
# The chart's Argo CD health checks, keyed as Argo CD keys them (group/kind).
HEALTH_SCRIPTS = {"streaming.eos.dev/ExactlyOnceStream": HEALTH / "exactlyoncestream.lua",
                  "streaming.eos.dev/ExactlyOnceSnapshot": HEALTH / "exactlyoncesnapshot.lua"}


def source_hash() -> str:
    digest = hashlib.sha256()
    for name in FILES:
        digest.update(name.encode() + b"\0" + (SOURCE / name).read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def check_bin(st: Stack) -> Path:
    return st.cache / "bin" / f"gitops-check-{source_hash()}" / "gitops-check"


def up(st: Stack) -> dict[str, str]:
    exe = check_bin(st)
    if not os.access(exe, os.X_OK):
        go = require_go()
        build_once(exe.parent, "gitops: another `up` is building gitops-check; waiting for it",
                   lambda: os.access(exe, os.X_OK), lambda: _build(st, go, exe))
    out = subprocess.run([str(exe)], input="[]", stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if out.returncode != 0 or out.stdout.strip() != "[]":
        raise StackError(f"{exe} does not run: {out.stdout.strip()}")
    return {"GITOPS_CHECK": str(exe)}


def _build(st: Stack, go: str, exe: Path) -> None:
    log(f"gitops: building gitops-check (kstatus, gopher-lua) into {exe.parent}")
    staging = exe.with_name(f"gitops-check.build-{os.getpid()}")
    run_logged_build([go, "build", "-trimpath", "-o", str(staging), "."], what="gitops: go build", cwd=SOURCE,
                     env=go_env(st), logfile=st.dir("logs") / "gitops-check-build.log")
    staging.replace(exe)
    for old in exe.parent.parent.glob("gitops-check-*"):   # builds of earlier sources: one is kept
        if old.is_dir() and old.name != exe.parent.name:
            shutil.rmtree(old, ignore_errors=True)


def check(exe: str, docs: list[dict[str, Any]], scripts: dict[str, Path] | None = None) -> list[dict[str, Any]]:
    """What kstatus and the Argo CD health checks (``scripts``, group/kind: file; the chart's by default) say of
    each object: ``{"kstatus": {"status", "message"}, "argocd": {...}}``, or ``{"error": ...}``."""
    argv = [exe]
    for key, path in (HEALTH_SCRIPTS if scripts is None else scripts).items():
        argv += ["--health", f"{key}={path}"]
    proc = subprocess.run(argv, input=json.dumps(docs), capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise StackError(f"gitops-check failed (exit {proc.returncode}): {proc.stderr.strip()}")
    results = json.loads(proc.stdout)
    if len(results) != len(docs):
        raise StackError(f"gitops-check answered {len(results)} results for {len(docs)} objects")
    return results


def down(st: Stack, purge: bool = False) -> None:
    if purge:
        st.drop_env(ENV_KEYS)


def status(st: Stack) -> tuple[str, str]:
    exe = check_bin(st)
    if os.access(exe, os.X_OK):
        return "ready", str(exe)
    return "missing", f"{exe} not built yet (`up gitops` builds it)"
