"""A slot's rows as they arrive from Spark: produced while they arrive, counted on the way, kept for a retry.

The slot task used to collect every Arrow batch of its slot before producing the first record: memory grew
with the batch, and producing waited for the whole shuffle read. ``SlotRows`` hands the batches out as
Spark delivers them, adding each one's row count and record hashes to the slot's count and digest (the
digest is a sum, so it does not depend on how the rows are cut into batches), and keeps what it handed out
so that a second round of the same task (a fresh fence after a producer error, or records the broker
refused going to the dead-letter topic) writes the same rows again. What it keeps is bounded: the first
``memory_limit`` bytes stay in memory, the rest goes to a local file in Arrow's IPC format
(``TMPDIR``: the Pod's scratch volume) that is deleted when the task ends.
"""
from __future__ import annotations

import os
import tempfile
from typing import Iterable, Iterator

import pyarrow as pa

from .protocol import DIGEST_MASK, HASH_COL, digest_of_hashes

MEMORY_LIMIT = int(os.environ.get("EOS_SLOT_MEMORY_BYTES", 64 * 1024 * 1024))


class SlotRows:
    """One slot's Arrow batches, read once from Spark, each handed out as soon as it arrives."""

    def __init__(self, source: Iterable[pa.RecordBatch], memory_limit: int = MEMORY_LIMIT):
        self._source: Iterator[pa.RecordBatch] | None = iter(source)
        self._memory_limit = memory_limit
        self._kept: list[pa.RecordBatch] = []
        self._kept_bytes = 0
        self._spill = None          # (file, writer) once the kept batches outgrew memory_limit
        self._spilled = 0
        self.count = 0
        self.digest = 0

    @property
    def complete(self) -> bool:
        """Every batch of the slot arrived: count and digest are final."""
        return self._source is None

    @property
    def spilled_batches(self) -> int:
        return self._spilled

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        """Every batch of the slot: those already seen, then the rest as it arrives."""
        yield from self._kept
        if self._spilled:
            yield from self._read_spill()
        while True:
            b = self._take()
            if b is None:
                return
            yield b

    def any_rows(self) -> bool:
        """Read until a batch with rows arrived (True) or the slot ended without one (False)."""
        if self.count:
            return True
        while self._source is not None:
            b = self._take()
            if b is not None and b.num_rows:
                return True
        return self.count > 0

    def drain(self) -> tuple[int, int]:
        """Read the rest without handing it out; the final (count, digest)."""
        while self._take() is not None:
            pass
        return self.count, self.digest

    def close(self) -> None:
        if self._spill is not None:
            self._spill[0].close()
            self._spill = None

    # ------------------------------------------------------------------ internals
    def _take(self) -> pa.RecordBatch | None:
        if self._source is None:
            return None
        b = next(self._source, None)
        if b is None:
            self._source = None
            return None
        if b.num_rows:
            self.count += b.num_rows
            hashes = b.column(b.schema.get_field_index(HASH_COL)).to_numpy(zero_copy_only=False)
            self.digest = (self.digest + digest_of_hashes(hashes)) & DIGEST_MASK
        self._keep(b)
        return b

    def _keep(self, b: pa.RecordBatch) -> None:
        if self._spill is None and self._kept_bytes + b.nbytes <= self._memory_limit:
            self._kept.append(b)
            self._kept_bytes += b.nbytes
            return
        if self._spill is None:
            f = tempfile.NamedTemporaryFile(prefix="eos-slot-", suffix=".arrows")
            self._spill = (f, pa.ipc.new_stream(f, b.schema))
        f, writer = self._spill
        writer.write_batch(b)
        self._spilled += 1

    def _read_spill(self) -> Iterator[pa.RecordBatch]:
        # A reader of its own (a memory map of the file), so that the writer's position never moves; the
        # batches written so far, counted, since the stream has no end marker while it is still written.
        f = self._spill[0]
        f.flush()
        reader = pa.ipc.open_stream(pa.memory_map(f.name))
        for _ in range(self._spilled):
            yield reader.read_next_batch()
