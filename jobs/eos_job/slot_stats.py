"""What each slot task spent its fixed costs on, carried back to the driver in its commit row and summed per batch.

A slot task either finds its slot's producer held in its Python worker and clean since its last commit (a pool
hit, trusted: no fence, no ledger read, amendment A2) or makes a new one, which fences (``init_transactions``) before its ledger read. Spark hands a slot's task to
whichever Python worker is idle, so a slot's producer is often held by another worker, and the new producer's
fence makes that one useless: such re-fences were silent (issue 29). These counters make them visible in the
driver's per-batch log line and in the sink benchmark. They are measurements only: nothing decides on them.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

# The commit row's extra columns (sink.COMMIT_SCHEMA), after the protocol's SlotCommit columns.
SCHEMA = ("tasks int, whole_skips int, pool_hits int, new_producers int, stale_producers int, fences int, "
          "ledger_reads int, fence_ms double, ledger_ms double, commit_ms double, trusted int, trusted_fallbacks int")


@dataclass
class SlotStats:
    tasks: int = 0            # slot tasks counted (each reports 1)
    whole_skips: int = 0      # tasks of a batch skipped as a whole: no producer, no ledger read
    pool_hits: int = 0        # tasks that wrote or skipped with the producer their worker held, not fencing again
    new_producers: int = 0    # producers made: a task's worker held none, held a stale one, or an error retried
    stale_producers: int = 0  # held producers not trusted (not clean, or another key or epoch): fenced again
    fences: int = 0           # init_transactions calls
    ledger_reads: int = 0     # reads of the slot's newest ledger record
    fence_ms: float = 0.0     # wall time in init_transactions
    ledger_ms: float = 0.0    # wall time in the ledger reads
    commit_ms: float = 0.0    # wall time in commit_transaction (its flush of the records still queued included)
    trusted: int = 0          # decisions on a clean held producer's last record: no fence, no read (A2)
    trusted_fallbacks: int = 0   # trusted transactions that failed (another worker fenced the id): fence, read again

    def add(self, other: "SlotStats") -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def to_row(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        return (f"slot tasks {self.tasks}: {self.pool_hits} pool hits, {self.new_producers} new producers, "
                f"{self.stale_producers} stale, {self.fences} fences, {self.ledger_reads} ledger reads; "
                f"ms fencing {self.fence_ms:.0f}, reading the ledger {self.ledger_ms:.0f}, "
                f"committing {self.commit_ms:.0f}; {self.trusted} trusted, {self.trusted_fallbacks} of them fell back")


NAMES = tuple(f.name for f in fields(SlotStats))


def split_row(row: dict) -> tuple[dict, SlotStats]:
    """A commit row: the protocol's SlotCommit fields, and the task's counters."""
    commit = {k: v for k, v in row.items() if k not in NAMES}
    return commit, SlotStats(**{k: row[k] for k in NAMES if row.get(k) is not None})


def batch_total(stats: list[SlotStats]) -> SlotStats:
    total = SlotStats()
    for s in stats:
        total.add(s)
    return total


def problems(total: SlotStats, slot_tasks: int) -> list[str]:
    """What the counters of one batch's (or run's) slot tasks cannot be if every task was counted once and
    every producer fenced before use; [] when they are consistent."""
    out = []
    if total.tasks != slot_tasks:
        out.append(f"{total.tasks} tasks counted, {slot_tasks} ran")
    if total.fences < total.new_producers:
        out.append(f"{total.new_producers} new producers but {total.fences} fences")
    writing = total.tasks - total.whole_skips
    if total.pool_hits + total.new_producers < writing:
        out.append(f"{writing} tasks with a producer but {total.pool_hits} pool hits and {total.new_producers} "
                   "new producers")
    if total.pool_hits > writing or total.stale_producers > total.new_producers:
        out.append(f"{total.pool_hits} pool hits and {total.stale_producers} stale producers in {writing} tasks "
                   f"with {total.new_producers} new producers")
    if total.ledger_reads > total.pool_hits + total.new_producers + total.stale_producers:
        out.append(f"{total.ledger_reads} ledger reads, more than one per producer used")
    if total.trusted > total.pool_hits or total.trusted_fallbacks > total.trusted:
        out.append(f"{total.trusted} trusted tasks ({total.trusted_fallbacks} fallbacks) but {total.pool_hits} "
                   "pool hits")
    return out
