"""What Argo CD and Flux make of streams and snapshots, computed by the real things: the chart's Lua health checks
(charts/spark-eos-operator/health/) in gopher-lua, the Lua interpreter Argo CD embeds, run the way Argo CD runs a
resource customization, and kstatus (sigs.k8s.io/cli-utils), the library Flux computes health with; both in
``gitops-check``, which the stack builds (stack/eos_stack/gitops.py). The documents are those the operator
writes in every state (gitops_states.py), first as written, then as the stack's real API server returns them
after the operator's status went through the generated CRDs; ``kubectl wait`` as the chart README shows it
runs against the same objects.
"""
from __future__ import annotations

import copy
import json
import subprocess
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from eos_operator.crd import build_crd, build_snapshot_crd

from .fakes import base_spec
from .gitops_states import State, gitops_states

# The scratch copies of the CRDs get names of their own: a plural, kind or short name shared with the real CRDs
# could make another test's `kubectl get eos` resolve to them on the shared API server.
SCRATCH_KIND = {"ExactlyOnceStream": "EosGitopsStream", "ExactlyOnceSnapshot": "EosGitopsSnapshot"}


@pytest.fixture(scope="module")
def gitops_check(stack_env) -> str:
    exe = stack_env.get("GITOPS_CHECK")
    assert exe, ".stack/env has no GITOPS_CHECK: `python -m eos_stack up gitops` builds it"
    return exe


def check(exe: str, docs: list[dict[str, Any]], scripts: dict[str, Path] | None = None) -> list[tuple[str, str, dict]]:
    """(Argo CD status, kstatus status, the whole result) per document."""
    from eos_stack.gitops import check as gitops_check

    results = gitops_check(exe, docs, scripts)
    errors = [(d["metadata"]["name"], r["error"]) for d, r in zip(docs, results) if "error" in r]
    assert not errors, errors
    return [(r["argocd"]["status"], r["kstatus"]["status"], r) for r in results]


def test_the_states_tell_every_health_of_both_tools_apart():
    """Not a test that passes whatever the tools say: the expectations cover every verdict of each."""
    states = gitops_states()
    assert {s.argocd for s in states} == {"Healthy", "Progressing", "Degraded", "Suspended"}
    assert {s.kstatus for s in states} == {"Current", "InProgress", "Failed", "Terminating"}


def test_argo_cd_and_kstatus_on_what_the_operator_writes(gitops_check):
    states = gitops_states()
    results = check(gitops_check, [s.doc for s in states])   # the chart's scripts, keyed by the real group
    got = {s.name: (argo, kstatus) for s, (argo, kstatus, _) in zip(states, results)}
    assert got == {s.name: (s.argocd, s.kstatus) for s in states}
    # Each verdict carries the operator's words: the reason a person acts on is in the message.
    for s, (_, _, result) in zip(states, results):
        if s.argocd == "Degraded":
            stalled_or_degraded = [c for c in s.doc["status"]["conditions"]
                                   if c["type"] in ("Stalled", "Degraded", "Ready") and c["message"]]
            assert any(c["message"] in result["argocd"]["message"] for c in stalled_or_degraded), (s.name, result)
        if s.kstatus == "Failed":
            stalled = next(c for c in s.doc["status"]["conditions"] if c["type"] == "Stalled")
            assert result["kstatus"]["message"] == stalled["message"], (s.name, result)


# ----------------------------------------------------------------- through the real API server
class Served:
    def __init__(self, kubectl, group: str, namespace: str):
        self.kubectl, self.group, self.ns = kubectl, group, namespace
        self.docs: dict[str, dict[str, Any]] = {}

    def resource(self, kind: str) -> str:
        return f"{SCRATCH_KIND[kind].lower()}s.{self.group}"

    def wait(self, kind: str, name: str, condition: str, timeout: str) -> subprocess.CompletedProcess:
        return self.kubectl.run("wait", condition, f"{self.resource(kind)}/{name}", "-n", self.ns,
                                f"--timeout={timeout}", check=False, timeout=120)


