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
import time
from pathlib import Path, PurePosixPath
from typing import Callable

from . import __version__, checkpoint
from .checkpoint import Cut
from .storage import Loc

log = logging.getLogger(__name__)

MANIFEST = "eos-snapshot.json"
PARTIAL = ".eos-partial"   # on S3: a take or dispose of this prefix is under way (or was cut short)
COPY_ATTEMPTS = 5
RETRY_DELAY_S = 0.2  # grows per attempt: lets a maintenance pass of the state store finish


class SnapshotError(RuntimeError):
    """The snapshot could not be taken or read; the message says why."""


class NothingToSnapshot(SnapshotError):
    """The checkpoint has no committed batch yet."""


class NotASnapshot(SnapshotError):
    """The directory has no manifest: it is not a snapshot (and is never deleted as one)."""


def _copy_once(src: Loc, dest: Loc, cut: Cut, on_file: Callable[[PurePosixPath], None] | None) -> int:
    size = 0
    for rel in src.files():
        if not cut.keeps(rel):
            continue
        if on_file is not None:
            on_file(rel)
        (src / rel).copy_to(dest / rel)  # FileNotFoundError when Spark deleted it since the listing
        size += (dest / rel).size()
    # offsets/N+1 may have been logged since the listing: it is immutable once there, and without it a
    # restore would plan batch N+1 anew, on another range than the one the sink may already hold.
    for rel in (src / "offsets").files():
        rel = PurePosixPath("offsets") / rel
        if cut.keeps(rel) and not (dest / rel).exists():
            (src / rel).copy_to(dest / rel)
            size += (dest / rel).size()
    return size


def _vanished(exc: OSError) -> bool:
    """A copy failed because its source is gone (local: FileNotFoundError; S3: a 404 of CopyObject)."""
    return isinstance(exc, FileNotFoundError) or "NoSuchKey" in str(exc) or "404" in str(exc)


def copy_cut(src: str | Path | Loc, dest: str | Path | Loc, cut: Cut, *, attempts: int = COPY_ATTEMPTS,
             on_file: Callable[[PurePosixPath], None] | None = None) -> int:
    """Copy the files of ``cut`` from checkpoint ``src`` to the new directory ``dest``; returns the bytes copied.

    On S3 every file is a server-side copy. A file that vanishes mid-copy, or a copy whose state cannot be
    loaded at the cut, makes the whole cut be copied again. ``on_file`` is called before each file (tests
    inject races there).
    """
    src, dest = Loc.of(src), Loc.of(dest)
    why = ""
    for attempt in range(1, attempts + 1):
        dest.rmtree()
        dest.mkdir()
        try:
            size = _copy_once(src, dest, cut, on_file)
        except OSError as exc:
            if not _vanished(exc):
                raise
            why = f"{getattr(exc, 'filename', None) or exc} vanished during the copy"
        else:
            gaps = checkpoint.state_gaps(dest, cut.state_through) if cut.state_through is not None else []
            if not gaps:
                return size
            why = "; ".join(gaps[:3])
        log.info("copy %d of checkpoint %s was not consistent (%s); copying again", attempt, src, why)
        time.sleep(min(RETRY_DELAY_S * attempt, 1.0))
    dest.rmtree()
    raise SnapshotError(f"could not copy a consistent cut of checkpoint {src} in {attempts} attempts: {why}. "
                        "Spark's state maintenance deleted files faster than they could be copied; retry, or "
                        "raise spark.sql.streaming.minBatchesToRetain")


def _complete(snapshot: Loc) -> bool:
    return (snapshot / MANIFEST).is_file()


