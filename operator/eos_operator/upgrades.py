"""How a spec change is applied.

Today every change that affects the running job is a restart on the live
checkpoint, preceded by resolution (what ``upgradeMode: last-state`` means).
The snapshot and stateless upgrade modes, and draining a partially committed
batch before the slot count P changes under a new transactional-id generation
(see the protocol's "Determinism" section), come with the upgrade issue: they
belong in :func:`plan_spec_change`, which the planner calls for every change.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from eos_job.spec import ExactlyOnceStreamSpec

# Fields whose change needs no new driver: the operator acts on them itself.
OPERATOR_ONLY_FIELDS = (("job", "state"), ("restartNonce",), ("restartStrategy",), ("upgradeMode",))


def _strip(doc: dict[str, Any]) -> dict[str, Any]:
    doc = json.loads(json.dumps(doc))
    for path in OPERATOR_ONLY_FIELDS:
        node = doc
        for key in path[:-1]:
            node = node.get(key) or {}
        node.pop(path[-1], None)
    return doc


def _diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for key in sorted(set(old) | set(new)):
            out += _diff(old.get(key), new.get(key), f"{prefix}.{key}" if prefix else key)
        return out
    return [] if old == new else [prefix or "spec"]


def run_affecting_changes(last_reconciled: str | None, spec: ExactlyOnceStreamSpec) -> list[str]:
    """Paths (under spec) whose change needs a new driver, compared with the running spec."""
    if not last_reconciled:
        return []
    try:
        old = json.loads(last_reconciled)
    except ValueError:
        return ["spec"]
    return _diff(_strip(old), _strip(spec.wire()))


def spec_json(spec: ExactlyOnceStreamSpec) -> str:
    return json.dumps(spec.wire(), sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class SpecChangePlan:
    kind: Literal["restart"]
    bump_tx_generation: bool
    explanation: str


def plan_spec_change(changes: list[str], spec: ExactlyOnceStreamSpec) -> SpecChangePlan:
    """For now: restart on the live checkpoint (resolution first), same generation."""
    note = ""
    if spec.upgrade_mode != "last-state":
        note = (f"; upgradeMode {spec.upgrade_mode} is not implemented yet, so the restart keeps the live "
                "checkpoint (last-state)")
    return SpecChangePlan(kind="restart", bump_tx_generation=False,
                          explanation=f"spec changed ({', '.join(changes[:5])}"
                                      f"{', ...' if len(changes) > 5 else ''}): restarting with resolution{note}")
