"""Snapshots: a consistent cut of the checkpoint at a batch boundary plus a manifest.

A batch's checkpoint files are immutable once written, so a cut at batch N
(``checkpoint.Cut.after_batch``) is consistent even while the query runs on:
files of later batches are left out by name. Spark's state maintenance may
delete old state files during the copy; the copy is then taken again.
Restoring seeds a *new* checkpoint location and a snapshot is never changed in
place.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path, PurePosixPath
from typing import Callable

from . import __version__, checkpoint
from .checkpoint import Cut

log = logging.getLogger(__name__)

MANIFEST = "eos-snapshot.json"
COPY_ATTEMPTS = 5
RETRY_DELAY_S = 0.2  # grows per attempt: lets a maintenance pass of the state store finish


class SnapshotError(RuntimeError):
    """The snapshot could not be taken or read; the message says why."""


class NothingToSnapshot(SnapshotError):
    """The checkpoint has no committed batch yet."""


class NotASnapshot(SnapshotError):
    """The directory has no manifest: it is not a snapshot (and is never deleted as one)."""


def _files(root: Path) -> list[PurePosixPath]:
    """Every file under root, relative. Raises FileNotFoundError when a folder vanishes while listed."""
    out: list[PurePosixPath] = []
    stack = [root]
    while stack:
        folder = stack.pop()
        with os.scandir(folder) as entries:
            for e in entries:
                if e.is_dir(follow_symlinks=False):
                    stack.append(Path(e.path))
                else:
                    out.append(PurePosixPath(Path(e.path).relative_to(root).as_posix()))
    return sorted(out)


def _copy_once(src: Path, dest: Path, cut: Cut, on_file: Callable[[PurePosixPath], None] | None) -> int:
    size = 0
    for rel in _files(src):
        if not cut.keeps(rel):
            continue
        if on_file is not None:
            on_file(rel)
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, target)  # FileNotFoundError when Spark deleted it since the listing
        size += target.stat().st_size
    # offsets/N+1 may have been logged since the listing: it is immutable once there, and without it a
    # restore would plan batch N+1 anew, on another range than the one the sink may already hold.
    for rel in _files(src / "offsets") if (src / "offsets").is_dir() else []:
        rel = PurePosixPath("offsets") / rel
        if cut.keeps(rel) and not (dest / rel).exists():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / rel, dest / rel)
            size += (dest / rel).stat().st_size
    return size


def copy_cut(src: str | Path, dest: str | Path, cut: Cut, *, attempts: int = COPY_ATTEMPTS,
             on_file: Callable[[PurePosixPath], None] | None = None) -> int:
    """Copy the files of ``cut`` from checkpoint ``src`` to the new directory ``dest``; returns the bytes copied.

    A file that vanishes mid-copy, or a copy whose state cannot be loaded at the cut,
    makes the whole cut be copied again. ``on_file`` is called before each file (tests inject races there).
    """
    src, dest = Path(src), Path(dest)
    why = ""
    for attempt in range(1, attempts + 1):
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        try:
            size = _copy_once(src, dest, cut, on_file)
        except FileNotFoundError as exc:
            why = f"{exc.filename} vanished during the copy"
        else:
            gaps = checkpoint.state_gaps(dest, cut.state_through) if cut.state_through is not None else []
            if not gaps:
                return size
            why = "; ".join(gaps[:3])
        log.info("copy %d of checkpoint %s was not consistent (%s); copying again", attempt, src, why)
        time.sleep(min(RETRY_DELAY_S * attempt, 1.0))
    shutil.rmtree(dest, ignore_errors=True)
    raise SnapshotError(f"could not copy a consistent cut of checkpoint {src} in {attempts} attempts: {why}. "
                        "Spark's state maintenance deleted files faster than they could be copied; retry, or "
                        "raise spark.sql.streaming.minBatchesToRetain")


def _write(ckpt: Path, dest: Path, cut: Cut, last: int | None, *, kind: str, stream: dict, spec_hash: str | None,
           ledger_positions: dict | None, on_file=None) -> dict:
    if dest.exists():
        raise FileExistsError(f"snapshot {dest} exists already; snapshots are never overwritten")
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        size = copy_cut(ckpt, tmp / "checkpoint", cut, on_file=on_file)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    copied = tmp / "checkpoint"
    import pyspark
    manifest = {
        "kind": kind, "stream": stream, "lastBatch": last, "checkpointId": checkpoint.checkpoint_id(copied),
        "sourceOffsets": checkpoint.source_offsets(copied, last) if last is not None else {},
        "ledgerPositions": ledger_positions or {}, "specHash": spec_hash,
        "sparkVersion": pyspark.__version__, "projectVersion": __version__,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "sizeBytes": size,
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    tmp.rename(dest)  # the snapshot appears whole or not at all
    return manifest


def take_snapshot(ckpt: str | Path, dest: str | Path, *, stream: dict, spec_hash: str,
                  ledger_positions: dict | None = None) -> dict:
    """Snapshot of a stopped query's checkpoint (the snapshot-on-stop)."""
    ckpt = Path(ckpt)
    last = checkpoint.last_committed_batch(ckpt)
    cut = Cut.after_batch(last) if last is not None else Cut.everything()
    return _write(ckpt, Path(dest), cut, last, kind="stop", stream=stream, spec_hash=spec_hash,
                  ledger_positions=ledger_positions)