def _scratch_crds(group: str) -> list[dict[str, Any]]:
    crds = []
    for crd in (build_crd(), build_snapshot_crd()):
        kind = SCRATCH_KIND[crd["spec"]["names"]["kind"]]
        crd["spec"]["group"] = group
        crd["spec"]["names"] = {"kind": kind, "listKind": f"{kind}List", "plural": f"{kind.lower()}s",
                                "singular": kind.lower()}
        crd["metadata"]["name"] = f"{kind.lower()}s.{group}"
        crds.append(crd)
    return crds


def _served_generation(state: State) -> int:
    """The object on the server starts at generation 1; one spec change more for a status that lags."""
    status = state.doc.get("status") or {}
    lag = state.doc["metadata"]["generation"] - status.get("observedGeneration", state.doc["metadata"]["generation"])
    return 1 + lag


def _relative_status(state: State) -> dict[str, Any]:
    """The operator's status with its generations moved onto the served object's (1 and up)."""
    status = copy.deepcopy(state.doc["status"])
    shift = state.doc["metadata"]["generation"] - _served_generation(state)
    status["observedGeneration"] -= shift
    for c in status.get("conditions") or []:
        c["observedGeneration"] -= shift
    return status


@pytest.fixture(scope="module")
def served(stack_env) -> Iterator[Served]:
    """Every state's object created on the stack's API server under scratch copies of the generated CRDs, its
    status written through the status subresource as the operator writes it, and read back."""
    from eos_stack.cluster import Kubectl

    kubectl = Kubectl(stack_env)
    suffix = uuid.uuid4().hex[:8]
    s = Served(kubectl, f"g{suffix}.gitops.eos.dev", f"eos-gitops-{suffix[:6]}")
    crds = _scratch_crds(s.group)
    states = gitops_states()
    try:
        for crd in crds:
            kubectl.run("apply", "-f", "-", stdin=json.dumps(crd))
        for crd in crds:
            kubectl.run("wait", "--for=condition=Established", f"crd/{crd['metadata']['name']}", "--timeout=60s")
        kubectl.run("create", "namespace", s.ns)
        for state in states:
            deleting = bool(state.doc["metadata"].get("deletionTimestamp"))
            meta = {"name": state.name, "namespace": s.ns}
            if deleting:   # held by a finalizer, so it stays, being deleted, as the operator's own finalizer holds it
                meta["finalizers"] = ["streaming.eos.dev/gitops-test"]
            # The CRD's own rules refuse the invalid spec (CEL): the operator's InvalidSpec status is for what
            # only it checks; the server's copy carries it on an accepted spec.
            spec = base_spec() if state.name == "stream-invalid-spec" else state.doc["spec"]
            kubectl.run("create", "-f", "-", stdin=json.dumps({"apiVersion": f"{s.group}/v1beta1",
                                                             "kind": SCRATCH_KIND[state.kind], "metadata": meta,
                                                             "spec": spec}))
            ref = [s.resource(state.kind), state.name, "-n", s.ns]
            for nonce in range(1, _served_generation(state)):
                kubectl.run("patch", *ref, "--type=merge", "-p", json.dumps({"spec": {"restartNonce": nonce}}))
            if state.doc.get("status"):
                kubectl.run("patch", *ref, "--subresource=status", "--type=merge",
                            "-p", json.dumps({"status": _relative_status(state)}))
            if deleting:
                kubectl.run("delete", *ref, "--wait=false")
        for kind in SCRATCH_KIND:
            for item in kubectl.json("get", s.resource(kind), "-n", s.ns)["items"]:
                s.docs[item["metadata"]["name"]] = item
        yield s
    finally:
        for kind in SCRATCH_KIND:
            for name in [n for n, d in s.docs.items() if d["metadata"].get("finalizers")]:
                kubectl.run("patch", s.resource(kind), name, "-n", s.ns, "--type=merge", "-p",
                            '{"metadata":{"finalizers":null}}', check=False)
        for crd in crds:
            kubectl.run("delete", "crd", crd["metadata"]["name"], "--ignore-not-found", "--wait=false", check=False)
        kubectl.run("delete", "namespace", s.ns, "--ignore-not-found", "--wait=false", check=False)


