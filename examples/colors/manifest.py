"""The colors stream as a manifest: what `kubectl apply` and `eos-job run --config` read."""
from __future__ import annotations

from pathlib import Path
from typing import Any


def colors_manifest(name: str, bootstrap: str, events: str, counts: str, checkpoint: str | Path, *,
                    dlq: str | None = None, parallelism: int = 2, namespace: str | None = None,
                    max_offsets_per_trigger: int | None = None, trigger_interval_ms: int | None = None,
                    job: dict[str, Any] | None = None, sink: dict[str, Any] | None = None,
                    **spec: Any) -> dict[str, Any]:
    """An ExactlyOnceStream of the colors job (drop orange, count per color) from ``events`` to ``counts``,
    its checkpoint on a local path. ``job`` and ``sink`` add fields to those sections; any other keyword is
    a further spec field (``restartStrategy=...``, ``upgradeMode=...``)."""
    body: dict[str, Any] = {
        "job": {"module": "examples.colors.job", "parallelism": parallelism,
                # A restore re-runs batches the old checkpoint logged with their original offsets: keep them.
                "sparkConf": {"spark.sql.streaming.minBatchesToRetain": "100"}, **(job or {})},
        "source": {"bootstrapServers": bootstrap, "topics": [events]},
        "sink": {"bootstrapServers": bootstrap, "topic": counts, **({"deadLetterTopic": dlq} if dlq else {}),
                 **(sink or {})},
        "checkpoint": {"store": "local", "path": str(checkpoint)},
        **spec,
    }
    if max_offsets_per_trigger:
        body["source"]["maxOffsetsPerTrigger"] = max_offsets_per_trigger
    if trigger_interval_ms is not None:
        body["triggerIntervalMs"] = trigger_interval_ms
    metadata = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": "streaming.eos.dev/v1beta1", "kind": "ExactlyOnceStream", "metadata": metadata,
            "spec": body}
