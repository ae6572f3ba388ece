"""Reading Spark's streaming checkpoint: identity, offset log and commit log.

Spark writes ``offsets/N`` before batch N runs and ``commits/N`` after its sink
committed; the ``metadata`` file holds the query id, written once when the
checkpoint is created and kept by a copy (the checkpoint identity of the
protocol's ledger keys).
"""
from __future__ import annotations

import json
from pathlib import Path


def checkpoint_id(ckpt: str | Path) -> str | None:
    meta = Path(ckpt) / "metadata"
    if not meta.exists():
        return None
    return json.loads(meta.read_text().splitlines()[0])["id"]


def _batches(folder: Path) -> list[int]:
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def offset_batches(ckpt: str | Path) -> list[int]:
    return _batches(Path(ckpt) / "offsets")


def committed_batches(ckpt: str | Path) -> list[int]:
    return _batches(Path(ckpt) / "commits")


def last_offsets_batch(ckpt: str | Path) -> int | None:
    b = offset_batches(ckpt)
    return b[-1] if b else None


def last_committed_batch(ckpt: str | Path) -> int | None:
    b = committed_batches(ckpt)
    return b[-1] if b else None


def source_offsets(ckpt: str | Path, batch: int) -> dict:
    """The source offsets recorded for ``batch`` (Kafka: {topic: {partition: offset}})."""
    lines = (Path(ckpt) / "offsets" / str(batch)).read_text().splitlines()
    # v1 format: version line, metadata line, then one line per source.
    return {f"source{i}": json.loads(line) for i, line in enumerate(lines[2:]) if line.strip()}


def replay_batch(ckpt: str | Path) -> int | None:
    """The batch a restart will re-run: its offsets are logged but it has no commit."""
    last_off, last_commit = last_offsets_batch(ckpt), last_committed_batch(ckpt)
    if last_off is None or (last_commit is not None and last_commit >= last_off):
        return None
    return last_off
