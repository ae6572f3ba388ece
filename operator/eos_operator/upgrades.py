"""How a spec change is applied: which fields matter, and the upgrade modes.

Every changed field (a path under spec) falls in one class:

* **ignore** - the operator acts on it itself, no new driver: ``restartStrategy``
  (read at the next failure), ``restartNonce`` (its own restart, see the
  planner), ``upgradeMode`` (read at the next upgrade), ``job.state``
  (suspend and resume), the snapshot and pre-flight settings,
  ``source.replayHorizonWarningSeconds`` (read by the replay-horizon check) and
  ``job.metrics.uiService`` (the Spark UI Service, made or deleted beside the driver).
* **restart** - a new driver on the live checkpoint, whatever the upgrade mode:
  the change alters how the job runs, not what it computes or where its state
  and output live. Driver and executor resources, service account, deploy mode,
  driver metrics, trigger interval, source connection settings and rate limit, sink producer
  settings and credentials. ``source.startingOffsets`` is here too: it only
  matters for a fresh checkpoint.
* **upgrade** - a change of what the job computes or where its state and output
  live: ``job.image``, ``job.module``, ``job.function``, ``job.args``,
  ``job.sparkConf``, ``job.parallelism``, ``job.outputMode``, ``source.topics``,
  the sink's cluster and topics, ``checkpoint.*``, and any field not named
  above (unknown means careful). It runs by ``spec.upgradeMode``:

  - ``snapshot`` (default): every driver Pod is started with
    ``EOS_SNAPSHOT_ON_STOP=<checkpoint.path>/snapshots/<stream>-<uid8>-a<attempt>``,
    so a graceful stop (SIGTERM, a clean batch boundary) leaves a snapshot. The
    upgrade stops the driver, waits for it to be gone, reads the manifest back,
    resolves, and starts the new spec in a *new* checkpoint location
    ``<checkpoint.path>/ckpt-<uid>-<attempt>`` seeded from the snapshot
    (``RunConfig.restoreFrom``). The copy keeps the checkpoint identity, so the
    ledger keys continue and nothing is written twice. If no snapshot could be
    taken (the driver was already dead), the upgrade falls back to last-state
    only when the live checkpoint is intact (metadata and offsets), says so in an
    event and the condition, and is blocked otherwise - never silently stateless.
    With ``checkpoint.store: pvc`` the operator cannot read the volume: it does not
    verify the snapshot, says so, and the driver fails its start if the
    snapshot is missing (then the restart strategy applies).
  - ``last-state``: a restart on the live checkpoint (resolution first).
  - ``stateless``: a fresh checkpoint location, no restore. A new checkpoint
    identity means the ledger skips nothing: the source is read again from
    ``source.startingOffsets`` and, with ``earliest``, consumers see the output
    again. Only when asked for.

A ``job.parallelism`` or ``job.slotsFrom`` change bumps ``status.txGeneration`` at
the upgrade: the slot count P, or how rows are cut into slots, changes under a
new transactional-id generation. A snapshot
upgrade stops at a clean boundary; any other upgrade that finds a partially
committed batch first finishes it with the old spec and generation (the
planner's drain step).

The progress of an upgrade is written to ``status.upgrade`` before anything is
stopped (the write-ahead log); see the planner.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from eos_job.spec import ExactlyOnceStreamSpec

ChangeClass = Literal["ignore", "restart", "upgrade"]

# Fields whose change needs no new driver: the operator acts on them itself.
OPERATOR_ONLY_FIELDS = (("job", "state"), ("restartNonce",), ("restartStrategy",), ("upgradeMode",),
                        ("snapshots",), ("snapshotNonce",), ("upgradePreFlight",),
                        ("upgradeReadinessTimeoutSeconds",), ("source", "replayHorizonWarningSeconds"),
                        ("job", "metrics", "uiService"))

# Fields whose change needs a new driver but keeps its state: a restart on the live checkpoint.
RESTART_ONLY_FIELDS = (
    "job.driver", "job.executor", "job.serviceAccountName", "job.deployMode", "job.metrics", "job.eventLog",
    "triggerIntervalMs",
    "source.bootstrapServers", "source.maxOffsetsPerTrigger", "source.options", "source.startingOffsets",
    "source.acceptDataLoss",
    "sink.producerConfig", "sink.credentials", "sink.transactionTimeoutMs", "sink.auditHeaders",
    "sink.writer",   # the same protocol, ids and ledger either way: either writer finishes the other's batch
    "checkpoint.s3.credentials",   # whose identity reads the bucket, not where it is (the keys' Secret is upgrade)
)


def classify(path: str) -> ChangeClass:
    """The class of a change to ``path`` (dotted, under spec, as :func:`run_affecting_changes` names it)."""
    def under(prefix: str) -> bool:
        return path == prefix or path.startswith(prefix + ".")
    if any(under(".".join(p)) for p in OPERATOR_ONLY_FIELDS):
        return "ignore"
    if any(under(p) for p in RESTART_ONLY_FIELDS):
        return "restart"
    return "upgrade"


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
    try:
        # Through the model: a field a newer operator added reads as its default, which is no change
        # (an operator upgrade must not upgrade every stream).
        old = ExactlyOnceStreamSpec.model_validate(old).wire()
    except ValueError:
        pass   # a spec this version would refuse: compared as recorded
    return _diff(_strip(old), _strip(spec.wire()))


def spec_json(spec: ExactlyOnceStreamSpec) -> str:
    return json.dumps(spec.wire(), sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class SpecChangePlan:
    kind: Literal["restart", "upgrade"]
    mode: Literal["snapshot", "last-state", "stateless"]   # how the upgrade runs (restart: last-state)
    bump_tx_generation: bool
    explanation: str


def plan_spec_change(changes: list[str], spec: ExactlyOnceStreamSpec) -> SpecChangePlan:
    """A restart on the live checkpoint if every change is restart-only, else an upgrade by upgradeMode."""
    listed = f"{', '.join(changes[:5])}{', ...' if len(changes) > 5 else ''}"
    upgrade = [c for c in changes if classify(c) == "upgrade"]
    if not upgrade:
        return SpecChangePlan(kind="restart", mode="last-state", bump_tx_generation=False,
                              explanation=f"spec changed ({listed}): restart-only fields, restarting on the live "
                                          "checkpoint with resolution")
    bump = [c for c in upgrade if c in ("job.parallelism", "job.slotsFrom")]
    how = {"snapshot": "stopping the driver with a snapshot and starting the new spec from it",
           "last-state": "restarting on the live checkpoint (upgradeMode last-state)",
           "stateless": "starting from a fresh checkpoint (upgradeMode stateless): a new checkpoint identity, "
                        "the source is read again from startingOffsets and the ledger skips nothing"}
    text = f"spec changed ({listed}): upgrade, {how[spec.upgrade_mode]}"
    if bump:
        text += f"; {' and '.join(bump)} changed: new transactional-id generation"
    return SpecChangePlan(kind="upgrade", mode=spec.upgrade_mode, bump_tx_generation=bool(bump), explanation=text)


def current_checkpoint_dir(status_dir: str | None, last_reconciled: str | None, spec: ExactlyOnceStreamSpec) -> str:
    """The checkpoint location the current (or last) driver runs on.

    ``status.checkpointDir`` once recorded; before that, ``live`` under the path of
    the spec that driver was launched with (the new spec may name another path).
    """
    if status_dir:
        return status_dir
    if last_reconciled:
        try:
            path = json.loads(last_reconciled)["checkpoint"]["path"]
            return str(path).rstrip("/") + "/live"
        except (ValueError, KeyError, TypeError):
            pass
    return spec.checkpoint.root() + "/live"
