"""Run the colors job as a local process (no Kubernetes) on the local stack: the job-level demo.

Used by tests, the benchmark and the job-level demo (``examples.colors.demo_job``);
``examples.colors.demo`` is the operator demo.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import yaml
from confluent_kafka.admin import AdminClient, NewTopic

from examples.colors.manifest import colors_manifest

REPO = Path(__file__).resolve().parents[2]


def create_topics(bootstrap: str, topics: dict[str, int], replication: int = 1) -> None:
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        futs = admin.create_topics([NewTopic(t, num_partitions=n, replication_factor=replication)
                                    for t, n in topics.items()])
        for t, f in futs.items():
            f.result(30)


@dataclass
class ColorsRun:
    """One colors stream on the local stack: unique topics, a config file, a checkpoint dir."""
    bootstrap: str
    workdir: Path
    parallelism: int = 2
    max_offsets_per_trigger: int | None = 2000
    trigger_interval_ms: int = 500
    run_id: str = ""
    extra_env: dict | None = None
    transaction_timeout_ms: int = 60000
    module: str = "examples.colors.job"   # examples.colors.ids: the unique-id stream
    writer: str = "python"   # sink.writer; jvm writes no dead letters yet, so its stream has no dead-letter topic

    def __post_init__(self):
        self.run_id = self.run_id or uuid.uuid4().hex[:8]
        self.events = f"colors-events-{self.run_id}"
        self.counts = f"colors-counts-{self.run_id}"
        self.dlq = f"colors-dlq-{self.run_id}"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.checkpoint = self.workdir / "checkpoint"
        self.config_path = self.workdir / "colors.yaml"
        self.proc: subprocess.Popen | None = None
        self.log_path = self.workdir / "job.log"

    def manifest(self) -> dict:
        return colors_manifest(f"colors-{self.run_id}", self.bootstrap, self.events, self.counts, self.workdir,
                               dlq=self.dlq if self.writer == "python" else None, parallelism=self.parallelism,
                               namespace="local",
                               max_offsets_per_trigger=self.max_offsets_per_trigger,
                               trigger_interval_ms=self.trigger_interval_ms, job={"module": self.module},
                               sink={"transactionTimeoutMs": self.transaction_timeout_ms,
                                     **({"writer": self.writer} if self.writer != "python" else {})})

    def setup(self, event_partitions: int = 3, count_partitions: int = 3, replication: int = 1) -> None:
        create_topics(self.bootstrap, {self.events: event_partitions, self.counts: count_partitions, self.dlq: 1},
                      replication)
        self.config_path.write_text(yaml.safe_dump(self.manifest()))

    @property
    def live_checkpoint(self) -> Path:
        return self.workdir / "live"

    def ledger_topic(self) -> str:
        return f"{self.counts}.eos-ledger.local.colors-{self.run_id}"

    def start(self, extra_args: list[str] | None = None) -> subprocess.Popen:
        # Spark's local dir (a copy of every jar per session) under the run's folder, not /tmp: a SIGKILLed JVM
        # never removes it, and the test's folder goes with the test.
        tmp = self.workdir / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'jobs'}:{os.environ.get('PYTHONPATH', '')}",
               "EOS_TERMINATION_MESSAGE_PATH": str(self.workdir / "termination.json"), "TMPDIR": str(tmp),
               **(self.extra_env or {})}
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "eos_job", "run", "--config", str(self.config_path),
                                      *(extra_args or [])], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        return self.proc

    def kill9(self) -> None:
        """SIGKILL every process of the driver (PySpark's workers too: they have a process group of their own)."""
        if self.proc and self.proc.poll() is None:
            from eos_job.process_tree import descendants, kill_tree
            kill_tree(descendants(self.proc.pid), {self.proc.pid})
            self.proc.wait(30)

    def stop(self, timeout: float = 120) -> int:
        """SIGTERM: the job stops at a clean batch boundary and exits 0."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
            raise

    def committed_batches(self) -> int:
        from eos_job import checkpoint
        b = checkpoint.last_committed_batch(self.live_checkpoint)
        return -1 if b is None else b

    def wait_for_batches(self, n: int, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        start = self.committed_batches()
        while time.monotonic() < deadline:
            if self.committed_batches() >= start + n:
                return
            if self.proc is not None and self.proc.poll() is not None and self.proc.returncode != -9:
                raise RuntimeError(f"the job exited with {self.proc.returncode}:\n{self.log_tail()}")
            time.sleep(0.2)
        raise TimeoutError(f"no {n} new batches within {timeout}s:\n{self.log_tail()}")

    def wait_caught_up(self, expected: dict[str, int], timeout: float = 300) -> dict[str, int]:
        """Poll the committed output until the final counts reach the expected ones."""
        from eos_job.verify import audit_counts
        deadline = time.monotonic() + timeout
        final: dict[str, int] = {}
        while time.monotonic() < deadline:
            final = audit_counts(self.bootstrap, self.counts).final
            if final == expected:
                return final
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"the job exited with {self.proc.returncode}:\n{self.log_tail()}")
            time.sleep(1.0)
        raise TimeoutError(f"output did not reach the expected counts in {timeout}s: {final} != {expected}\n"
                           f"{self.log_tail()}")

    def log_tail(self, n: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
