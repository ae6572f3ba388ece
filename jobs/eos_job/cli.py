"""``eos-job`` / ``python -m eos_job``: run, resolve or validate one stream.

The same command runs locally and in the driver Pod:
``eos-job run --config examples/colors.yaml`` or, in a Pod,
``python -m eos_job run --config-env EOS_RUN_CONFIG``.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading

import yaml
from pydantic import ValidationError

EXIT_OK, EXIT_FAILED, EXIT_BAD_CONFIG, EXIT_SINK = 0, 1, 2, 3
SNAPSHOT_ON_STOP_ENV = "EOS_SNAPSHOT_ON_STOP"


def _load(args) -> "RunConfig":  # noqa: F821 - imported lazily to keep --help fast
    from .spec import load_run_config

    if args.config_env:
        raw = os.environ.get(args.config_env)
        if not raw:
            raise ValueError(f"environment variable {args.config_env} is empty; it must hold the run config")
        doc = json.loads(raw)
    else:
        with open(args.config) as f:
            doc = yaml.safe_load(f)
    cfg = load_run_config(doc)
    if args.checkpoint:
        cfg = cfg.model_copy(update={"checkpoint_dir": args.checkpoint})
    return cfg


def _field_errors(exc: ValidationError) -> str:
    lines = []
    for e in exc.errors():
        loc = ".".join(str(p) for p in e["loc"])
        lines.append(f"  {loc}: {e['msg']}")
    return "invalid config:\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="eos-job", description="Run an exactly-once Spark streaming job.")
    sub = ap.add_subparsers(dest="command", required=True)
    for name, help_ in (("run", "run the stream until SIGTERM (graceful stop) or failure"),
                        ("resolve", "fence the stream's transactions and report what a restart will replay"),
                        ("validate", "check the config and exit")):
        p = sub.add_parser(name, help=help_)
        src = p.add_mutually_exclusive_group(required=True)
        src.add_argument("--config", help="YAML/JSON file: an ExactlyOnceStream manifest or a run config")
        src.add_argument("--config-env", help="name of an environment variable holding the run config as JSON")
        p.add_argument("--checkpoint", help="override the checkpoint directory")
        if name == "run":
            # The operator sets the variable on every driver Pod, so any graceful stop leaves a snapshot.
            p.add_argument("--snapshot-on-stop", metavar="DIR", default=os.environ.get(SNAPSHOT_ON_STOP_ENV) or None,
                           help="on SIGTERM, after the clean stop, copy the checkpoint to DIR with a manifest "
                                f"(default: ${SNAPSHOT_ON_STOP_ENV})")
    args = ap.parse_args(argv)
    logging.basicConfig(level=os.environ.get("EOS_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    log = logging.getLogger("eos_job")
    try:
        cfg = _load(args)
        from .spec import semantic_errors
        errs = semantic_errors(cfg.spec)
        if errs:
            raise ValueError("invalid config:\n" + "\n".join(f"  {e}" for e in errs))
    except ValidationError as exc:
        print(_field_errors(exc), file=sys.stderr)
        return EXIT_BAD_CONFIG
    except (ValueError, OSError, yaml.YAMLError) as exc:
        print(f"{exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    if args.command == "validate":
        print(f"config for stream {cfg.stream.namespace}/{cfg.stream.name} is valid")
        return EXIT_OK

    from .ledger import SinkUnavailable
    if args.command == "resolve":
        from .resolution import resolve
        try:
            report = resolve(cfg)
        except SinkUnavailable as exc:
            print(f"resolution failed: {exc}", file=sys.stderr)
            return EXIT_SINK
        print(report.model_dump_json(by_alias=True, indent=2))
        return EXIT_OK

    from .runtime import JobFailed, RunSummary, install_signal_handlers, run, termination_message_path
    stop = threading.Event()
    install_signal_handlers(stop)
    fault = float(os.environ.get("EOS_FAULT_KILL_AFTER_COMMIT", "0") or 0)
    code = EXIT_OK
    try:
        summary = run(cfg, stop_event=stop, snapshot_dir=args.snapshot_on_stop, fault_kill_after_commit=fault)
    except SinkUnavailable as exc:
        summary, code = RunSummary(reason="SinkUnavailable", error=str(exc)), EXIT_SINK
    except JobFailed as exc:
        summary, code = RunSummary(reason="Failed", error=str(exc)), EXIT_FAILED
    if summary.error:
        log.error("%s: %s", summary.reason, summary.error)
    path = termination_message_path()
    if path is not None:
        try:
            path.write_text(summary.to_json()[:4000])
        except OSError:
            pass
    log.info("exit %d: %s", code, summary.to_json())
    return code


if __name__ == "__main__":
    sys.exit(main())
