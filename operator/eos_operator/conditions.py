"""Conditions per the Kubernetes API conventions.

Keyed by ``type``; ``lastTransitionTime`` changes only when ``status`` flips
(a new reason or message alone does not move it); every condition carries the
``observedGeneration`` it was computed for.
"""
from __future__ import annotations

from datetime import datetime
from typing import Literal

from eos_job.status import Condition

from .timeutil import fmt

READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
ORDER = (READY, PROGRESSING, DEGRADED)

Status = Literal["True", "False", "Unknown"]


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
