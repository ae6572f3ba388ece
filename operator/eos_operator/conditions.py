"""Conditions per the Kubernetes API conventions.

Keyed by ``type``; ``lastTransitionTime`` changes only when ``status`` flips
(a new reason or message alone does not move it); every condition carries the
``observedGeneration`` it was computed for.

Beside Ready, Progressing and Degraded, every object carries Reconciling and Stalled: the two conditions
kstatus (``sigs.k8s.io/cli-utils``, read by Flux and ``kpt``) looks for before anything else. Reconciling True:
the operator is working towards the spec; Stalled True: it has stopped and waits for a person; both False when
the object is where its spec asks it to be (:func:`kstatus_conditions`).
"""
from __future__ import annotations

from datetime import datetime
from typing import Literal

from eos_job.status import Condition

from .timeutil import fmt

READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
RECONCILING = "Reconciling"
STALLED = "Stalled"
ORDER = (READY, PROGRESSING, DEGRADED, RECONCILING, STALLED)

Status = Literal["True", "False", "Unknown"]
Cond = tuple[Status, str, str]   # (status, reason, message)

SUSPENDED = "Suspended"   # Ready's reason for a stream whose job.state is suspended (and stopped)
NOT_STALLED: Cond = ("False", "AsExpected", "")


def kstatus_conditions(ready: Cond, progressing: Cond, degraded: Cond, *, spec_rejected: bool) -> tuple[Cond, Cond]:
    """A stream's Reconciling and Stalled, from the three conditions the planner decided.

    Reconciling is Progressing under the name kstatus reads. Stalled is True when the operator has stopped
    working towards the spec: Progressing False while Ready is False (an invalid spec, restarts exhausted, a
    refused batch, a blocked upgrade), or while the spec was rejected (a failed pre-flight or a rollback: the
    last stable spec runs and Ready stays True, but the spec in the object does not run). Its reason and
    message are Degraded's (what went wrong), followed by Progressing's message when nothing runs (what to do).
    A suspended stream is neither: it is where its spec asks it to be."""
    stopped = progressing[0] == "False" and (
        spec_rejected or (ready[0] != "True" and ready[1] != SUSPENDED))
    if not stopped:
        return progressing, NOT_STALLED
    _, reason, message = degraded if degraded[0] == "True" else ready
    if ready[0] != "True" and progressing[2]:
        message = f"{message}; {progressing[2]}" if message else progressing[2]
    return progressing, ("True", reason, message)


def snapshot_kstatus_conditions(state: str, ready: Cond, *, deleting: bool) -> tuple[Cond, Cond]:
    """A snapshot's Reconciling and Stalled: a one-shot job reconciles until Completed or Failed; Failed
    (retries exhausted, or a spec it cannot carry out) is Stalled, with Ready's reason and message."""
    if not deleting and state == "Completed":
        return ("False", state, ""), NOT_STALLED
    if not deleting and state == "Failed":
        return ("False", state, ""), ("True", ready[1], ready[2])
    return ("True", ready[1], ready[2]), NOT_STALLED


def set_condition(conditions: list[Condition], type_: str, status: Status, reason: str, message: str,
                  *, generation: int | None, now: datetime) -> list[Condition]:
    """A new list with condition ``type_`` set; the others unchanged, in a stable order."""
    by_type = {c.type: c for c in conditions}
    old = by_type.get(type_)
    since = old.last_transition_time if old is not None and old.status == status else fmt(now)
    by_type[type_] = Condition(type=type_, status=status, reason=reason, message=message,
                               observed_generation=generation, last_transition_time=since)
    known = [by_type[t] for t in ORDER if t in by_type]
    others = sorted((c for t, c in by_type.items() if t not in ORDER), key=lambda c: c.type)
    return known + others


def get_condition(conditions: list[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)