def without_nulls(value: Any) -> Any:
    """A merge patch's null removes the field, at any depth (RFC 7386): what the server keeps of a patch."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def test_the_api_server_keeps_every_field_of_the_operators_status(served):
    """Nothing the operator writes is pruned by the CRD's schema (Reconciling and Stalled included)."""
    for state in gitops_states():
        if state.doc.get("status"):
            assert served.docs[state.name]["status"] == without_nulls(_relative_status(state)), state.name


def test_argo_cd_and_kstatus_on_what_the_api_server_returns(served, gitops_check):
    states = gitops_states()
    docs = [served.docs[s.name] for s in states]
    assert all(d["metadata"].get("deletionTimestamp") for s, d in zip(states, docs) if s.kstatus == "Terminating")
    from eos_stack.gitops import HEALTH_SCRIPTS
    scripts = {f"{served.group}/{SCRATCH_KIND[key.split('/')[1]]}": path for key, path in HEALTH_SCRIPTS.items()}
    results = check(gitops_check, docs, scripts)
    got = {s.name: (argo, kstatus) for s, (argo, kstatus, _) in zip(states, results)}
    assert got == {s.name: (s.argocd, s.kstatus) for s in states}


def test_kubectl_wait_as_the_chart_readme_shows_it(served):
    stream, snapshot = "ExactlyOnceStream", "ExactlyOnceSnapshot"
    ok = [(stream, "stream-running", "--for=condition=Ready"),
          (stream, "stream-running", "--for=jsonpath={.status.lifecycleState}=Running"),
          (stream, "stream-running", "--for=jsonpath={.status.observedGeneration}=1"),
          (stream, "stream-suspended", "--for=jsonpath={.status.lifecycleState}=Suspended"),
          (stream, "stream-restarts-exhausted", "--for=condition=Stalled"),
          (stream, "stream-running", "--for=condition=Stalled=false"),
          (stream, "stream-running", "--for=condition=Reconciling=false"),
          (stream, "stream-upgrade-refused-by-pre-flight", "--for=condition=Reconciling=false"),
          # jsonpath looks at no generation: the old spec's Running (the chart README says so)
          (stream, "stream-spec-not-yet-observed", "--for=jsonpath={.status.lifecycleState}=Running"),
          (snapshot, "snapshot-completed", "--for=jsonpath={.status.state}=Completed"),
          (snapshot, "snapshot-completed", "--for=condition=Ready")]
    for kind, name, condition in ok:
        proc = served.wait(kind, name, condition, "30s")
        assert proc.returncode == 0, (name, condition, proc.stderr)
        assert "condition met" in proc.stdout, (name, condition, proc.stdout)
    # And it waits (here: times out) where the state is not reached, or the spec not yet acted on.
    waits = [(stream, "stream-deploying", "--for=condition=Ready"),
             (stream, "stream-suspended", "--for=condition=Ready"),
             (stream, "stream-spec-not-yet-observed", "--for=jsonpath={.status.observedGeneration}=2"),
             (stream, "stream-spec-not-yet-observed", "--for=condition=Ready"),   # Ready of generation 1
             (stream, "stream-upgrade-pre-flight", "--for=condition=Reconciling=false"),   # Ready, not done
             (snapshot, "snapshot-failed", "--for=condition=Ready"),
             (snapshot, "snapshot-in-progress", "--for=jsonpath={.status.state}=Completed")]
    for kind, name, condition in waits:
        proc = served.wait(kind, name, condition, "2s")
        assert proc.returncode != 0 and "timed out" in proc.stderr, (name, condition, proc.stdout, proc.stderr)