def take_live_snapshot(ckpt: str | Path, dest: str | Path, *, stream: dict, spec_hash: str | None = None,
                       ledger_positions: dict | None = None,
                       on_file: Callable[[PurePosixPath], None] | None = None) -> dict:
    """Snapshot of a running query's checkpoint: the cut after the last batch committed when the copy starts."""
    ckpt = Path(ckpt)
    last = checkpoint.last_committed_batch(ckpt)
    if last is None:
        raise NothingToSnapshot(f"checkpoint {ckpt} has no committed batch yet: nothing to snapshot; "
                                "retry after the first batch")
    return _write(ckpt, Path(dest), Cut.after_batch(last), last, kind="live", stream=stream, spec_hash=spec_hash,
                  ledger_positions=ledger_positions, on_file=on_file)


def read_manifest(snapshot: str | Path) -> dict:
    path = Path(snapshot) / MANIFEST
    if not path.is_file():
        raise NotASnapshot(f"not a snapshot: {snapshot} has no {MANIFEST}")
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise NotASnapshot(f"not a snapshot: {path} is not valid JSON ({exc})") from exc


def verify_snapshot(snapshot: str | Path) -> dict:
    """The manifest, after checking the copy holds the checkpoint it describes."""
    snapshot = Path(snapshot)
    manifest = read_manifest(snapshot)
    copied = snapshot / "checkpoint"
    last = manifest.get("lastBatch")
    problems = []
    if not copied.is_dir():
        problems.append("it has no checkpoint/ folder")
    else:
        if checkpoint.checkpoint_id(copied) != manifest.get("checkpointId"):
            problems.append(f"its checkpoint id is {checkpoint.checkpoint_id(copied)}, the manifest says "
                            f"{manifest.get('checkpointId')}")
        if last is not None and checkpoint.last_committed_batch(copied) != last:
            problems.append(f"its last commit is {checkpoint.last_committed_batch(copied)}, the manifest says {last}")
        if last is not None:
            problems += checkpoint.state_gaps(copied, last + 1)[:3]
    if problems:
        raise NotASnapshot(f"snapshot {snapshot} is damaged: {'; '.join(problems)}")
    return manifest


def dispose_snapshot(snapshot: str | Path) -> dict | None:
    """Delete a snapshot; returns its manifest, or None when it is gone already. Refuses anything else.

    Also removes what an interrupted take left next to it (``<name>.partial``, never a snapshot).
    """
    snapshot = Path(snapshot)
    trash = snapshot.with_name(snapshot.name + ".disposing")
    manifest = None
    if snapshot.exists():
        manifest = read_manifest(snapshot)  # NotASnapshot: never delete what is not a snapshot
        shutil.rmtree(trash, ignore_errors=True)
        snapshot.rename(trash)  # a crash mid-delete leaves no half snapshot that still looks whole
    shutil.rmtree(trash, ignore_errors=True)
    shutil.rmtree(snapshot.with_name(snapshot.name + ".partial"), ignore_errors=True)
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


def copy_offset_file(src: str | Path, dest: str | Path, batch: int) -> None:
    """Copy ``offsets/<batch>`` (and its checksum file, if any) from checkpoint ``src`` into ``dest``.

    Written to a temporary name and renamed, as Spark writes its logs: a crash leaves no half file.
    """
    src, dest = Path(src) / "offsets", Path(dest) / "offsets"
    dest.mkdir(parents=True, exist_ok=True)
    for name in (f".{batch}.crc", str(batch)):   # the checksum first: the log entry appears last
        source = src / name
        if not source.exists():
            continue
        tmp = dest / f".{name}.eos-copy.tmp"
        shutil.copyfile(source, tmp)
        tmp.rename(dest / name)
