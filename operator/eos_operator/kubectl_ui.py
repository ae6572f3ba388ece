"""``kubectl eos ui NAME``: the running driver's Spark UI on this machine, through ``kubectl port-forward``.

Spark's UI is on while ``job.metrics.enabled`` is true (its Prometheus servlet is part of the UI's web server,
``eos_job.driver_metrics``), on ``job.metrics.port`` (4040 by default); without it the driver serves no UI and
this command says which field to set. What that costs: a web server thread pool and the UI's in-memory status
store in the driver (Spark keeps the last 1000 jobs and stages by default), a few tens of MB of heap; the UI
shows what the job runs (not its data or Secrets) to whoever reaches the Pod's port; it cannot kill stages.

The forward is kubectl's own (``kubectl port-forward``, the same kubeconfig and context), from a free local port
on 127.0.0.1 to the driver Pod's UI port; it ends with Ctrl-C, or when the driver Pod goes (a restarted driver is
a new Pod: run the command again). For a finished or restarted driver, Spark's History Server shows the event
log (``job.eventLog``, docs/operations.md).
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import threading
from typing import Any

from eos_job.driver_metrics import DEFAULT_PORT

FORWARDING = re.compile(r"Forwarding from 127\.0\.0\.1:(\d+) ->")


class NoUi(Exception):
    """The stream's driver serves no UI now; the message says why and what to do."""


def add_parser(sub) -> None:
    p = sub.add_parser("ui", help="port-forward to the running driver's Spark UI and print its local URL")
    p.add_argument("name")
    p.add_argument("--port", type=int, default=0, help="the local port (default: a free one)")


def ui_target(stream: dict[str, Any]) -> tuple[str, int]:
    """The running driver Pod and its UI port, or :class:`NoUi`."""
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
    return pod, int(metrics.get("port") or DEFAULT_PORT)


def port_forward(args: argparse.Namespace, ns: str, pod: str, port: int) -> tuple[subprocess.Popen, str]:
    """Start ``kubectl port-forward`` to ``pod``'s ``port``; returns it and the local URL once it forwards."""
    cmd = ["kubectl", "port-forward", "-n", ns, f"pod/{pod}", f"{args.port or ''}:{port}", "--address", "127.0.0.1"]
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
    raise NoUi(f"kubectl port-forward to {ns}/{pod}:{port} ended (exit {proc.returncode}): "
               f"{proc.stderr.read().strip()[-2000:]}")


def _relay(pipe) -> None:
    for line in pipe:
        print(f"kubectl port-forward: {line.rstrip()}", file=sys.stderr, flush=True)


def ui(args: argparse.Namespace, ns: str, stream: dict[str, Any]) -> int:
    try:
        pod, port = ui_target(stream)
        proc, url = port_forward(args, ns, pod, port)
    except NoUi as exc:
        print(f"kubectl eos ui: {exc}", file=sys.stderr)
        return 4
    print(f"Spark UI of {ns}/{args.name} (driver Pod {pod}, port {port}): {url}/  (Ctrl-C ends the forward)",
          flush=True)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait()
        return 0
