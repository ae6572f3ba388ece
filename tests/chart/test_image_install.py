"""The Dockerfile's install steps, replayed in a clean virtual environment.

No container engine here: the build stage's COPY instructions are read from the
Dockerfile and replayed into a temporary folder, then its install (a venv and
`pip install .`) runs there, and both entry points the image uses must start from
that environment alone, away from the repository.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .dockerfile import copy_sources, parse
from .helpers import REPO

DOCKERFILE = REPO / "Dockerfile"


def build_stage():
    stages = [s for s in parse(DOCKERFILE) if s.name == "build"]
    assert stages, "the Dockerfile has no `build` stage"
    return stages[0]


# make soak: `make test` builds the image itself (`make image`) and runs Pods from it, which covers these steps.
@pytest.mark.soak
def test_dockerfile_install_steps_work_in_a_clean_venv(tmp_path):
    stage = build_stage()
    (workdir,) = [i.args for i in stage.all("WORKDIR")]
    src = tmp_path / workdir.strip("/")
    src.mkdir(parents=True)
    for instruction in stage.all("COPY"):
        assert "--from" not in instruction.args
        sources, dest = copy_sources(instruction)
        for source in sources:
            origin = REPO / source
            target = src / dest if not dest.endswith("/") and len(sources) == 1 else src / dest / Path(source).name
            if origin.is_dir():
                shutil.copytree(origin, target, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, target)
    (run,) = stage.all("RUN")
    flags, command = run.flags_and_command()
    # OFFLINE set (`make image`): pip takes the bind-mounted wheels and no index; tests/stack/test_image.py
    # checks the image that path builds. Replayed here: the default, OFFLINE empty, as users build it.
    assert flags == ["--mount=type=bind,source=docker,target=/mnt/docker"], flags
    assert command == ('if [ -n "$OFFLINE" ]; then export PIP_NO_INDEX=1 PIP_FIND_LINKS=/mnt/docker/offline/wheels; '
                       'fi && python -m venv /opt/eos && /opt/eos/bin/pip install .'), (
        f"the build stage's install changed ({command}): replay the new steps here")

    venv = tmp_path / "opt" / "eos"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PIP_NO_CACHE_DIR")}
    # The Dockerfile builds without a cache; here the project's pip cache keeps it fast.
    env.setdefault("PIP_CACHE_DIR", str(Path(os.environ.get("EOS_CACHE", Path.home() / ".cache" / "eos")) / "pip"))
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env, timeout=300)
    proc = subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "."], cwd=src, env=env,
                          capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, f"pip install . failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    python = str(venv / "bin" / "python")
    for module, expected in (("eos_operator", "run"), ("eos_job", "run")):
        out = subprocess.run([python, "-m", module, "--help"], cwd=elsewhere, env=env, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, f"python -m {module} --help:\n{out.stdout}\n{out.stderr}"
        assert "usage:" in out.stdout and expected in out.stdout, out.stdout
        where = subprocess.run([python, "-c", f"import {module}; print({module}.__file__)"], cwd=elsewhere, env=env,
                               capture_output=True, text=True, timeout=60).stdout.strip()
        assert where.startswith(str(venv)), f"{module} was imported from {where}, not from the clean venv"
    out = subprocess.run([python, "-m", "eos_operator", "run", "--help"], cwd=elsewhere, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "--liveness" in out.stdout, out.stdout + out.stderr
    for script in ("eos-operator", "eos-job"):
        assert (venv / "bin" / script).exists(), f"console script {script} missing"
