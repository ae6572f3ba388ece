"""Fakes of the operator's adapters other than the API server (fakes.FakeKube): the clock, resolution and
the ledger's progress reads, with switches that inject faults."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

from eos_job.spec import RunConfig
from eos_job.status import ReplayHorizon, ResolutionReport
from eos_operator.adapters import LedgerTip

if TYPE_CHECKING:
    from .fakes import FakeKube

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)


class Crash(BaseException):
    """Simulates the operator process dying at an injected point (not an Exception: nothing catches it)."""


class FakeClock:
    def __init__(self, start: datetime = T0):
        self.t = start

    def now(self) -> datetime:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += timedelta(seconds=seconds)


@dataclass
class FakeResolver:
    calls: list[RunConfig] = field(default_factory=list)
    fail_next: int = 0                 # the next N calls raise
    error: str = "KafkaException: sink unreachable"
    crash_after: bool = False          # the operator dies right after resolution returns
    kube: "FakeKube | None" = None     # to assert invariants at resolution time

    async def resolve(self, config: RunConfig, s3=None, kafka=None, facts=None) -> ResolutionReport:
        self.calls.append(config)
        self.s3, self.facts = s3, facts
        if self.kube is not None:
            # A driver Pod that ended (Failed or Succeeded: its containers stopped) may stay for its log; one
            # that may still run may not.
            alive = [p for p in self.kube.driver_pods(config.stream.namespace, config.stream.name)
                     if (p.get("status") or {}).get("phase") not in ("Failed", "Succeeded")]
            assert not alive, f"resolution ran while driver Pods may run: {[p['metadata']['name'] for p in alive]}"
        if self.fail_next > 0:
            self.fail_next -= 1
            raise RuntimeError(self.error)
        report = ResolutionReport(stream_uid=config.stream.uid, generation=config.stream.generation,
                                  slots=config.spec.job.parallelism,
                                  fenced_transactional_ids=config.spec.job.parallelism,
                                  last_complete_batch=len(self.calls) - 1, summary=f"resolution #{len(self.calls)}")
        if self.crash_after:
            self.crash_after = False
            raise Crash("operator killed after resolution")
        return report


@dataclass
class FakeProgress:
    batch: int | None = None
    calls: int = 0
    horizon: ReplayHorizon | None = None
    horizon_calls: int = 0
    nondeterministic: int = 0
    runtime_version: str | None = None

    async def ledger_tip(self, config: RunConfig, kafka=None) -> LedgerTip | None:
        self.calls += 1
        return None if self.batch is None else LedgerTip(self.batch, self.nondeterministic, self.runtime_version)

    async def replay_horizon(self, config: RunConfig, kafka=None) -> ReplayHorizon | None:
        self.horizon_calls += 1
        return self.horizon

    def forget(self, namespace: str, name: str) -> None:
        self.forgotten = (namespace, name)
