"""Snapshots: a copy of the checkpoint at a clean batch boundary plus a manifest.

A batch's checkpoint files are immutable once written, so the copy of a
stopped query is consistent; restoring seeds a *new* checkpoint location and a
snapshot is never changed in place.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from . import __version__, checkpoint

MANIFEST = "eos-snapshot.json"


def take_snapshot(ckpt: str | Path, dest: str | Path, *, stream: dict, spec_hash: str,
                  ledger_positions: dict | None = None) -> dict:
    ckpt, dest = Path(ckpt), Path(dest)
    if dest.exists():
        raise FileExistsError(f"snapshot {dest} exists already; snapshots are never overwritten")
    last = checkpoint.last_committed_batch(ckpt)
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(ckpt, tmp / "checkpoint")
    size = sum(p.stat().st_size for p in (tmp / "checkpoint").rglob("*") if p.is_file())
    import pyspark
    manifest = {
        "stream": stream, "lastBatch": last, "checkpointId": checkpoint.checkpoint_id(ckpt),
        "sourceOffsets": checkpoint.source_offsets(ckpt, last) if last is not None else {},
        "ledgerPositions": ledger_positions or {}, "specHash": spec_hash,
        "sparkVersion": pyspark.__version__, "projectVersion": __version__,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "sizeBytes": size,
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    tmp.rename(dest)  # the snapshot appears whole or not at all
    return manifest


def restore_snapshot(snapshot: str | Path, new_ckpt: str | Path) -> dict:
    snapshot, new_ckpt = Path(snapshot), Path(new_ckpt)
    manifest = json.loads((snapshot / MANIFEST).read_text())
    if new_ckpt.exists() and any(new_ckpt.iterdir()):
        raise FileExistsError(f"restore target {new_ckpt} is not empty; restore into a new checkpoint location")
    tmp = new_ckpt.with_name(new_ckpt.name + ".restoring")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(snapshot / "checkpoint", tmp)
    if new_ckpt.exists():
        new_ckpt.rmdir()
    tmp.rename(new_ckpt)  # a crash mid-copy leaves no half-restored checkpoint behind
    return manifest
