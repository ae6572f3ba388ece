"""``eos-job`` / ``python -m eos_job``: run, resolve or validate one stream; snapshot and pre-flight commands.

The same command runs locally and in the driver Pod:
``eos-job run --config examples/colors.yaml`` or, in a Pod,
``python -m eos_job run --config-env EOS_RUN_CONFIG``. The operator runs the
others in short-lived Pods::

    eos-job snapshot take --checkpoint C --dest D --stream-json '{"name":..,"uid":..}' [--spec-hash H]
    eos-job snapshot inspect --path D
    eos-job snapshot dispose --path D
    eos-job preflight --config-env VAR --from-checkpoint C --scratch S
    eos-job run --config-env VAR --drain
    eos-job probe --config-env VAR [--snapshot D]   (store pvc: the checkpoint, read on the claim)

Each of these prints a compact JSON result (camelCase keys, ``reason`` first
among them) on stdout and writes it as the Pod's termination message.
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

from . import log_format
from .storage import Loc
from .storage import configure as configure_storage

EXIT_OK, EXIT_FAILED, EXIT_BAD_CONFIG, EXIT_SINK = 0, 1, 2, 3
EXIT_PREFLIGHT_FAILED = 4   # Spark refused the spec on the checkpoint's state
EXIT_NOTHING_TO_SNAPSHOT = 5  # no committed batch yet: retry later
EXIT_NOT_A_SNAPSHOT = 6     # the path has no manifest (or the copy does not match it)
SNAPSHOT_ON_STOP_ENV = "EOS_SNAPSHOT_ON_STOP"
DRAIN_ENV = "EOS_DRAIN"
# Secret values the operator maps into a Pod's environment besides the Kafka ones (kafka_security.env_name).
SECRET_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def _complain(message: str) -> None:
    """A refusal on stderr: as it always was in text, as an ERROR record (one JSON line) in json."""
    if log_format.current_format() == "json":
        logging.getLogger("eos_job").error("%s", message)
    else:
        print(message, file=sys.stderr)


def _setup_logging(args: argparse.Namespace) -> None:
    """The chosen format, and every Secret value of the environment registered for redaction."""
    from .kafka_security import VALUES, env_name

    log_format.configure(args.log_format, os.environ.get("EOS_LOG_LEVEL", "INFO"))
    logging.getLogger("py4j").setLevel(logging.WARNING)
    names = [env_name(end, v) for end in ("source", "sink") for v in VALUES if v not in ("username", "ca")]
    for name in (*names, *SECRET_ENV):
        log_format.register_secret(os.environ.get(name))


def _log_context(cfg) -> None:
    attempt = os.environ.get(log_format.ATTEMPT_ENV, "")
    log_format.set_base_context(stream=cfg.stream.name, namespace=cfg.stream.namespace,
                                attempt=int(attempt) if attempt.isdigit() else None)


def _emit(doc: dict) -> None:
    """The command's result: on stdout, and as the Pod's termination message when there is one."""
    from .runtime import termination_message_path

    text = json.dumps({k: v for k, v in doc.items() if v is not None}, separators=(",", ":"), sort_keys=True)
    print(text, flush=True)
    path = termination_message_path()
    if path is not None:
        try:
            path.write_text(text[:4000])
        except OSError:
            pass


def _snapshot_doc(reason: str, path: str, manifest: dict | None, **extra) -> dict:
    m = manifest or {}
    return {"reason": reason, "path": path, "lastBatch": m.get("lastBatch"), "checkpointId": m.get("checkpointId"),
            "streamUid": (m.get("stream") or {}).get("uid"), "time": m.get("time"), "sizeBytes": m.get("sizeBytes"),
            "specHash": m.get("specHash"), "kind": m.get("kind"), **extra}


def _snapshot_command(args) -> int:
    from .snapshot import (NothingToSnapshot, NotASnapshot, SnapshotError, dispose_snapshot, read_manifest,
                           take_live_snapshot, verify_snapshot)

    if args.action == "take":
        from .spec import StreamIdentity
        try:
            stream = StreamIdentity.model_validate(json.loads(args.stream_json)).wire()
        except (ValueError, ValidationError) as exc:
            _emit({"reason": "InvalidArguments", "error": f"--stream-json: not a stream identity ({exc})"[:2000]})
            return EXIT_BAD_CONFIG
        dest = Loc.of(args.dest)
        if dest.exists():
            # A retried take (its Pod ran again) finds its own snapshot: report it; never overwrite.
            try:
                manifest = read_manifest(dest)
            except NotASnapshot:
                manifest = None
            if manifest and (manifest.get("stream") or {}).get("uid") == stream["uid"] and \
                    manifest.get("checkpointId") == _checkpoint_id(args.checkpoint):
                _emit(_snapshot_doc("SnapshotTaken", str(dest), manifest,
                                    message=f"snapshot {dest} exists already; kept as it is"))
                return EXIT_OK
            _emit({"reason": "SnapshotFailed", "path": str(dest),
                   "error": f"{dest} exists already and is not a snapshot of this checkpoint; snapshots are "
                            "never overwritten: choose another destination"})
            return EXIT_FAILED
        try:
            manifest = take_live_snapshot(args.checkpoint, dest, stream=stream, spec_hash=args.spec_hash)
        except NothingToSnapshot as exc:
            _emit({"reason": "NothingToSnapshot", "path": str(dest), "message": str(exc)})
            return EXIT_NOTHING_TO_SNAPSHOT
        except (SnapshotError, OSError) as exc:
            _emit({"reason": "SnapshotFailed", "path": str(dest), "error": str(exc)[:2000]})
            return EXIT_FAILED
        _emit(_snapshot_doc("SnapshotTaken", str(dest), manifest))
        return EXIT_OK
    try:
        if args.action == "inspect":
            _emit(_snapshot_doc("SnapshotVerified", args.path, verify_snapshot(args.path)))
        else:
            manifest = dispose_snapshot(args.path)
            _emit(_snapshot_doc("SnapshotDisposed", args.path, manifest,
                                message=None if manifest else f"{args.path} does not exist: nothing to delete"))
    except NotASnapshot as exc:
        _emit({"reason": "NotASnapshot", "path": args.path, "error": str(exc)})
        return EXIT_NOT_A_SNAPSHOT
    except OSError as exc:
        _emit({"reason": "SnapshotFailed", "path": args.path, "error": str(exc)[:2000]})
        return EXIT_FAILED
    return EXIT_OK


def _checkpoint_id(path: str) -> str | None:
    from .checkpoint import checkpoint_id
    try:
        return checkpoint_id(path)
    except (OSError, ValueError, KeyError):
        return None


def _preflight_command(args, cfg) -> int:
    from .preflight import run_preflight

    try:
        result = run_preflight(cfg, args.from_checkpoint, args.scratch)
    except ValueError as exc:  # the scratch directory cannot be used
        _emit({"reason": "InvalidArguments", "error": str(exc)})
        return EXIT_BAD_CONFIG
    _emit(result.termination(args.from_checkpoint))
    return EXIT_OK if result.passed else EXIT_PREFLIGHT_FAILED


def _read(args) -> dict:
    """The config document: a mapping, else ValueError (as for anything nested absurdly deep)."""
    source = f"environment variable {args.config_env}" if args.config_env else args.config
    try:
        if args.config_env:
            raw = os.environ.get(args.config_env)
            if not raw:
                raise ValueError(f"environment variable {args.config_env} is empty; it must hold the run config")
            doc = json.loads(raw)
        else:
            with open(args.config) as f:
                doc = yaml.safe_load(f)
    except RecursionError:
        raise ValueError(f"{source}: nested too deeply to be a stream's config") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{source}: expected a mapping (an ExactlyOnceStream manifest or a run config), "
                         f"not {type(doc).__name__}")
    return doc


def _load(args, doc: dict) -> "RunConfig":  # noqa: F821 - imported lazily to keep --help fast
    from .snapshot_resource import SNAPSHOT_KIND
    from .spec import KIND, load_run_config
    from .spec_rules import name_errors

    kind = doc.get("kind")
    if kind == SNAPSHOT_KIND:
        raise ValueError(f"this is an {SNAPSHOT_KIND} manifest: eos-job {args.command} takes an {KIND} manifest "
                         f"or a run config (eos-job validate checks a snapshot manifest too)")
    if kind is not None and kind != KIND:
        raise ValueError(f"kind: {kind!r} is not {KIND}: eos-job {args.command} takes an {KIND} manifest or a "
                         "run config (a run config has no kind)")
    if kind == KIND:
        errors = name_errors(doc.get("metadata"))
        if errors:
            raise ValueError("invalid config:\n" + "\n".join(f"  {e}" for e in errors))
    cfg = load_run_config(doc)
    configure_storage(cfg.spec.checkpoint)
    if args.checkpoint:
        cfg = cfg.model_copy(update={"checkpoint_dir": args.checkpoint})
    return cfg


def _field_errors(exc: ValidationError, what: str = "config", prefix: str = "") -> str:
    from .spec_rules import explain

    lines = []
    for e in exc.errors():
        loc = prefix + ".".join(str(p) for p in e["loc"])
        lines.append(f"  {loc.rstrip('.') or '(top level)'}: {explain(e)}")
    return f"invalid {what}:\n" + "\n".join(lines)


def _validate_snapshot(doc: dict) -> int:
    """``eos-job validate`` of an ExactlyOnceSnapshot manifest: its name and spec, as the CRD checks them."""
    from .snapshot_resource import SnapshotSpec
    from .spec_rules import name_errors

    errors = [f"  {e}" for e in name_errors(doc.get("metadata"), snapshot=True)]
    try:
        SnapshotSpec.model_validate(doc.get("spec"))
    except ValidationError as exc:
        errors += _field_errors(exc, prefix="spec.").splitlines()[1:]
    if errors:
        _complain("invalid snapshot manifest:\n" + "\n".join(errors))
        return EXIT_BAD_CONFIG
    meta = doc["metadata"]
    print(f"snapshot manifest {meta.get('namespace', 'default')}/{meta['name']} is valid (the operator checks that "
          "its path is in its stream's store)")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="eos-job", description="Run an exactly-once Spark streaming job.")
    ap.add_argument("--log-format", type=log_format.format_argument,
                    default=os.environ.get(log_format.FORMAT_ENV, "text"),
                    help=f"text (default) or json: one object per line on stderr (default: ${log_format.FORMAT_ENV})")
    sub = ap.add_subparsers(dest="command", required=True)
    for name, help_ in (("run", "run the stream until SIGTERM (graceful stop) or failure"),
                        ("resolve", "fence the stream's transactions and report what a restart will replay"),
                        ("validate", "check the config and exit"),
                        ("probe", "read the checkpoint's batches where it is mounted (a claim) and report them"),
                        ("preflight", "check that the config's spec can start from a checkpoint's state")):
        p = sub.add_parser(name, help=help_)
        src = p.add_mutually_exclusive_group(required=True)
        src.add_argument("--config", help="YAML/JSON file: an ExactlyOnceStream manifest or a run config")
        src.add_argument("--config-env", help="name of an environment variable holding the run config as JSON")
        if name == "probe":
            p.add_argument("--snapshot", help="also read this snapshot's manifest")
        if name == "preflight":
            p.add_argument("--from-checkpoint", required=True, help="checkpoint whose state the spec must accept "
                                                                     "(only read)")
            p.add_argument("--scratch", required=True, help="directory for the throw-away copy; deleted at the end")
            continue
        p.add_argument("--checkpoint", help="override the checkpoint directory")
        if name == "run":
            # The operator sets the variable on every driver Pod, so any graceful stop leaves a snapshot.
            p.add_argument("--snapshot-on-stop", metavar="DIR", default=os.environ.get(SNAPSHOT_ON_STOP_ENV) or None,
                           help="on SIGTERM, after the clean stop, copy the checkpoint to DIR with a manifest "
                                f"(default: ${SNAPSHOT_ON_STOP_ENV})")
            p.add_argument("--drain", action="store_true", default=os.environ.get(DRAIN_ENV, "") == "1",
                           help="only finish the batch logged without a commit, then exit (reason Drained; "
                                f"default: ${DRAIN_ENV}=1)")
    snap = sub.add_parser("snapshot", help="take, inspect or dispose of a snapshot")
    snap_sub = snap.add_subparsers(dest="action", required=True)
    take = snap_sub.add_parser("take", help="copy a consistent cut of a (running) query's checkpoint")
    take.add_argument("--checkpoint", required=True, help="the checkpoint to copy (only read)")
    take.add_argument("--dest", required=True, help="the new snapshot directory (never overwritten)")
    take.add_argument("--stream-json", required=True, help="the stream identity, JSON of its wire form")
    take.add_argument("--spec-hash", help="hash of the spec the checkpoint was written with")
    for action, help_ in (("inspect", "read and check a snapshot's manifest"),
                          ("dispose", "delete a snapshot (refuses a directory that is not one)")):
        snap_sub.add_parser(action, help=help_).add_argument("--path", required=True)
    args = ap.parse_args(argv)
    _setup_logging(args)
    log = logging.getLogger("eos_job")
    if args.command == "snapshot":
        return _snapshot_command(args)
    args.checkpoint = getattr(args, "checkpoint", None)
    try:
        doc = _read(args)
        if args.command == "validate" and doc.get("kind") == "ExactlyOnceSnapshot":
            return _validate_snapshot(doc)
        cfg = _load(args, doc)
        _log_context(cfg)
        from .spec import semantic_errors
        errs = semantic_errors(cfg.spec, cfg.stream.namespace, cfg.stream.name)
        if errs:
            raise ValueError("invalid config:\n" + "\n".join(f"  {e}" for e in errs))
    except ValidationError as exc:
        _complain(_field_errors(exc))
        if args.command == "preflight":
            _emit({"reason": "InvalidConfig", "error": _field_errors(exc)[:2000]})
        return EXIT_BAD_CONFIG
    except RecursionError:
        _complain("the config is nested too deeply to be a stream's config")
        if args.command == "preflight":
            _emit({"reason": "InvalidConfig", "error": "the config is nested too deeply"})
        return EXIT_BAD_CONFIG
    except (ValueError, OSError, yaml.YAMLError) as exc:
        _complain(f"{exc}")
        if args.command == "preflight":
            _emit({"reason": "InvalidConfig", "error": str(exc)[:2000]})
        return EXIT_BAD_CONFIG
    if args.command == "preflight":
        return _preflight_command(args, cfg)
    if args.command == "validate":
        print(f"config for stream {cfg.stream.namespace}/{cfg.stream.name} is valid")
        return EXIT_OK

    if args.command == "probe":
        from .resolution import checkpoint_facts
        try:
            facts = checkpoint_facts(cfg, snapshot=args.snapshot)
        except (OSError, ValueError) as exc:
            _emit({"reason": "CheckpointUnreadable", "error": f"{type(exc).__name__}: {exc}"[:2000]})
            return EXIT_FAILED
        _emit({"reason": "Probed", **facts.model_dump(by_alias=True)})
        return EXIT_OK

    from .ledger import SinkUnavailable
    if args.command == "resolve":
        from .resolution import resolve
        try:
            report = resolve(cfg)
        except SinkUnavailable as exc:
            _complain(f"resolution failed: {exc}")
            return EXIT_SINK
        print(report.model_dump_json(by_alias=True, indent=2))
        return EXIT_OK

    from .contract import BatchRefused, DriverSuperseded, SpecRefused
    from .runtime import JobFailed, RunSummary, install_signal_handlers, run, termination_message_path
    stop = threading.Event()
    install_signal_handlers(stop)
    code = EXIT_OK
    try:
        summary = run(cfg, stop_event=stop, snapshot_dir=args.snapshot_on_stop, drain=args.drain)
    except SinkUnavailable as exc:
        summary, code = RunSummary(reason="SinkUnavailable", error=str(exc)), EXIT_SINK
    except (BatchRefused, DriverSuperseded, SpecRefused) as exc:
        summary, code = RunSummary(reason=exc.REASON, error=str(exc)), EXIT_FAILED
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
    from .event_log import close
    close(cfg.spec, clean=code == EXIT_OK)
    log.info("exit %d: %s", code, summary.to_json())
    if args.drain:
        print(summary.to_json(), flush=True)  # like the other one-off commands the operator runs in a Pod
    return code


if __name__ == "__main__":
    sys.exit(main())
