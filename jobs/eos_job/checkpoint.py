"""Reading Spark's streaming checkpoint: identity, offset log and commit log.

Spark writes ``offsets/N`` before batch N runs and ``commits/N`` after its sink
committed; the ``metadata`` file holds the query id, written once when the
checkpoint is created and kept by a copy (the checkpoint identity of the
protocol's ledger keys). ``Cut`` names the files of a consistent cut at a batch
boundary, for snapshots and pre-flights.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from . import protocol
from .storage import Loc


def checkpoint_id(ckpt: str | Path) -> str | None:
    meta = Loc.of(ckpt) / "metadata"
    if not meta.exists():
        return None
    return json.loads(meta.read_text().splitlines()[0])["id"]


def state(ckpt: str | Path) -> str:
    """``intact`` (metadata with an id, and offsets), ``empty`` (neither) or ``damaged`` (the rest)."""
    ckpt = Loc.of(ckpt)
    meta = ckpt / "metadata"
    has_meta = meta.is_file()
    has_offsets = bool(offset_batches(ckpt))
    if has_meta and has_offsets:
        try:
            json.loads(meta.read_text().splitlines()[0])["id"]
        except (OSError, ValueError, KeyError, IndexError):
            return "damaged"
        return "intact"
    return "empty" if not has_meta and not has_offsets else "damaged"


def _batches(folder: Loc) -> list[int]:
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def offset_batches(ckpt: str | Path) -> list[int]:
    return _batches(Loc.of(ckpt) / "offsets")


def committed_batches(ckpt: str | Path) -> list[int]:
    return _batches(Loc.of(ckpt) / "commits")


def last_offsets_batch(ckpt: str | Path) -> int | None:
    b = offset_batches(ckpt)
    return b[-1] if b else None


def last_committed_batch(ckpt: str | Path) -> int | None:
    b = committed_batches(ckpt)
    return b[-1] if b else None


def source_offsets(ckpt: str | Path, batch: int) -> dict:
    """The source offsets recorded for ``batch`` (Kafka: {topic: {partition: offset}})."""
    lines = (Loc.of(ckpt) / "offsets" / str(batch)).read_text().splitlines()
    # v1 format: version line, metadata line, then one line per source.
    return {f"source{i}": json.loads(line) for i, line in enumerate(lines[2:]) if line.strip()}


def kafka_offsets(ckpt: str | Path, batch: int) -> dict[str, dict[str, int]]:
    """The Kafka source positions after ``batch``, all sources merged: {topic: {partition: next offset}}."""
    merged: dict[str, dict[str, int]] = {}
    for src in source_offsets(ckpt, batch).values():
        if not isinstance(src, dict):
            continue
        for topic, parts in src.items():
            if isinstance(parts, dict):
                merged.setdefault(topic, {}).update({str(p): int(o) for p, o in parts.items()})
    return merged


def initial_kafka_offsets(ckpt: str | Path) -> dict[str, dict[str, int]] | None:
    """Where the Kafka source started (``sources/0/0``: a version line, then JSON); None if absent."""
    f = Loc.of(ckpt) / "sources" / "0" / "0"
    if not f.is_file():
        return None
    for line in reversed(f.read_bytes().decode("utf-8", "replace").splitlines()):
        line = line.strip("\0 ")
        if line.startswith("{"):
            return {t: {str(p): int(o) for p, o in parts.items()} for t, parts in json.loads(line).items()}
    return None


def batch_input(ckpt: str | Path, batch: int) -> protocol.Ranges:
    """Batch ``batch``'s input ranges as the checkpoint logged them (its end: ``offsets/N``; its start: the
    end of N-1, or the source's initial offsets for batch 0; unknown starts are None)."""
    end = kafka_offsets(ckpt, batch)
    if batch == 0:
        start = initial_kafka_offsets(ckpt)
    else:
        start = kafka_offsets(ckpt, batch - 1) if (Loc.of(ckpt) / "offsets" / str(batch - 1)).is_file() else None
    return protocol.input_ranges(start, end)


def offset_log_text(ckpt: str | Path, batch: int) -> str:
    return (Loc.of(ckpt) / "offsets" / str(batch)).read_text()


def write_offset_log(ckpt: str | Path, batch: int, text: str) -> None:
    """Log ``offsets/<batch>`` as recorded in the ledger, so Spark re-runs the batch with that input.

    Written whole or not at all, as Spark writes its logs; a checksum file of another content is removed
    first (Hadoop's local file system would refuse the file), none is needed.
    """
    folder = Loc.of(ckpt) / "offsets"
    (folder / f".{batch}.crc").unlink(missing_ok=True)
    (folder / str(batch)).write_text(text)


def replay_batch(ckpt: str | Path) -> int | None:
    """The batch a restart will re-run: its offsets are logged but it has no commit."""
    last_off, last_commit = last_offsets_batch(ckpt), last_committed_batch(ckpt)
    if last_off is None or (last_commit is not None and last_commit >= last_off):
        return None
    return last_off


