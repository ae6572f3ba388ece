"""A driver stand-in for the process kubelet: ``python -m eos_job run`` toward Kafka and the operator, without Spark.

Hundreds of streams cannot each run a JVM on one machine. A Pod whose image matches the kubelet's
``standin_image`` runs this program instead, given the Pod's command as its arguments, with the Pod's
environment and volumes. A command other than a driver's (``eos_job run`` without ``--drain``: pre-flight,
drain, probe and snapshot Pods) is exec'd as it is. A driver's is stood in: the run config is read as the
driver reads it (``eos_job.cli``), then the driver's own code runs, with only Spark's part played
(``driver_play``: the start, a micro-batch every ``EOS_STANDIN_BATCH_SECONDS`` (default 5) with
``EOS_STANDIN_RECORDS`` records per slot (default 1) through the sink's write path, the stop):

* **SIGTERM**: stop after the running batch, exit 0 (reason ``Stopped``), with the snapshot-on-stop when
  ``EOS_SNAPSHOT_ON_STOP`` asks for one. A superseded or refused driver exits 1, an unusable sink 3, as the
  driver does.
* **Crashes**: the driver's own fault switches work unchanged, as the same hooks run (``eos_job.faults``:
  ``EOS_FAULT_KILL_AFTER_COMMIT``, ``EOS_FAULT_KILL_BEFORE_COMMIT_LOG``, ``EOS_FAULT_PARTIAL_BATCH``, ...,
  with ``EOS_FAULT_FROM_BATCH``); the kubelet's ``kill9`` SIGKILLs a stand-in at any moment.

``python -m tests.harness.standin --zygote`` is the fork server the kubelet starts stand-ins from
(``tests/harness/zygote.py``): they share the pages of all this code, imported once.
"""
from __future__ import annotations

import logging
import os
import sys
import threading

from eos_job import cli
from eos_job.runtime import install_signal_handlers, termination_message_path

from .driver_play import is_driver, play, run_args, warm_up
from .zygote import serve

BATCH_SECONDS_ENV, RECORDS_ENV = "EOS_STANDIN_BATCH_SECONDS", "EOS_STANDIN_RECORDS"

log = logging.getLogger("eos_job.standin")


def main(argv: list[str]) -> int:
    """``argv``: the Pod's command. The exit codes and termination message of ``eos_job.cli``'s run."""
    if not is_driver(argv):
        os.execvp(argv[0], argv)
    args = run_args(argv, os.environ)
    logging.basicConfig(level=os.environ.get("EOS_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr, force=True)
    try:
        cfg = cli._load(args, cli._read(args))
    except (ValueError, OSError) as exc:
        print(f"{exc}", file=sys.stderr)
        return cli.EXIT_BAD_CONFIG
    stop = threading.Event()
    install_signal_handlers(stop)
    code, summary = play(cfg, stop, batch_seconds=float(os.environ.get(BATCH_SECONDS_ENV, "5")),
                         records=int(os.environ.get(RECORDS_ENV, "1")), snapshot_dir=args.snapshot_on_stop)
    path = termination_message_path()
    if path is not None:
        path.write_text(summary.to_json()[:4000])
    log.info("exit %d: %s", code, summary.to_json())
    return code


if __name__ == "__main__":
    if sys.argv[1:] == ["--zygote"]:
        warm_up()
        sys.exit(serve(main))
    sys.exit(main(sys.argv[1:]))
