"""``kubectl eos`` as users run it: kubectl finds ``kubectl-eos`` on PATH and the plugin talks to the real API
server with the kubeconfig's credentials. No operator runs here: the stream's status is written as the
operator would (the status subresource), and what the plugin patches is read back from the server."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import yaml

from eos_stack.cluster import Kubectl

REPO = Path(__file__).resolve().parents[2]


def test_kubectl_finds_the_plugin_and_it_reads_and_drives_a_stream(stack_env, namespace):
    bindir = Path(sys.executable).parent
    assert (bindir / "kubectl-eos").is_file(), "kubectl-eos is installed with the project (pip install -e .)"
    kubectl = Kubectl(stack_env)
    kubectl.env["PATH"] = f"{bindir}{os.pathsep}{kubectl.env.get('PATH', '')}"
    kubectl.apply_crds()
    doc = yaml.safe_load((REPO / "examples" / "colors.yaml").read_text())
    doc["metadata"]["namespace"] = namespace
    kubectl.apply(doc, namespace)
    status = {"lifecycleState": "Running", "driverPod": "colors-driver-0", "lastCommittedBatch": 7,
              "conditions": [{"type": "Ready", "status": "True", "reason": "Running", "message": "batch 7"}]}
    kubectl.run("patch", "exactlyoncestream", "colors", "-n", namespace, "--subresource=status", "--type=merge",
                "-p", json.dumps({"status": status}))

    def eos(*args: str):
        return kubectl.run("eos", "-n", namespace, *args, check=False)

    out = eos("status", "colors")
    assert out.returncode == 0, out.stderr
    assert f"{namespace}/colors" in out.stdout and "7 committed" in out.stdout and "Ready=True" in out.stdout
    listed = eos("-o", "json", "list")
    assert [s["metadata"]["name"] for s in json.loads(listed.stdout)["items"]] == ["colors"]
    assert eos("restart", "colors").returncode == 0
    assert eos("snapshot", "colors", "--no-wait").returncode == 0
    spec = kubectl.json("get", "exactlyoncestream", "colors", "-n", namespace)["spec"]
    assert (spec["restartNonce"], spec["snapshotNonce"]) == (1, 1)
    missing = eos("status", "nope")
    assert missing.returncode == 3 and f"exactlyoncestream {namespace}/nope not found" in missing.stderr
    kubectl.run("patch", "exactlyoncestream", "colors", "-n", namespace, "--subresource=status", "--type=merge",
                "-p", json.dumps({"status": {"conditions": [{"type": "Ready", "status": "False",
                                                              "reason": "DriverFailed", "message": "exit 1"}]}}))
    assert eos("status", "colors").returncode == 4   # not Ready: a script can tell