# ------------------------------------------------------------------ cutting a checkpoint
# What Spark 4.2 writes under a checkpoint (HDFS-backed state store, local file system):
#   metadata, .metadata.crc                  the query id, written once
#   sources/<i>/0 (+ .0.crc)                 the source's initial offsets, written once
#   offsets/<N> (+ .<N>.crc)                 batch N's input ranges, written before it runs
#   commits/<N> (+ .<N>.crc)                 batch N done, written after its sink committed
#   state/<op>/_metadata/metadata            operator metadata; state/<op>/<part>/_metadata/schema: state schema
#   state/<op>/<part>/[<store>/]<v>.delta    the changes of state version v (= after batch v-1), .<v>.delta.crc
#   state/<op>/<part>/[<store>/]<v>.snapshot the whole state at version v, written by the maintenance thread
#   .<name>.<uuid>[.TID<n>].tmp (+ ..crc)    a file being written; renamed to <name> when complete
# RocksDB stores name their files <v>.zip, <v>.changelog or <v>_<uuid>.zip, with SST files kept aside.

_STATE_FILE = re.compile(r"^\.?(\d+)(?:_[0-9A-Za-z-]+)?\.(delta|snapshot|changelog|zip)(?:\.crc)?$")
_LOG_FILE = re.compile(r"^\.?(\d+)(?:\.crc)?$")


def is_temporary(name: str) -> bool:
    """A file Spark is still writing (atomic writes go to a temporary name, then rename)."""
    return name.endswith(".tmp") or name.endswith(".tmp.crc")


def discard_torn_log_writes(ckpt: str | Path) -> list[str]:
    """Remove the temporary files a killed driver left in ``offsets/`` and ``commits/``; return their names.

    A driver killed while Spark writes ``offsets/N`` leaves ``.N.<uuid>.tmp``. Spark never reads it, but
    when no ``offsets/`` entry is complete (a kill during the very first batch's write) Spark takes the
    checkpoint for a new one and refuses to start because ``offsets/`` is not empty
    (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY): every restart would fail the same way. Only the driver
    writes these logs and only one driver runs, so before its query starts nothing else is writing them.
    """
    removed = []
    for log_dir in ("offsets", "commits"):
        folder = Loc.of(ckpt) / log_dir
        for p in sorted(folder.iterdir(), key=str):
            if is_temporary(p.name) and p.is_file():
                p.unlink(missing_ok=True)
                removed.append(f"{log_dir}/{p.name}")
    return removed


def state_version(name: str) -> int | None:
    """The state store version a file under ``state/`` belongs to, or None (schema, metadata, SST files)."""
    m = _STATE_FILE.match(name)
    return int(m.group(1)) if m else None


def log_batch(name: str) -> int | None:
    """The batch of a file in ``offsets/`` or ``commits/`` (``7`` or its checksum ``.7.crc``)."""
    m = _LOG_FILE.match(name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class Cut:
    """The files of a checkpoint that make a consistent state at a batch boundary.

    ``None`` bounds keep everything of that kind; ``-1`` keeps nothing.
    """
    offsets_through: int | None
    commits_through: int | None
    state_through: int | None

    @classmethod
    def everything(cls) -> "Cut":
        return cls(None, None, None)

    @classmethod
    def after_batch(cls, n: int) -> "Cut":
        """Batch n committed; batch n+1's offsets kept if logged, so a restore re-runs it on the same range."""
        return cls(n + 1, n, n + 1)

    @classmethod
    def replaying_batch(cls, n: int) -> "Cut":
        """Batch n made the replay batch: its offsets kept, its commit and the state it wrote dropped."""
        return cls(n, n - 1, n)

    def keeps(self, rel: PurePosixPath) -> bool:
        parts = rel.parts
        name = parts[-1]
        if is_temporary(name):
            return False
        top = parts[0] if len(parts) > 1 else None
        if top in ("offsets", "commits") and len(parts) == 2:
            limit = self.offsets_through if top == "offsets" else self.commits_through
            batch = log_batch(name)
            return batch is None or limit is None or batch <= limit
        if top == "state":
            version = state_version(name)
            return version is None or self.state_through is None or version <= self.state_through
        return True


def state_gaps(ckpt: str | Path, version: int) -> list[str]:
    """Why an HDFS-backed state store under ``ckpt`` cannot load ``version``; empty when every store can.

    Spark loads version v from the newest ``<s>.snapshot`` with s <= v plus the deltas s+1..v
    (or the deltas 1..v). Stores of other providers (RocksDB zips) are not checked.
    """
    base_loc = Loc.of(ckpt)
    if version < 1:
        return []
    by_folder: dict[PurePosixPath, list[str]] = {}
    for rel in (base_loc / "state").files():
        by_folder.setdefault(PurePosixPath("state") / rel.parent, []).append(rel.name)
    problems = []
    for folder, names in sorted(by_folder.items()):
        deltas, snaps = set(), set()
        for name in names:
            m = _STATE_FILE.match(name)
            if m and not name.startswith(".") and m.group(2) in ("delta", "snapshot"):
                (deltas if m.group(2) == "delta" else snaps).add(int(m.group(1)))
        if not deltas and not snaps:
            continue
        base = max((s for s in snaps if s <= version), default=0)
        missing = [v for v in range(base + 1, version + 1) if v not in deltas]
        if missing:
            problems.append(f"{folder}: state version {version} needs "
                            f"{'snapshot %d and ' % base if base else ''}deltas {base + 1}..{version}, "
                            f"missing {missing[:5]}")
    return problems
