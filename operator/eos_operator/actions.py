"""What a planner decides, for streams and snapshots alike: the side effects, the events, and the plan.

Planners (``planner``, ``snapshot_planner``) build a :class:`Plan` with a :class:`Step`;
the reconcile loop (``loop``) writes the plan's status first (the write-ahead log),
posts its events and then carries out its actions. Nothing here does I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Union


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class DeletePod:
    name: str
    grace_seconds: int


@dataclass(frozen=True)
class Resolve:
    config: Any            # eos_job.spec.RunConfig
    attempt: int
    spec_hash: str
    facts: Any = None      # eos_job.status.CheckpointFacts read by a probe Pod (store pvc), else None


@dataclass(frozen=True)
class ApplyConfigMap:
    body: dict


@dataclass(frozen=True)
class ApplyService:
    body: dict
    best_effort: bool = False   # refused: reported, and the plan's other actions still run (the Spark UI Service)


@dataclass(frozen=True)
class CreatePod:
    body: dict


@dataclass(frozen=True)
class DeleteConfigMap:
    name: str
    owner_uid: str         # deleted only if this uid (the stream's) owns it: a name alone proves nothing


@dataclass(frozen=True)
class DeleteService:
    name: str
    owner_uid: str         # as DeleteConfigMap
    best_effort: bool = False


@dataclass(frozen=True)
class CreateSnapshot:
    body: dict


@dataclass(frozen=True)
class DeleteSnapshot:
    name: str


Action = Union[DeletePod, Resolve, ApplyConfigMap, ApplyService, CreatePod, DeleteConfigMap, DeleteService,
               CreateSnapshot, DeleteSnapshot]


@dataclass
class Plan:
    status: Any                          # the resource's new status model, persisted before anything is done
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None   # look again within this many seconds
    again: bool = False                  # re-observe and re-plan right after acting
    finished: bool = True                # deletion only: every child is gone, the finalizer may go

    @property
    def state(self) -> str | None:
        """The status's headline state: a stream's lifecycle state, a snapshot's state."""
        return getattr(self.status, "lifecycle_state", None) or getattr(self.status, "state", None)

    def summary(self) -> str:
        acts = ", ".join(type(a).__name__ for a in self.actions) or "nothing"
        return f"{self.state}: {acts}"


class Step:
    """Working state of one planning step: a copy of the status to change, what was observed, the plan."""

    max_message: int | None = None   # events longer than this are cut (None: as they are)

    def __init__(self, status: Any, observed: Any):
        self.st = status.model_copy(deep=True)
        self.obs = observed
        self.plan = Plan(status=self.st)

    def event(self, type_: Literal["Normal", "Warning"], reason: str, message: str) -> None:
        if self.max_message is not None:
            message = message[:self.max_message]
        self.plan.events.append(Event(type_, reason, message))

    def act(self, action: Action) -> None:
        self.plan.actions.append(action)

    def done(self, *, requeue_after: float | None = None, again: bool = False, finished: bool = True) -> Plan:
        self.plan.status = self.st
        self.plan.requeue_after = requeue_after
        self.plan.again = again
        self.plan.finished = finished
        return self.plan
