"""Helpers of the chart tests: the stack's helm and kubectl, rendering, unique names."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
for extra in (REPO / "operator", REPO / "jobs", REPO / "stack"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from eos_stack.cluster import wait_until  # noqa: E402,F401 - re-exported for the chart tests

CHART = REPO / "charts" / "spark-eos-operator"
HERE = Path(__file__).resolve().parent
VALUES_ALL = HERE / "values-all.yaml"

from .rbac_model import Call  # noqa: E402


class Helm:
    """The stack's helm with its config, cache and data kept in a temporary folder."""

    def __init__(self, env: dict[str, str], home: Path):
        self.bin = env["HELM"]
        home.mkdir(parents=True, exist_ok=True)
        self.env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "KUBECONFIG": env["KUBECONFIG"],
                    "HELM_CONFIG_HOME": str(home / "config"), "HELM_CACHE_HOME": str(home / "cache"),
                    "HELM_DATA_HOME": str(home / "data")}

    def run(self, *args: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess:
        proc = subprocess.run([self.bin, *args], capture_output=True, text=True, env=self.env, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed (exit {proc.returncode}):\n"
                                 f"{proc.stdout}\n{proc.stderr}")
        return proc

    def template(self, *args: str, release: str = "eos", namespace: str = "eos-system",
                 chart: Path = CHART) -> list[dict[str, Any]]:
        out = self.run("template", release, str(chart), "--namespace", namespace, *args).stdout
        return [d for d in yaml.safe_load_all(out) if d]


class Kubectl:
    def __init__(self, env: dict[str, str], kubeconfig: str | None = None):
        self.bin = env["KUBECTL"]
        self.env = {**os.environ, "KUBECONFIG": kubeconfig or env["KUBECONFIG"]}

    def run(self, *args: str, stdin: str | None = None, check: bool = True,
            timeout: float = 120) -> subprocess.CompletedProcess:
        proc = subprocess.run([self.bin, *args], input=stdin, capture_output=True, text=True, env=self.env,
                              timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed (exit {proc.returncode}):\n"
                                 f"{proc.stdout}\n{proc.stderr}")
        return proc

    def json(self, *args: str) -> dict[str, Any]:
        return json.loads(self.run(*args, "-o", "json").stdout)

    def exists(self, *args: str) -> bool:
        return self.run("get", *args, "--ignore-not-found", "-o", "name", check=False).stdout.strip() != ""


def chart_version(key: str = "version") -> str:
    """The chart's ``version`` (or ``appVersion``), as a release writes it (stack/eos_stack/release.py)."""
    return str(yaml.safe_load((CHART / "Chart.yaml").read_text())[key])


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def values_all(path: Path, ns_a: str, ns_b: str) -> Path:
    """values-all.yaml with its two placeholder namespaces filled in."""
    path.write_text(VALUES_ALL.read_text().replace("__NS_A__", ns_a).replace("__NS_B__", ns_b))
    return path


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {[d['metadata'].get('name') for d in found]}"
    return found[0]


def sa_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def can_i(kubectl: Kubectl, user: str, call: Call, namespace: str | None) -> bool:
    args = ["auth", "can-i", call.verb, call.kubectl_resource, f"--as={user}"]
    if call.subresource:
        args.append(f"--subresource={call.subresource}")
    args += ["--all-namespaces"] if call.cluster_scoped or namespace is None else ["-n", namespace]
    proc = kubectl.run(*args, check=False)
    answer = proc.stdout.strip()
    assert answer in ("yes", "no"), f"kubectl {' '.join(args)}: {proc.stdout}{proc.stderr}"
    return answer == "yes"




def install(helm: Helm, release: str, namespace: str, *args: str) -> list[dict[str, Any]]:
    helm.run("install", release, str(CHART), "--namespace", namespace, *args)
    return [d for d in yaml.safe_load_all(helm.run("get", "manifest", release, "-n", namespace).stdout) if d]


def token_kubeconfig(kubectl: Kubectl, admin_kubeconfig: str, namespace: str, sa: str, path: Path) -> Path:
    """A kubeconfig that authenticates as the ServiceAccount with a TokenRequest token."""
    token = kubectl.run("create", "token", sa, "-n", namespace, "--duration=1h").stdout.strip()
    admin = yaml.safe_load(Path(admin_kubeconfig).read_text())
    cluster = admin["clusters"][0]
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "clusters": [cluster],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": sa, "context": {"cluster": cluster["name"], "user": sa, "namespace": namespace}}],
        "current-context": sa}))
    path.chmod(0o600)
    return path
