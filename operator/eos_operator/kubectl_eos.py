"""``kubectl eos``: the command line users reach for when a stream looks wrong (a kubectl plugin).

Installed with the project as ``kubectl-eos``; kubectl finds it on ``PATH``, so ``kubectl eos status colors``
runs it. It talks only to the API server, with kubectl's credentials (``$KUBECONFIG`` or ``~/.kube/config``,
``--context``), in the namespace given (``-n``) or the context's.

    kubectl eos list                          every stream of the namespace, a line each
    kubectl eos status NAME                   lifecycle, conditions, last batch, driver, restarts, resolution,
                                              replay horizon, an upgrade or launch in flight, recent snapshots
    kubectl eos snapshots [NAME]              ExactlyOnceSnapshot resources (of one stream)
    kubectl eos snapshot NAME [--no-wait]     take one now (spec.snapshotNonce + 1) and wait for it
    kubectl eos restore NAME --from SNAPSHOT  spec.restoreFrom (the operator restores on its next start)
    kubectl eos suspend|resume NAME           job.state suspended / running
    kubectl eos restart NAME                  spec.restartNonce + 1 (also after RestartsExhausted)
    kubectl eos events NAME                   the stream's events, oldest first
    kubectl eos resolve NAME --dry-run        the last resolution: fenced ids, checkpoint, ledger per slot, replay
    kubectl eos verify NAME [--from-batch N]  audit the sink against the ledger (kubectl_verify.py): each
                                              committed (slot, batch) once, by count and digest
    kubectl eos ui NAME [--port N]            port-forward to the running driver's Spark UI, print its local URL
                                              (kubectl_ui.py; the UI is on with job.metrics.enabled; through
                                              the Service of job.metrics.uiService when there is one)
    kubectl eos migrate-storage [--crd NAME]  after an upgrade of the CRDs: every stream and snapshot rewritten
                                              in the storage version, older versions dropped from the CRDs'
                                              status.storedVersions (storage_migration.py; all namespaces)

``-o json`` / ``-o yaml`` print the objects instead of tables. Exit codes a script can use: 0 done (``status``:
the stream is Ready), 1 the API server or the cluster failed the command, 2 bad usage, 3 no such stream or
snapshot, 4 ``status``: not Ready / ``snapshot``: the snapshot Failed / ``resolve``: never resolved, 5
``snapshot``: still not done after ``--timeout``, 6 ``verify``: the sink does not hold what the ledger committed.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from typing import Any, Callable

from eos_job.snapshot_resource import SNAPSHOT_PLURAL
from eos_job.spec import API_GROUP, API_VERSION, PLURAL

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_NOT_READY, EXIT_TIMEOUT = 0, 1, 2, 3, 4, 5
LABEL_STREAM = f"{API_GROUP}/stream"


class NotFound(Exception):
    pass


class Api:
    """The few calls the plugin makes, through the Kubernetes client with kubectl's configuration."""

    def __init__(self, kubeconfig: str | None, context: str | None):
        from kubernetes import client, config

        config.load_kube_config(config_file=kubeconfig, context=context)
        self.custom, self.core = client.CustomObjectsApi(), client.CoreV1Api()
        contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
        chosen = next((c for c in contexts if c["name"] == context), active) if context else active
        self.default_namespace = ((chosen or {}).get("context") or {}).get("namespace") or "default"

    @staticmethod
    def _call(what: str, fn: Callable[..., Any], *args, **kw) -> Any:
        from kubernetes.client.rest import ApiException
        try:
            return fn(*args, **kw)
        except ApiException as exc:
            if exc.status == 404:
                raise NotFound(what) from None
            raise

    def _custom(self, verb: str, plural: str, ns: str, *rest, what: str) -> Any:
        fn = getattr(self.custom, f"{verb}_namespaced_custom_object")
        return self._call(what, fn, API_GROUP, API_VERSION, ns, plural, *rest)

    def stream(self, ns: str, name: str) -> dict:
        return self._custom("get", PLURAL, ns, name, what=f"exactlyoncestream {ns}/{name}")

    def streams(self, ns: str) -> list[dict]:
        return self._custom("list", PLURAL, ns, what="the ExactlyOnceStream CRD (is the chart installed?)")["items"]

    def snapshots(self, ns: str, stream: str | None) -> list[dict]:
        items = self._custom("list", SNAPSHOT_PLURAL, ns, what="the ExactlyOnceSnapshot CRD")["items"]
        return [s for s in items if stream is None or (s.get("spec") or {}).get("stream") == stream]

    def snapshot(self, ns: str, name: str) -> dict:
        return self._custom("get", SNAPSHOT_PLURAL, ns, name, what=f"exactlyoncesnapshot {ns}/{name}")

    def patch_spec(self, ns: str, name: str, patch: dict) -> dict:
        return self._custom("patch", PLURAL, ns, name, {"spec": patch}, what=f"exactlyoncestream {ns}/{name}")

    def secret(self, ns: str, name: str) -> dict | None:
        """A Secret the stream names (``verify``: the sink's credentials), or None if there is none."""
        try:
            out = self._call(f"secret {ns}/{name}", self.core.read_namespaced_secret, name, ns,
                             _preload_content=False)
        except NotFound:
            return None
        return json.loads(out.data)

    def service(self, ns: str, name: str) -> dict | None:
        """A Service (``ui``: the stream's Spark UI Service), or None if there is none or it may not be read
        (then ``ui`` forwards to the Pod, as without one)."""
        from kubernetes.client.rest import ApiException
        try:
            out = self._call(f"service {ns}/{name}", self.core.read_namespaced_service, name, ns,
                             _preload_content=False)
        except NotFound:
            return None
        except ApiException as exc:
            if exc.status == 403:
                return None
            raise
        return json.loads(out.data)

    def events(self, ns: str, name: str) -> list[dict]:
        out = self._call(f"events of {ns}/{name}", self.core.list_namespaced_event, ns,
                         field_selector=f"involvedObject.name={name}", _preload_content=False)
        return json.loads(out.data)["items"]


