"""The operator <-> job runtime version-skew policy (docs/api-policy.md): a runtime one minor version older
reads the run config this operator writes, and a runtime outside the policy is reported (Degraded
RuntimeVersionSkew), the stream kept running."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from eos_job.spec import ExactlyOnceStreamSpec, RunConfig
from eos_operator import children
from eos_operator.children import StreamRef
from eos_operator.upgrades import run_affecting_changes
from eos_operator.validation import validate_spec
from eos_operator.version_skew import skew_message

from tests.previous_build import PREVIOUS_BUILD

from .fakes import base_spec

REPO = Path(__file__).resolve().parents[2]
REF = StreamRef("colors", "team-a", "0f6c2a1e-1111-2222-3333-444455556666")
# The last commit before job.eventLog (61bbb2c), an optional spec field the stream below does not use: its
# runtime refuses any field it does not know, a null one too. Needs the repository's history (CI's clone has it).
OLDER_RUNTIME = "a4d14b56fcac2045e6c37e83abf9de173e7e69d7"

PARSE = """
import json, sys
from eos_job.spec import RunConfig
cfg = RunConfig.model_validate_json(sys.stdin.read())
print(json.dumps({"outputHash": cfg.spec.output_hash(), "checkpointDir": cfg.checkpoint_dir,
                  "uid": cfg.stream.uid, "generation": cfg.stream.generation}))
"""


def older_build(dest: Path, *paths: str, commit: str = OLDER_RUNTIME) -> Path:
    """``paths`` as they were at ``commit``, unpacked under ``dest``; returns ``dest``."""
    got = subprocess.run(["git", "-C", str(REPO), "archive", commit, *paths], capture_output=True)
    if got.returncode != 0:
        pytest.fail(f"git archive {commit} failed ({got.stderr.decode().strip()}): this test needs the "
                    "repository's git history; run it in a full clone (git fetch --unshallow)")
    with tarfile.open(fileobj=io.BytesIO(got.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def older_runtime(dest: Path) -> Path:
    """``jobs/eos_job`` as it was at OLDER_RUNTIME, unpacked under ``dest``; its import root."""
    return older_build(dest, "jobs/eos_job") / "jobs"


def run_older(dest: Path, program: str, stdin: str) -> str:
    """``program`` run by the previous build's ``jobs`` and ``operator`` (unpacked under ``dest``); its output."""
    root = older_build(dest, "jobs", "operator", commit=PREVIOUS_BUILD)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
        "PYTHONPATH": f"{root / 'jobs'}:{root / 'operator'}"}
    got = subprocess.run([sys.executable, "-c", program], input=stdin, capture_output=True, text=True, env=env,
                         cwd=dest, timeout=50)
    assert got.returncode == 0, f"the older build failed:\n{got.stderr[-2000:]}"
    return got.stdout


def test_a_runtime_one_version_older_runs_the_run_config_this_operator_writes(tmp_path):
    spec = validate_spec(base_spec())
    assert isinstance(spec, ExactlyOnceStreamSpec), spec
    config = children.run_config(REF, spec, tx_generation=2)
    text = children.run_config_map(REF, config)["data"][children.RUN_CONFIG_KEY]
    root = older_runtime(tmp_path / "old")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(root)}
    got = subprocess.run([sys.executable, "-c", PARSE], input=text, capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=50)
    assert got.returncode == 0, f"the older runtime refused the run config:\n{got.stderr[-2000:]}"
    seen = json.loads(got.stdout)
    # It runs the same stream and its ledger records carry the same output hash as this version's would.
    assert seen == {"outputHash": spec.output_hash(), "checkpointDir": config.checkpoint_dir,
                    "uid": config.stream.uid, "generation": 2}
    assert str(root).startswith(str(tmp_path))   # the old code ran, not this work tree's


def test_the_driver_reads_back_the_operators_spec_explicit_nulls_included():
    """The run config leaves out unset fields; ``fsGroup: null`` (leave volume ownership alone) is not unset, its
    default is 10001: written out, or the driver would run another spec, with another spec hash, than the
    operator's."""
    security = {"securityContext": {"fsGroup": None}}
    spec = validate_spec(base_spec(job={"module": "tests.e2e.jobs.sleeper", "parallelism": 2,
                                        "podTemplate": security}))
    assert isinstance(spec, ExactlyOnceStreamSpec), spec
    assert spec.job.pod_template.security_context.fs_group is None
    config = children.run_config(REF, spec, tx_generation=1)
    text = children.run_config_map(REF, config)["data"][children.RUN_CONFIG_KEY]
    assert "null" in text and '"eventLog"' not in text    # the one explicit null kept, the unset fields left out
    read = RunConfig.model_validate_json(text)
    assert read == config and read.spec.spec_hash() == spec.spec_hash()


