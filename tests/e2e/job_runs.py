"""The job-level building blocks of the end-to-end tests (no Kubernetes): a local run's config (and its
checkpoint on a PVC), the ``eos_job`` command line, waiting for a run to consume its source, and a run's
exactness. The stream verifiers they use are ``tests.e2e.streams``'."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

from eos_job.spec import load_run_config
from eos_stack.cluster import wait_until
from examples.colors.local_run import REPO, ColorsRun
from tests.e2e.exactness import assert_exactly_once
from tests.e2e.streams import assert_ids_exactly_once


def run_config(run: ColorsRun):
    import yaml
    cfg = load_run_config(yaml.safe_load(run.config_path.read_text()))
    return cfg.model_copy(update={"checkpoint_dir": str(run.live_checkpoint)})


def as_pvc(cfg, mount: Path):
    """``cfg`` with its checkpoint on a PVC mounted at ``mount`` (the live location below it)."""
    from eos_job.spec import CheckpointSpec
    spec = cfg.spec.model_copy(update={"checkpoint": CheckpointSpec(store="pvc", claim_name="colors-checkpoint",
                                                                    path=str(mount))})
    return cfg.model_copy(update={"spec": spec, "checkpoint_dir": str(mount / "live")})


def assert_exact(run: ColorsRun, expected: dict[str, int]) -> None:
    assert_exactly_once(run.bootstrap, run.counts, run.ledger_topic(), expected, (run.dlq,))


def assert_ids_exact(run: ColorsRun, expected: set[int]) -> None:
    assert_ids_exactly_once(run.bootstrap, run.counts, run.ledger_topic(), expected, (run.dlq,))


def wait_consumed(run: ColorsRun, ckpt: Path, timeout: float = 240) -> None:
    """Until the run has committed, in checkpoint ``ckpt``, a batch that ends where the source topic ends."""
    from confluent_kafka import Consumer, TopicPartition

    from eos_job import checkpoint
    c = Consumer({"bootstrap.servers": run.bootstrap, "group.id": f"ends-{uuid.uuid4().hex[:6]}"})
    try:
        parts = c.list_topics(run.events, timeout=15).topics[run.events].partitions
        ends = {str(p): c.get_watermark_offsets(TopicPartition(run.events, p), timeout=15)[1] for p in parts}
    finally:
        c.close()

    def caught_up() -> bool:
        if run.proc is not None and run.proc.poll() is not None:
            raise AssertionError(f"the job exited with {run.proc.returncode}")
        done = checkpoint.last_committed_batch(ckpt)
        return done is not None and checkpoint.kafka_offsets(ckpt, done).get(run.events) == ends

    wait_until(caught_up, f"the run to consume {run.events} up to {ends}", timeout, run.log_tail)


def run_job(args: list[str], env_extra: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'jobs'}", **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "eos_job", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)