# ------------------------------------------------------------------ rendering
def _age(ts: str | None, now: datetime) -> str:
    if not ts:
        return "-"
    secs = int((now - datetime.fromisoformat(ts.replace("Z", "+00:00"))).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size:
            return f"{secs // size}{unit}"
    return f"{max(secs, 0)}s"


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join("   ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows])


def _cond(status: dict, type_: str) -> dict:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), {})


def stream_rows(streams: list[dict], now: datetime) -> str:
    rows = []
    for s in streams:
        st = s.get("status") or {}
        ready = _cond(st, "Ready")
        rows.append([s["metadata"]["name"], st.get("lifecycleState", "-"), ready.get("status", "Unknown"),
                     ready.get("reason", "-"), str(st.get("lastCommittedBatch", "-")), str(st.get("restartCount", 0)),
                     st.get("driverPod") or "-", _age(s["metadata"].get("creationTimestamp"), now)])
    return table(rows, ["NAME", "STATE", "READY", "REASON", "LAST BATCH", "RESTARTS", "DRIVER", "AGE"])


def status_text(s: dict, snapshots: list[dict], now: datetime) -> str:
    st, meta, spec = s.get("status") or {}, s["metadata"], s.get("spec") or {}
    lines = [f"Stream:        {meta['namespace']}/{meta['name']}",
             f"Lifecycle:     {st.get('lifecycleState', 'Created')}",
             f"Driver:        {st.get('driverPod') or '-'} (attempt {st.get('driverAttempt', 0)}, "
             f"{spec.get('job', {}).get('deployMode', 'client')} mode)",
             f"Last batch:    {st.get('lastCommittedBatch', '-')} committed",
             f"Restarts:      {st.get('restartCount', 0)}"
             + (f", next at {st['nextRestartTime']}" if st.get("nextRestartTime") else "")
             + (f"; failures at {', '.join(st.get('failureTimes') or [])}" if st.get("failureTimes") else "")]
    if st.get("lastError"):
        lines.append(f"Last error:    {st['lastError']}")
    failed = st.get("failedDriver")
    if failed:
        lines.append(f"Failed driver: {failed['pod']} (ended {failed.get('time', '?')}; its log until a later driver "
                     f"commits a batch: kubectl logs -n {meta['namespace']} {failed['pod']})")
    lines.append("Conditions:")
    lines += [f"  {c.get('type')}={c.get('status')} {c.get('reason', '')}: {c.get('message', '')}"
              for c in st.get("conditions") or []]
    res = st.get("resolution")
    if res:
        lines.append(f"Resolution:    {res.get('summary') or '-'}")
    hz = st.get("replayHorizon")
    if hz:
        lines.append(f"Replay horizon: {hz.get('state')} after batch {hz.get('batch')} (read {hz.get('checkedAt')}): "
                     f"backlog {hz.get('backlogRecords', 0)} records, lost {hz.get('lostRecords', 0)}"
                     + (f", {hz['secondsLeft']:.0f}s left" if hz.get("secondsLeft") is not None else "")
                     + (f"; {hz['message']}" if hz.get("message") else ""))
        if hz.get("lag"):
            rows = [[f"{x['topic']}/{x['partition']}", str(x["records"])] for x in hz["lag"]]
            lines.append("Lag per source partition (records beyond the last committed batch):")
            lines += ["  " + r for r in table(rows, ["PARTITION", "LAG"]).splitlines()]
    if st.get("pendingLaunch"):
        pl = st["pendingLaunch"]
        lines.append(f"Launching:     {pl.get('pod')} ({pl.get('reason')})"
                     + (f", refused: {pl['refused']}" if pl.get("refused") else ""))
    if st.get("upgrade"):
        up = st["upgrade"]
        lines.append(f"Upgrade:       {up.get('mode')} at step {up.get('step')}"
                     + (f": {up['note']}" if up.get("note") else ""))
    if snapshots:
        lines.append("Snapshots:")
        lines += ["  " + line for line in snapshot_rows(snapshots[-5:], now).splitlines()]
    return "\n".join(lines)