@pytest.mark.parametrize("operator, runtime, expected", [
    ("0.3.0", "0.3.0", None),
    ("0.3.2", "0.3.0", None),
    ("0.3.0", "0.3.5", None),
    ("0.3.0", "0.2.7", None),
    ("1.4.0", "1.3.0", None),
    ("0.3.0", "0.1.9", "runtime 0.1.9 is more than one minor version older than operator 0.3.0"),
    ("1.0.0", "0.9.0", "runtime 0.9.0 is another major version than operator 1.0.0"),
    ("0.3.0", "0.4.0", "runtime 0.4.0 is newer than operator 0.3.0"),
    ("0.3.0", "1.0.0", "runtime 1.0.0 is newer than operator 0.3.0"),
    ("0.3.0", "banana", "runtime version 'banana' is not MAJOR.MINOR.PATCH"),
])
def test_the_skew_policy(operator, runtime, expected):
    message = skew_message(operator, runtime)
    if expected is None:
        assert message is None
    else:
        assert message is not None and message.startswith(expected), message
        assert "operator" in message and "image" in message   # names the fix: which side to upgrade


def test_unknown_runtime_version_is_not_reported():
    """A driver that reported nothing yet (no batch committed) is not skew."""
    assert skew_message("0.3.0", None) is None


# What the previous build's operator records as status.lastReconciledSpec when it launches a driver (launch.py).
RECORDED_SPEC = """
import json, sys
from eos_operator import upgrades, validation
validation.allow_local_store()
print(json.dumps([upgrades.spec_json(validation.validate_spec(raw)) for raw in json.loads(sys.stdin.read())]))
"""


def test_an_upgraded_operator_sees_no_change_in_the_spec_an_older_one_recorded(tmp_path):
    """The policy's "the operator reads the status any operator of the previous minor version wrote": the spec
    the previous build's operator recorded for a running driver reads as no run-affecting change to this one, or the
    upgrade would restart every stream (as a changed default of ``job.driver.memory`` once did: the
    operator-upgrade e2e caught it, a new driver Pod of every stream). Specs that leave most fields to their
    defaults, where a changed default shows."""
    raws = [base_spec(), yaml.safe_load((REPO / "examples" / "colors.yaml").read_text())["spec"]]
    recorded = json.loads(run_older(tmp_path / "old", RECORDED_SPEC, json.dumps(raws)))
    specs = [validate_spec(raw) for raw in raws]
    assert all(isinstance(spec, ExactlyOnceStreamSpec) for spec in specs), specs
    assert [run_affecting_changes(old, spec) for old, spec in zip(recorded, specs)] == [[], []]
    # The same check on a recorded spec whose driver memory was another default reports it: it can fail.
    changed = json.loads(recorded[0])
    changed["job"]["driver"]["memory"] = "2Gi"
    assert run_affecting_changes(json.dumps(changed), specs[0]) == ["job.driver.memory"]


VALIDATES = """
import json, sys
from eos_operator import validation
validation.allow_local_store()
found = [validation.validate_spec(raw) for raw in json.loads(sys.stdin.read())]
print(json.dumps([s.message if isinstance(s, validation.InvalidSpec) else None for s in found]))
"""


def test_the_previous_operator_accepts_the_defaults_this_crd_stores(tmp_path):
    """The CRDs are upgraded before the operator's Deployment, and the API server stores the CRD's defaults into
    every stream: the previous build's operator, still running, reads them. A default on a field it does not know
    makes it refuse every stream (``sink.writer``'s default once did: the operator-upgrade e2e caught it). The
    CRD's defaults are the model's (eos_operator.crd), so a stream with every default filled in must validate there."""
    raws = [base_spec(), yaml.safe_load((REPO / "examples" / "colors.yaml").read_text())["spec"]]
    filled = [ExactlyOnceStreamSpec.model_validate(raw).model_dump(by_alias=True, exclude_none=True, mode="json")
              for raw in raws]
    # The control: the same streams with one field only this build knows, defaulted, are refused there.
    control = json.loads(json.dumps(filled[0]))
    control["sink"]["writer"] = "python"
    refused = json.loads(run_older(tmp_path / "old", VALIDATES, json.dumps([*filled, control])))
    assert refused[:2] == [None, None], refused
    assert refused[2] == "spec.sink.writer: Extra inputs are not permitted", refused
