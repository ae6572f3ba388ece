"""``kubectl eos ui NAME``: the running driver's Spark UI on this machine, through ``kubectl port-forward``.

Spark's UI is on while ``job.metrics.enabled`` is true (its Prometheus servlet is part of the UI's web server,
``eos_job.driver_metrics``), on ``job.metrics.port`` (4040 by default); without it the driver serves no UI and
this command says which field to set. What that costs: a web server thread pool and the UI's in-memory status
store in the driver (Spark keeps the last 1000 jobs and stages by default), a few tens of MB of heap; the UI
shows what the job runs (not its data or Secrets) to whoever reaches the Pod's port; it cannot kill stages.

The forward is kubectl's own (``kubectl port-forward``, the same kubeconfig and context), from a free local port
on 127.0.0.1 to the UI port. With the stream's Spark UI Service (``job.metrics.uiService``, ``spark_ui.py``) it
forwards to ``svc/<name>-ui``: kubectl picks the running driver the Service selects. A forward is bound to that
one Pod (kubectl's, whatever the target), and kubectl ends it once the Pod is gone; through the Service this
command then forwards again on the same local port, to the driver the Service selects now (kubectl waits up to
a minute for one to run), so the URL outlives a driver restart (a request during the restart fails). Without
the Service it forwards to the driver Pod and ends with it (run the command again). For a finished or restarted
driver's past, Spark's History Server shows the event log (``job.eventLog``, docs/operations.md).
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import threading
import time
from typing import Any, Callable

from eos_job.driver_metrics import DEFAULT_PORT

from .spark_ui import PORT_NAME, service_name

FORWARDING = re.compile(r"Forwarding from 127\.0\.0\.1:(\d+) ->")


class NoUi(Exception):
    """The stream's driver serves no UI now; the message says why and what to do."""


def add_parser(sub) -> None:
    p = sub.add_parser("ui", help="port-forward to the running driver's Spark UI and print its local URL")
    p.add_argument("name")
    p.add_argument("--port", type=int, default=0, help="the local port (default: a free one)")


def ui_service(api, ns: str, stream: dict[str, Any]) -> dict[str, Any] | None:
    """The stream's Spark UI Service (job.metrics.uiService) if it has one: ``<name>-ui`` owned by the stream."""
    meta = stream.get("metadata") or {}
    svc = api.service(ns, service_name(meta.get("name", "")))
    owners = {o.get("uid") for o in ((svc or {}).get("metadata") or {}).get("ownerReferences") or []}
    return svc if svc is not None and meta.get("uid") in owners else None


def ui_target(stream: dict[str, Any], service: dict[str, Any] | None = None) -> tuple[str, int]:
    """Where to forward: the stream's Spark UI Service (``svc/<name>-ui`` and its port) when given, else the
    running driver Pod (``pod/<name>``) and its UI port; or :class:`NoUi`."""
    meta, spec, status = stream.get("metadata") or {}, stream.get("spec") or {}, stream.get("status") or {}
    ref = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    metrics = (spec.get("job") or {}).get("metrics") or {}
    if not metrics.get("enabled"):
        raise NoUi(f"{ref}: the driver's Spark UI is off. It is on with job.metrics.enabled: true (Spark's UI and "
                   "its Prometheus servlet, port job.metrics.port, default 4040; a change restarts the driver); "
                   "a finished or earlier driver's jobs: job.eventLog and the History Server (docs/operations.md)")
    pod = status.get("driverPod")
    if not pod or status.get("lifecycleState") != "Running":
        raise NoUi(f"{ref}: no driver is running (lifecycleState {status.get('lifecycleState') or 'unknown'}); "
                   f"`kubectl eos status {meta.get('name', '')}` shows why")
    ports = [p for p in ((service or {}).get("spec") or {}).get("ports") or [] if p.get("name") == PORT_NAME]
    if ports:
        return f"svc/{service['metadata']['name']}", int(ports[0]["port"])
    return f"pod/{pod}", int(metrics.get("port") or DEFAULT_PORT)


def port_forward(args: argparse.Namespace, ns: str, target: str, port: int) -> tuple[subprocess.Popen, str]:
    """Start ``kubectl port-forward`` to ``target``'s ``port`` (``svc/...`` or ``pod/...``; a bare name is a
    Pod); returns it and the local URL once it forwards."""
    target = target if "/" in target else f"pod/{target}"
    cmd = ["kubectl", "port-forward", "-n", ns, target, f"{args.port or ''}:{port}", "--address", "127.0.0.1"]
    if getattr(args, "kubeconfig", None):
        cmd += ["--kubeconfig", args.kubeconfig]
    if getattr(args, "context", None):
        cmd += ["--context", args.context]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:     # kubectl prints the forwarding line once it listens
        m = FORWARDING.search(line)
        if m:   # then "Handling connection for ..." per connection: drained, or the pipe would fill and block it;
            # its errors (a connection the Pod refused, the Pod gone) are passed on to ours, for the same reason
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            threading.Thread(target=_relay, args=(proc.stderr,), daemon=True).start()
            return proc, f"http://127.0.0.1:{m.group(1)}"
    proc.wait()
    raise NoUi(f"kubectl port-forward to {ns} {target}:{port} ended (exit {proc.returncode}): "
               f"{proc.stderr.read().strip()[-2000:]}")


def _relay(pipe) -> None:
    for line in pipe:
        print(f"kubectl port-forward: {line.rstrip()}", file=sys.stderr, flush=True)


def ui(args: argparse.Namespace, ns: str, stream: dict[str, Any], service: dict[str, Any] | None = None, *,
       again_for: float = 120.0, sleep: Callable[[float], None] = time.sleep) -> int:
    try:
        target, port = ui_target(stream, service)
        proc, url = port_forward(args, ns, target, port)
    except NoUi as exc:
        print(f"kubectl eos ui: {exc}", file=sys.stderr)
        return 4
    print(f"Spark UI of {ns}/{args.name} ({target}, port {port}): {url}/  (Ctrl-C ends the forward)", flush=True)
    try:
        while True:
            code = proc.wait()
            if not target.startswith("svc/"):
                return code
            # The driver behind the Service went (a restart): forward again, same local port, to the next one.
            print(f"kubectl eos ui: the forward ended (exit {code}; the driver restarted?): forwarding {target} "
                  f"again on {url}", file=sys.stderr, flush=True)
            proc = _forward_again(argparse.Namespace(**{**vars(args), "port": int(url.rsplit(":", 1)[1])}),
                                  ns, target, port, again_for, sleep)
            if proc is None:
                return code
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait()
        return 0


def _forward_again(args: argparse.Namespace, ns: str, target: str, port: int, within: float,
                   sleep: Callable[[float], None]) -> subprocess.Popen | None:
    """A new forward to ``target`` on ``args.port``, tried for ``within`` seconds (None: it did not come)."""
    deadline = time.monotonic() + within
    while True:
        try:
            return port_forward(args, ns, target, port)[0]
        except NoUi as exc:
            if time.monotonic() >= deadline:
                print(f"kubectl eos ui: {exc}; giving up", file=sys.stderr, flush=True)
                return None
            sleep(2.0)
