"""Dev tooling for the local stack's Kubernetes side: kubectl, and the operator as a local process.

Used by the operator e2e tests and the operator demo (``examples.colors.demo``):

* :class:`Kubectl` runs the stack's ``kubectl`` with its admin kubeconfig (both from
  ``.stack/env``) and reads ExactlyOnceStreams, Pods and Events back as JSON;
* :class:`OperatorProcess` runs ``python -m eos_operator run --namespace NS`` for one
  namespace as its own process group (so it can be stopped or SIGKILLed), logging to a file.

Nothing here starts the stack: ``python -m eos_stack up`` does.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import yaml

from .common import poll, timed_out
from .kube_reads import ApiReads, ReadFailed

REPO = Path(__file__).resolve().parents[2]
CRD_DIR = REPO / "crds"
# Namespace labels that make the API server's PodSecurity admission enforce the restricted level.
RESTRICTED = ("pod-security.kubernetes.io/enforce=restricted", "pod-security.kubernetes.io/enforce-version=latest")
# What the operator, the driver processes and Spark's Python workers import: the operator and the job
# runtime (also installed editable in the venv) and the repository root (``examples.*``).
PYTHONPATH = os.pathsep.join([str(REPO / "operator"), str(REPO / "jobs"), str(REPO),
                              os.environ.get("PYTHONPATH", "")])


class KubectlError(AssertionError):
    """A kubectl command failed (an AssertionError, so a failing call reads as a failed check in tests)."""


class Kubectl:
    """The stack's kubectl, with its kubeconfig: ``Kubectl(Stack().read_env())``."""

    def __init__(self, env: dict[str, str]):
        self.bin = env["KUBECTL"]
        self.env = {**os.environ, "KUBECONFIG": env["KUBECONFIG"]}
        self.reads = ApiReads(env["KUBECONFIG"])   # plain gets without a kubectl process (kube_reads.py)

    def run(self, *args: str, stdin: str | None = None, check: bool = True,
            timeout: float = 120) -> subprocess.CompletedProcess:
        proc = subprocess.run([self.bin, *args], input=stdin, capture_output=True, text=True, env=self.env,
                              timeout=timeout)
        if check and proc.returncode != 0:
            raise KubectlError(f"kubectl {' '.join(args)} failed: {proc.stderr}")
        return proc

    def json(self, *args: str) -> dict[str, Any]:
        try:
            read = self.reads.answer(args)
        except ReadFailed as exc:
            raise KubectlError(f"kubectl {' '.join(args)} failed: {exc}") from None
        return read if read is not None else json.loads(self.run(*args, "-o", "json").stdout)

    def apply(self, doc: dict[str, Any], namespace: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.run("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(doc), check=check)

    def apply_crds(self, timeout: str = "60s") -> list[str]:
        """Apply every CRD in ``crds/`` as generated and wait until the API server serves them; their names.
        Storage versions are tested on CRDs of their own (tests/stack/test_apiversions.py)."""
        names = []
        for path in sorted(CRD_DIR.glob("*.yaml")):
            doc = yaml.safe_load(path.read_text())
            self.run("apply", "-f", "-", stdin=yaml.safe_dump(doc, sort_keys=False))
            names.append(doc["metadata"]["name"])
        for name in names:
            self.run("wait", "--for=condition=Established", f"crd/{name}", f"--timeout={timeout}")
        return names

    def stream(self, namespace: str, name: str) -> dict[str, Any]:
        return self.json("get", "exactlyoncestream", name, "-n", namespace)

    def status(self, namespace: str, name: str) -> dict[str, Any]:
        return self.stream(namespace, name).get("status") or {}

    def pods(self, namespace: str) -> list[dict[str, Any]]:
        return self.json("get", "pods", "-n", namespace)["items"]

    def events(self, namespace: str, name: str) -> list[str]:
        """The reasons of the events about ``name``, oldest first; an event counted N times (the operator
        aggregates a repeated event into its first) is N occurrences, at its latest."""
        return [e["reason"] for e in self.event_objects(namespace, name) for _ in range(int(e.get("count") or 1))]

    def event_objects(self, namespace: str, name: str) -> list[dict[str, Any]]:
        items = self.json("get", "events", "-n", namespace)["items"]
        items = [e for e in items if e["involvedObject"].get("name") == name]
        # The resourceVersion orders them by their latest occurrence (timestamps have 1 s resolution).
        items.sort(key=lambda e: int(e["metadata"]["resourceVersion"]))
        return items

    def event_messages(self, namespace: str, name: str, reason: str) -> list[str]:
        items = self.json("get", "events", "-n", namespace)["items"]
        return [e["message"] for e in items if e["involvedObject"].get("name") == name and e["reason"] == reason]

    def patch_spec(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self.run("patch", "exactlyoncestream", name, "-n", namespace, "--type=merge", "-p",
                 json.dumps({"spec": patch}))


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    """The condition ``type_`` of a status, or ``{}``."""
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})


class OperatorProcess:
    """``python -m eos_operator run`` for one namespace, as its own process (so it can be SIGKILLed).

    ``switches`` are extra environment variables for the process. A subclass may set
    ``wrapper`` to a Python program run with ``python -c`` instead of ``-m eos_operator``
    (it gets the same arguments, e.g. to patch the operator for fault injection).
    """

    wrapper: str | None = None

    def __init__(self, kubeconfig: str, namespace: str, log_path: Path, *, liveness_port: int | None = None,
                 interval: float = 1, resolution_timeout: float = 30, progress_interval: float = 2,
                 horizon_interval: float = 2, metrics_port: int | None = None, leader_election: bool = False,
                 extra_args: tuple[str, ...] = (), **switches: str):
        self.kubeconfig, self.namespace, self.log_path, self.switches = kubeconfig, namespace, log_path, switches
        self.leader_election = leader_election   # a Lease in the watched namespace; identity <host>-<pid>
        self.liveness_port = liveness_port
        self.interval, self.resolution_timeout, self.progress_interval = (interval, resolution_timeout,
                                                                          progress_interval)
        self.horizon_interval, self.metrics_port = horizon_interval, metrics_port
        self.extra_args = tuple(extra_args)   # further `run` options (e.g. --no-informers)
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        program = ["-c", self.wrapper] if self.wrapper else ["-m", "eos_operator"]
        # One machine plays every node here, so a local checkpoint directory is one store for all Pods.
        return [sys.executable, *program, "run", "--namespace", self.namespace, "--allow-local-store",
                "--kubeconfig", self.kubeconfig, "--interval", f"{self.interval:g}",
                "--resolution-timeout", f"{self.resolution_timeout:g}",
                "--progress-interval", f"{self.progress_interval:g}",
                "--horizon-interval", f"{self.horizon_interval:g}",
                *(["--liveness", f"http://127.0.0.1:{self.liveness_port}/healthz"] if self.liveness_port else []),
                *(["--metrics-port", str(self.metrics_port), "--metrics-address", "127.0.0.1"]
                  if self.metrics_port else []),
                *(["--leader-election", "--leader-election-namespace", self.namespace] if self.leader_election else []),
                *self.extra_args]

    @property
    def identity(self) -> str:
        """Its Lease identity (leader.default_identity without POD_NAME)."""
        import socket
        return f"{socket.gethostname()}-{self.proc.pid}"

    def start(self) -> "OperatorProcess":
        env = {**os.environ, "PYTHONPATH": PYTHONPATH, **self.switches}
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== operator start {time.strftime('%X')} {self.switches}\n".encode())
            self.proc = subprocess.Popen(self.command(), cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill9()

    def tail(self, n: int = 60) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])


def wait_until(check: Callable[[], Any], what: str, timeout: float, diagnostics: Callable[[], str] = lambda: "",
               interval: float = 0.5) -> Any:
    """Poll ``check()`` until truthy; on timeout fail with the last error and ``diagnostics()``."""
    value, last_exc = poll(check, timeout, interval=interval)
    if value:
        return value
    raise AssertionError(f"{timed_out(what, timeout, last_exc)}\n{diagnostics()}")


def holds_for(check: Callable[[], Any], what: str, seconds: float, diagnostics: Callable[[], str] = lambda: "",
              interval: float = 0.5) -> None:
    """A quiet period: ``check()`` must stay truthy for ``seconds``, polled all along; fail at the first
    falsy answer. For "nothing more happens" claims, where a single look after a sleep could miss a change."""
    started = time.monotonic()
    while True:
        if not check():
            raise AssertionError(f"{what} stopped holding after {time.monotonic() - started:.1f}s of "
                                 f"{seconds:.0f}s\n{diagnostics()}")
        if time.monotonic() - started >= seconds:
            return
        time.sleep(interval)
