"""The job-level demo (no Kubernetes, no operator): the colors job as a local process, killed once.

``python -m examples.colors.demo_job`` after ``make stack-up``; ``make demo`` runs the
operator demo, ``examples.colors.demo``, which does the same through the operator.

1. creates the topics and writes N color events with a known distribution;
2. runs the exactly-once job (`eos-job run`), lets it commit a few batches,
   and kills the driver with SIGKILL in the middle of the stream;
3. runs resolution (fences every slot, reports what the restart replays) and
   restarts the job, which catches up and is stopped gracefully;
4. prints the final counts next to the expected ones, with a verdict from an
   independent read_committed audit of the output and the ledger.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from eos_job.resolution import resolve
from eos_job.spec import load_run_config
from eos_job.verify import audit_counts, ledger_monotone, open_transactions

from .generator import produce
from .local_run import ColorsRun


def say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--events", type=int, default=20000)
    ap.add_argument("--bootstrap", default=None, help="default: KAFKA_BOOTSTRAP from .stack/env")
    a = ap.parse_args(argv)
    bootstrap = a.bootstrap or _stack_env().get("KAFKA_BOOTSTRAP")
    if not bootstrap:
        print("no Kafka: run `make stack-up` first (or pass --bootstrap)", file=sys.stderr)
        return 2
    os.environ.setdefault("SPARK_JARS", _stack_env().get("SPARK_JARS", ""))
    work = Path(tempfile.mkdtemp(prefix="eos-demo-"))
    run = ColorsRun(bootstrap, work, parallelism=2, max_offsets_per_trigger=2000)
    run.setup()
    say(f"topics {run.events} -> {run.counts} (dead letters: {run.dlq}); work dir {work}")
    expected = produce(bootstrap, run.events, a.events)
    say(f"produced {a.events} events; expected counts (orange dropped): {expected}")

    run.start()
    say("job started; waiting for 3 committed batches ...")
    run.wait_for_batches(3, timeout=300)
    say(f"batch {run.committed_batches()} committed; killing the driver with SIGKILL mid-stream")
    run.kill9()

    cfg = load_run_config(__import__("yaml").safe_load(run.config_path.read_text()))
    report = resolve(cfg.model_copy(update={"checkpoint_dir": str(run.live_checkpoint)}))
    say(f"resolution: {report.summary}")

    run.start()
    say("job restarted; waiting until the output has caught up ...")
    t0 = time.monotonic()
    run.wait_caught_up(expected, timeout=600)
    say(f"caught up in {time.monotonic() - t0:.0f}s; stopping gracefully (SIGTERM)")
    rc = run.stop()

    audit = audit_counts(bootstrap, run.counts)
    ledger_problems = ledger_monotone(bootstrap, run.ledger_topic())
    still_open = open_transactions(bootstrap, [run.counts, run.dlq, run.ledger_topic()])
    print()
    print(f"{'color':8} {'expected':>9} {'output':>9}")
    for color in sorted(set(expected) | set(audit.final)):
        print(f"{color:8} {expected.get(color, 0):>9} {audit.final.get(color, 0):>9}")
    ok = (audit.final == expected and not audit.duplicates and not audit.regressions and not ledger_problems
          and not still_open and rc == 0)
    print()
    print(f"read_committed audit: {audit.updates} count updates, {len(audit.duplicates)} emitted twice, "
          f"{len(audit.regressions)} going backwards; ledger monotone: {not ledger_problems}; "
          f"open transactions: {len(still_open)}; graceful stop exit code: {rc}")
    print("VERDICT: EXACTLY ONCE" if ok else "VERDICT: FAILED")
    return 0 if ok else 1


def _stack_env() -> dict[str, str]:
    env_file = Path(__file__).resolve().parents[2] / ".stack" / "env"
    out = {}
    if env_file.exists():
        for line in env_file.read_text().splitlines():
            if "=" in line:
                k, v = line.split("=", 1)
                out[k] = v
    return out


if __name__ == "__main__":
    sys.exit(main())
