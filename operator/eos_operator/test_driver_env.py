"""``run --test-driver-env [ATTEMPT:]NAME=VALUE``: environment added to the driver Pods this operator creates, for
the negative controls and fault injection of the tests on real nodes, where a stream cannot set the runtime's own
variables (``job.podTemplate`` refuses ``EOS_*``, eos_job.pod_template). ``EOS_UNSAFE_DISABLE=fence`` switches the
epoch fence off in every driver; ``0:EOS_FAULT_HOLD_OPEN=600`` holds the first driver's transactions open. Never
for a real deployment: the operator logs an error for each at start (the runtime logs ``UNSAFE`` too)."""
from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

_ENV: list[tuple[int | None, str, str]] = []   # (attempt or None for every attempt, name, value)


def parse(item: str) -> tuple[int | None, str, str]:
    """``[ATTEMPT:]NAME=VALUE``; a ValueError names the form when it is not that."""
    head, sep, value = item.partition("=")
    attempt, colon, name = head.rpartition(":")
    if not sep or not name or (colon and not attempt.isdigit()):
        raise ValueError(f"--test-driver-env {item!r}: expected [ATTEMPT:]NAME=VALUE, e.g. "
                         "EOS_UNSAFE_DISABLE=fence or 0:EOS_FAULT_HOLD_OPEN=600")
    return (int(attempt) if colon else None), name, value


def configure(items: list[str]) -> None:
    _ENV[:] = [parse(i) for i in items]
    for attempt, name, value in _ENV:
        log.error("TEST ONLY: driver Pods%s get %s=%s (--test-driver-env); never in a real deployment",
                  "" if attempt is None else f" of attempt {attempt}", name, value)


def for_attempt(attempt: int) -> list[dict[str, Any]]:
    return [{"name": n, "value": v} for a, n, v in _ENV if a is None or a == attempt]