def resolution_text(res: dict) -> str:
    """The last resolution, as the next start would redo it: what was fenced, what the checkpoint and the ledger
    say, and what a restart replays."""
    slots = res.get("lastCommittedBatchPerSlot") or {}
    lines = [f"Last resolution: {res.get('summary') or '-'}",
             f"  generation {res.get('generation')}, {res.get('slots')} slots, "
             f"{res.get('fencedTransactionalIds', 0)} transactional ids fenced, "
             f"{res.get('openTransactionsAborted', 0)} open transactions aborted",
             f"  checkpoint {res.get('checkpointId') or '(none yet)'}: offsets through batch "
             f"{res.get('checkpointLastOffsetsBatch')}, committed through {res.get('checkpointLastCommittedBatch')}"
             + ("" if res.get("checkpointReadable", True) else " (not readable where resolution ran)"),
             f"  ledger: complete through batch {res.get('lastCompleteBatch')}; per slot "
             + (", ".join(f"{k}={v}" for k, v in sorted(slots.items(), key=lambda kv: int(kv[0]))) or "-")]
    if res.get("replayBatch") is not None:
        lines.append(f"  a restart replays batch {res['replayBatch']}"
                     + (f", skipping slots {res.get('replaySlotsAlreadyCommitted')} (already committed)"
                        if res.get("replaySlotsAlreadyCommitted") else "")
                     + (": PARTIALLY committed (the replay writes only the other slots)" if res.get("partiallyCommitted") else ""))
    return "\n".join(lines)


def snapshot_rows(snapshots: list[dict], now: datetime) -> str:
    def row(s: dict) -> list[str]:
        spec, st = s.get("spec") or {}, s.get("status") or {}
        return [s["metadata"]["name"], spec.get("stream", "-"), spec.get("trigger", "-"), st.get("state", "Pending"),
                str(st.get("batch", "-")), st.get("path") or "-", _age(s["metadata"].get("creationTimestamp"), now)]
    rows = [row(s) for s in sorted(snapshots, key=lambda s: s["metadata"].get("creationTimestamp") or "")]
    return table(rows, ["NAME", "STREAM", "TRIGGER", "STATE", "BATCH", "PATH", "AGE"])


