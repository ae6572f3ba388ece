"""The helm part: the helm v3 CLI, built with ``go install`` and cached by version.

No daemon: ``up`` makes sure ``<cache>/bin/helm-<ver>/helm`` exists and returns
``HELM=<path>``.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from .common import Stack, StackError
from .go_build import go_install

HELM_VERSION = "v3.19.5"
ENV_KEYS = ["HELM"]


def helm_bin(st: Stack) -> Path:
    return st.cache / "bin" / f"helm-{HELM_VERSION}" / "helm"


def up(st: Stack) -> dict[str, str]:
    exe = helm_bin(st)
    go_install(st, exe, f"helm.sh/helm/v3/cmd/helm@{HELM_VERSION}", what="helm",
               estimate="a few minutes on a cold cache")
    out = subprocess.run([str(exe), "version", "--short"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, env={**os.environ, **helm_env(st)})
    if out.returncode != 0:
        raise StackError(f"{exe} does not run: {out.stdout.strip()}")
    return {"HELM": str(exe)}


def helm_env(st: Stack) -> dict[str, str]:
    """Keep helm's own config/cache/data out of the user's home."""
    base = st.dir("helm")
    return {"HELM_CONFIG_HOME": str(base / "config"), "HELM_CACHE_HOME": str(base / "cache"),
            "HELM_DATA_HOME": str(base / "data")}


def down(st: Stack, purge: bool = False) -> None:
    if purge:
        st.drop_env(ENV_KEYS)


def status(st: Stack) -> tuple[str, str]:
    exe = helm_bin(st)
    if os.access(exe, os.X_OK):
        return "ready", str(exe)
    return "missing", f"{exe} not built yet (`up helm` builds it)"
