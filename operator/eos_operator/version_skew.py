"""The operator <-> job runtime version-skew policy (docs/api-policy.md): a stream's runtime is the operator's
version or one minor version older. Pure: the planner reports a runtime outside it as Degraded
(RuntimeVersionSkew) and keeps the stream running."""
from __future__ import annotations

import re

REASON = "RuntimeVersionSkew"
_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:[-+.]?[0-9A-Za-z.+-]*)?$")   # 0.3.1, 0.3.1rc1, 0.3.1+local


def _minor(version: str) -> tuple[int, int] | None:
    found = _VERSION.match(version)
    return (int(found.group(1)), int(found.group(2))) if found else None


def skew_message(operator: str, runtime: str | None) -> str | None:
    """Why ``runtime`` (the version the stream's driver reported) is outside the policy for ``operator``, with
    the fix; None when it is inside, or when nothing was reported yet."""
    if runtime is None:
        return None
    mine = _minor(operator)
    if mine is None:
        raise ValueError(f"the operator's own version {operator!r} is not MAJOR.MINOR.PATCH")
    fix = f"set job.image to an image of runtime {mine[0]}.{mine[1]} (the operator's own image is one)"
    theirs = _minor(runtime)
    if theirs is None:
        return f"runtime version {runtime!r} is not MAJOR.MINOR.PATCH, so its skew cannot be judged: {fix}"
    policy = "(supported: the operator's minor version or one older, docs/api-policy.md)"
    if theirs > mine:
        return (f"runtime {runtime} is newer than operator {operator} {policy}: upgrade the operator (the chart) "
                f"to {theirs[0]}.{theirs[1]} first, or set job.image to an image of runtime {mine[0]}.{mine[1]}")
    if theirs[0] != mine[0]:
        return f"runtime {runtime} is another major version than operator {operator} {policy}: {fix}"
    if mine[1] - theirs[1] > 1:
        return f"runtime {runtime} is more than one minor version older than operator {operator} {policy}: {fix}"
    return None