def event_rows(events: list[dict]) -> str:
    def when(e: dict) -> str:
        return e.get("lastTimestamp") or e.get("eventTime") or e["metadata"].get("creationTimestamp") or ""
    rows = [[when(e), e.get("type", ""), e.get("reason", ""), str(e.get("count") or 1), e.get("message", "")]
            for e in sorted(events, key=when)]
    return table(rows, ["LAST SEEN", "TYPE", "REASON", "COUNT", "MESSAGE"])


def emit(obj: Any, output: str | None, text: Callable[[], str]) -> None:
    if output == "json":
        print(json.dumps(obj, indent=2, sort_keys=True))
    elif output == "yaml":
        import yaml
        print(yaml.safe_dump(obj, sort_keys=False), end="")
    else:
        print(text())


# ------------------------------------------------------------------ commands
def run(args: argparse.Namespace, api: Api, now: Callable[[], datetime], sleep: Callable[[float], None]) -> int:
    ns = args.namespace or api.default_namespace
    cmd = args.command
    if cmd == "list":
        streams = api.streams(ns)
        emit({"items": streams}, args.output, lambda: stream_rows(streams, now()))
        return EXIT_OK
    if cmd == "snapshots":
        if args.name:
            api.stream(ns, args.name)
        snaps = api.snapshots(ns, args.name)
        emit({"items": snaps}, args.output, lambda: snapshot_rows(snaps, now()))
        return EXIT_OK
    if cmd == "migrate-storage":
        from .storage_migration import run as migrate_storage
        return migrate_storage(args, emit)
    stream = api.stream(ns, args.name)
    spec = stream.get("spec") or {}
    if cmd == "status":
        snaps = api.snapshots(ns, args.name)
        emit(stream, args.output, lambda: status_text(stream, snaps, now()))
        return EXIT_OK if _cond(stream.get("status") or {}, "Ready").get("status") == "True" else EXIT_NOT_READY
    if cmd == "resolve":
        if not args.dry_run:
            print("kubectl eos resolve: only --dry-run; resolution runs before every start of the driver (the "
                  f"operator fences and reads the ledger then): `kubectl eos restart {args.name}` runs one",
                  file=sys.stderr)
            return EXIT_USAGE
        res = (stream.get("status") or {}).get("resolution")
        if not res:
            print(f"{ns}/{args.name} has not been resolved yet: its first start resolves it", file=sys.stderr)
            return EXIT_NOT_READY
        emit(res, args.output, lambda: resolution_text(res))
        return EXIT_OK
    if cmd == "verify":
        from .kubectl_verify import verify
        return verify(args, api, ns, stream, emit)
    if cmd == "ui":
        from .kubectl_ui import ui, ui_service
        return ui(args, ns, stream, ui_service(api, ns, stream))
    if cmd == "events":
        events = api.events(ns, args.name)
        emit({"items": events}, args.output, lambda: event_rows(events))
        return EXIT_OK
    if cmd in ("suspend", "resume"):
        api.patch_spec(ns, args.name, {"job": {"state": "suspended" if cmd == "suspend" else "running"}})
        print(f"exactlyoncestream {ns}/{args.name}: job.state {'suspended' if cmd == 'suspend' else 'running'}")
        return EXIT_OK
    if cmd == "restart":
        nonce = int(spec.get("restartNonce") or 0) + 1
        api.patch_spec(ns, args.name, {"restartNonce": nonce})
        print(f"exactlyoncestream {ns}/{args.name}: restartNonce {nonce} (the driver restarts at a batch boundary)")
        return EXIT_OK
    if cmd == "restore":
        if "/" not in args.source:   # a snapshot resource's name (a path is checked by the operator)
            api.snapshot(ns, args.source)
        api.patch_spec(ns, args.name, {"restoreFrom": args.source})
        print(f"exactlyoncestream {ns}/{args.name}: restoreFrom {args.source} (applies when the stream next starts "
              "a new checkpoint: a first start, or an upgrade)")
        return EXIT_OK
    assert cmd == "snapshot"
    nonce = int(spec.get("snapshotNonce") or 0) + 1
    api.patch_spec(ns, args.name, {"snapshotNonce": nonce})
    from .children import fitted_name
    name = fitted_name(args.name, f"-n{nonce}")
    print(f"exactlyoncestream {ns}/{args.name}: snapshotNonce {nonce}; snapshot {name} requested", flush=True)
    if args.no_wait:
        return EXIT_OK
    last = None
    for _ in range(max(1, int(args.timeout))):
        try:
            snap = api.snapshot(ns, name)
        except NotFound:
            snap = {"status": {"state": "Requested"}}
        state = (snap.get("status") or {}).get("state", "Pending")
        if state != last:
            print(f"  {name}: {state}", flush=True)
            last = state
        if state == "Completed":
            emit(snap, args.output, lambda: snapshot_rows([snap], now()))
            return EXIT_OK
        if state == "Failed":
            print(f"snapshot {name} failed: {(snap.get('status') or {}).get('message') or 'see its events'}",
                  file=sys.stderr)
            return EXIT_NOT_READY
        sleep(1.0)
    print(f"snapshot {name} is still {last} after {args.timeout:.0f}s; `kubectl eos snapshots {args.name}` shows it",
          file=sys.stderr)
    return EXIT_TIMEOUT


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="kubectl eos", description="Inspect and drive ExactlyOnceStreams.")
    ap.add_argument("-n", "--namespace", help="the namespace (default: the context's)")
    ap.add_argument("--context", help="the kubeconfig context")
    ap.add_argument("--kubeconfig", help="the kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    ap.add_argument("-o", "--output", choices=("json", "yaml"), help="print objects instead of tables")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="every stream of the namespace")
    for cmd, help_ in (("status", "a stream's state"), ("events", "a stream's events"),
                       ("suspend", "stop the driver at a batch boundary"), ("resume", "start it again"),
                       ("restart", "restart the driver (also after RestartsExhausted)")):
        sub.add_parser(cmd, help=help_).add_argument("name")
    sub.add_parser("snapshots", help="snapshot resources").add_argument("name", nargs="?")
    resolve = sub.add_parser("resolve", help="what resolution found and what a restart replays (--dry-run)")
    resolve.add_argument("name")
    resolve.add_argument("--dry-run", action="store_true", help="show, change nothing (the only mode)")
    snap = sub.add_parser("snapshot", help="take a snapshot now and wait for it")
    snap.add_argument("name")
    snap.add_argument("--no-wait", action="store_true", help="do not wait for it")
    snap.add_argument("--timeout", type=float, default=300.0, help="seconds to wait (default 300)")
    from .kubectl_verify import add_parser
    add_parser(sub)
    from .storage_migration import add_parser as add_migrate_parser
    add_migrate_parser(sub)
    from .kubectl_ui import add_parser as add_ui_parser
    add_ui_parser(sub)
    restore = sub.add_parser("restore", help="restore a stream from a snapshot on its next start")
    restore.add_argument("name")
    restore.add_argument("--from", dest="source", required=True, help="an ExactlyOnceSnapshot name or a path")
    return ap


def main(argv: list[str] | None = None, api: Api | None = None,
         now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
         sleep: Callable[[float], None] = time.sleep) -> int:
    args = parser().parse_args(argv)
    try:
        api = api or Api(args.kubeconfig, args.context)
        return run(args, api, now, sleep)
    except NotFound as exc:
        print(f"kubectl eos {args.command}: {exc} not found", file=sys.stderr)
        return EXIT_NOT_FOUND
    except Exception as exc:  # noqa: BLE001 - the API server or the config: say what and exit 1
        print(f"kubectl eos {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