def _write(ckpt: Loc, dest: Loc, cut: Cut, last: int | None, *, kind: str, stream: dict, spec_hash: str | None,
           ledger_positions: dict | None, on_file=None) -> dict:
    """Copy, then write the manifest last: a snapshot is whole once its manifest exists (no rename on S3).
    Locally the copy is made under ``<name>.partial`` and renamed, so no half folder carries the name."""
    if _complete(dest) or (dest.exists() and not (dest / PARTIAL).exists()):
        raise FileExistsError(f"snapshot {dest} exists already; snapshots are never overwritten")
    tmp = dest if dest.is_object_store else dest.with_name(dest.name + ".partial")
    tmp.rmtree()
    if tmp.is_object_store:
        (tmp / PARTIAL).write_text("taking")   # marks the prefix as ours to delete if this take is cut short
    try:
        size = copy_cut(ckpt, tmp / "checkpoint", cut, on_file=on_file)
    except BaseException:
        tmp.rmtree()
        raise
    copied = tmp / "checkpoint"
    if last is not None and checkpoint.checkpoint_id(copied) is None:
        tmp.rmtree()
        raise SnapshotError(f"the copy of {ckpt} has batches up to {last} but no metadata file, which Spark needs "
                            "to start from it: not a snapshot (was the checkpoint still being seeded?)")
    import pyspark
    manifest = {
        "kind": kind, "stream": stream, "lastBatch": last, "checkpointId": checkpoint.checkpoint_id(copied),
        "sourceOffsets": checkpoint.source_offsets(copied, last) if last is not None else {},
        "ledgerPositions": ledger_positions or {}, "specHash": spec_hash,
        "sparkVersion": pyspark.__version__, "projectVersion": __version__,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "sizeBytes": size,
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    if tmp != dest:
        tmp.move_to(dest)  # the snapshot appears whole or not at all
    else:
        (tmp / PARTIAL).unlink(missing_ok=True)
    return manifest


def take_snapshot(ckpt: str | Path, dest: str | Path, *, stream: dict, spec_hash: str,
                  ledger_positions: dict | None = None) -> dict:
    """Snapshot of a stopped query's checkpoint (the snapshot-on-stop)."""
    ckpt = Loc.of(ckpt)
    last = checkpoint.last_committed_batch(ckpt)
    cut = Cut.after_batch(last) if last is not None else Cut.everything()
    return _write(ckpt, Loc.of(dest), cut, last, kind="stop", stream=stream, spec_hash=spec_hash,
                  ledger_positions=ledger_positions)


def take_live_snapshot(ckpt: str | Path, dest: str | Path, *, stream: dict, spec_hash: str | None = None,
                       ledger_positions: dict | None = None,
                       on_file: Callable[[PurePosixPath], None] | None = None) -> dict:
    """Snapshot of a running query's checkpoint: the cut after the last batch committed when the copy starts."""
    ckpt = Loc.of(ckpt)
    last = checkpoint.last_committed_batch(ckpt)
    if last is None:
        raise NothingToSnapshot(f"checkpoint {ckpt} has no committed batch yet: nothing to snapshot; "
                                "retry after the first batch")
    if checkpoint.checkpoint_id(ckpt) is None:
        # A location being seeded from a snapshot (restore_snapshot copies its metadata last): its logs are
        # part of another checkpoint's. Copied now, the snapshot would hold batches without the metadata Spark
        # needs, and a restore of it would never start (seen on S3, where seeding takes seconds).
        raise NothingToSnapshot(f"checkpoint {ckpt} has batches but no metadata file yet: a restore or upgrade "
                                "is still copying a snapshot into it; retry once its driver runs")
    return _write(ckpt, Loc.of(dest), Cut.after_batch(last), last, kind="live", stream=stream, spec_hash=spec_hash,
                  ledger_positions=ledger_positions, on_file=on_file)


def read_manifest(snapshot: str | Path) -> dict:
    path = Loc.of(snapshot) / MANIFEST
    if not path.is_file():
        raise NotASnapshot(f"not a snapshot: {snapshot} has no {MANIFEST}")
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise NotASnapshot(f"not a snapshot: {path} is not valid JSON ({exc})") from exc


def verify_snapshot(snapshot: str | Path | Loc) -> dict:
    """The manifest, after checking the copy holds the checkpoint it describes."""
    snapshot = Loc.of(snapshot)
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


def dispose_snapshot(snapshot: str | Path | Loc) -> dict | None:
    """Delete a snapshot; returns its manifest, or None when it is gone already. Refuses anything else.

    Also removes what an interrupted take or dispose left (``<name>.partial`` locally, a folder marked
    ``PARTIAL`` on S3). A crash mid-delete leaves no half snapshot that still looks whole.
    """
    snapshot = Loc.of(snapshot)
    manifest = None
    if snapshot.is_object_store:
        if _complete(snapshot):
            manifest = read_manifest(snapshot)
            (snapshot / PARTIAL).write_text("disposing")
            (snapshot / MANIFEST).unlink(missing_ok=True)
        if (snapshot / PARTIAL).exists():
            snapshot.rmtree()
        elif snapshot.exists():
            read_manifest(snapshot)   # NotASnapshot: never delete what is not a snapshot
        return manifest
    trash = snapshot.with_name(snapshot.name + ".disposing")
    if snapshot.exists():
        manifest = read_manifest(snapshot)  # NotASnapshot: never delete what is not a snapshot
        trash.rmtree()
        snapshot.move_to(trash)  # a crash mid-delete leaves no half snapshot that still looks whole
    trash.rmtree()
    snapshot.with_name(snapshot.name + ".partial").rmtree()
    return manifest


def restore_snapshot(snapshot: str | Path | Loc, new_ckpt: str | Path | Loc) -> dict:
    """Seed the new, empty checkpoint location ``new_ckpt`` with the snapshot's copy (server-side on S3).

    The copy's ``metadata`` file goes last: until it exists the location is "no checkpoint yet", so a crash
    mid-copy makes the next start copy again instead of running on a half checkpoint."""
    snapshot, new_ckpt = Loc.of(snapshot), Loc.of(new_ckpt)
    manifest = json.loads((snapshot / MANIFEST).read_text())
    if (new_ckpt / "metadata").exists():
        raise FileExistsError(f"restore target {new_ckpt} is not empty; restore into a new checkpoint location")
    new_ckpt.rmtree()
    src = snapshot / "checkpoint"
    files = src.files()
    for rel in sorted(files, key=lambda r: str(r) == "metadata"):
        (src / rel).copy_to(new_ckpt / rel)
    return manifest


def copy_offset_file(src: str | Path | Loc, dest: str | Path | Loc, batch: int) -> None:
    """Copy ``offsets/<batch>`` (and its checksum file, if any) from checkpoint ``src`` into ``dest``.

    Each file is written whole or not at all, the log entry last, as Spark writes its logs.
    """
    src, dest = Loc.of(src) / "offsets", Loc.of(dest) / "offsets"
    for name in (f".{batch}.crc", str(batch)):   # the checksum first: the log entry appears last
        source = src / name
        if source.exists():
            (dest / name).write_bytes(source.read_bytes())
