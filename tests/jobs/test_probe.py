"""``eos-job probe``: the checkpoint's batches, read where the checkpoint is mounted (a claim), as JSON."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from eos_job.cli import EXIT_OK, main
from eos_job.status import CheckpointFacts

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[2]


def manifest(tmp_path: Path, ckpt: Path) -> Path:
    doc = yaml.safe_load((REPO / "examples" / "colors.yaml").read_text())
    doc["spec"]["checkpoint"] = {"store": "pvc", "claimName": "colors-checkpoint", "path": str(ckpt)}
    out = tmp_path / "colors.yaml"
    out.write_text(yaml.safe_dump(doc))
    return out


def probe(capsys, cfg: Path, live: Path) -> dict:
    assert main(["probe", "--config", str(cfg), "--checkpoint", str(live)]) == EXIT_OK
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_probe_reports_the_batches_of_the_checkpoint(tmp_path, capsys):
    root = tmp_path / "claim"
    live = root / "live"
    cfg = manifest(tmp_path, root)
    fresh = probe(capsys, cfg, live)   # nothing written yet: no checkpoint, nothing to replay
    assert fresh == {"reason": "Probed", "checkpointDir": str(live), "state": "empty"}
    (live / "offsets").mkdir(parents=True)
    (live / "commits").mkdir()
    (live / "metadata").write_text(json.dumps({"id": "q-1"}) + "\n")
    for b in range(4):
        (live / "offsets" / str(b)).write_text("v1\n{}\n{}\n")
    for b in range(3):
        (live / "commits" / str(b)).write_text("v1\n{}\n")
    doc = probe(capsys, cfg, live)
    facts = CheckpointFacts.model_validate({k: v for k, v in doc.items() if k != "reason"})
    assert (facts.checkpoint_id, facts.last_offsets_batch, facts.last_committed_batch, facts.replay_batch) == \
        ("q-1", 3, 2, 3)
