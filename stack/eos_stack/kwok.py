"""KWOK (``sigs.k8s.io/kwok``): fake Nodes for the scale benchmark, whose Pods go ``Running`` and, once deleted,
go away, all through the stack's real API server and with no container behind them.

* **Binary.** ``kwok`` ``KWOK_VERSION`` from the Go module proxy, ``go install``-ed into
  ``<cache>/bin/kwok-<version>/`` on first use (about 5 minutes cold on two cores, then cached). Only the scale
  benchmark and its stack test ask for it: ``make test``'s preparation does not build it.
* **Stages.** KWOK ships its Pod and Node lifecycles as ``Stage`` documents in its module
  (``kustomize/stage``); the ones named in ``STAGES`` (a Node initialised Ready with a heartbeat; a Pod made
  ``Running`` and Ready with a fake IP; a deleted Pod removed at once) are concatenated, from the module
  cache the build filled, into ``stages.yaml`` beside the binary.
* **Nodes.** ``KwokNodes`` starts one ``kwok`` controller that manages only the Nodes labelled
  ``eos.dev/kwok=<run>`` and creates them; each is tainted (``TAINT``) so no other workload of the shared
  stack lands there: a Pod goes to a fake Node only with ``pod_template(run)``: the toleration, a
  nodeSelector of the run, and the stack's scheduler (``node_config.SCHEDULER_NAME``: the stack schedules only
  Pods that name it).
  The fake Pod IPs come from ``POD_CIDR``, a range only written into Pod status (nothing routes it).
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from kubernetes import client

from .common import Stack, StackError, log, stop_process, wait_for
from .go_build import build_once, go_env, go_install
from .node_config import SCHEDULER_NAME

KWOK_VERSION = "v0.8.0"
STAGES = ("node/fast/node-initialize.yaml", "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
          "pod/fast/pod-ready.yaml", "pod/fast/pod-complete.yaml", "pod/fast/pod-delete.yaml")
LABEL = "eos.dev/kwok"
TAINT = {"key": "eos.dev/kwok", "value": "fake", "effect": "NoSchedule"}
POD_CIDR = "10.250.0.0/16"   # 65k fake Pod IPs: only ever written into Pod status
# kwok renews each fake Node's Lease every LEASE_SECONDS / 4 = 10 s, as a kubelet does. Without the flag the binary
# keeps no Lease at all (seen: 404), only a status heartbeat about every 22 s, past the stack's 20 s
# node-monitor grace (kube.py): the node lifecycle controller could mark the fake Nodes NotReady and evict their Pods.
LEASE_SECONDS = 40


def folder(st: Stack) -> Path:
    return st.cache / "bin" / f"kwok-{KWOK_VERSION}"


def stages_file(st: Stack) -> Path:
    return folder(st) / "stages.yaml"


def ensure_binary(st: Stack) -> Path:
    """``kwok`` and its ``stages.yaml``, built once into the cache."""
    out, exe = folder(st), folder(st) / "kwok"

    def build() -> None:
        go_install(st, exe, f"sigs.k8s.io/kwok/cmd/kwok@{KWOK_VERSION}", what="kwok",
                   estimate="about 5 minutes on a cold cache")
        source = Path(go_env(st)["GOMODCACHE"]) / f"sigs.k8s.io/kwok@{KWOK_VERSION}" / "kustomize" / "stage"
        missing = [s for s in STAGES if not (source / s).is_file()]
        if missing:
            raise StackError(f"kwok {KWOK_VERSION}: stages {missing} not found under {source}")
        tmp = stages_file(st).with_suffix(".tmp")
        tmp.write_text("\n---\n".join((source / s).read_text().strip() for s in STAGES) + "\n")
        tmp.replace(stages_file(st))

    build_once(out, "kwok: another build of it is running; waiting for it",
               lambda: os.access(exe, os.X_OK) and stages_file(st).is_file(), build)
    return exe


def pod_template(run: str) -> dict:
    """A stream's ``job.podTemplate`` that puts its Pods on this run's fake Nodes, through the stack's scheduler."""
    return {"schedulerName": SCHEDULER_NAME, "nodeSelector": {LABEL: run},
            "tolerations": [{"key": TAINT["key"], "operator": "Equal", "value": TAINT["value"],
                             "effect": TAINT["effect"]}]}


def node_manifest(name: str, run: str) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {LABEL: run, "kubernetes.io/hostname": name, "type": "kwok"},
                         "annotations": {"kwok.x-k8s.io/node": "fake"}},
            "spec": {"taints": [TAINT]},
            # node-initialize keeps a given allocatable: room for every stream of the largest run.
            "status": {"allocatable": {"cpu": "1k", "memory": "10Ti", "pods": "100k"},
                       "capacity": {"cpu": "1k", "memory": "10Ti", "pods": "100k"}}}


class KwokNodes:
    """One ``kwok`` controller and its fake Nodes, ``run`` naming both (its label value), for one process's use:
    ``start()`` returns once every Node is Ready, ``stop()`` deletes the Nodes and ends the controller."""

    def __init__(self, kubeconfig: str, run: str, log_file: Path, *, nodes: int = 1):
        self.kubeconfig, self.run, self.log_file = kubeconfig, run, log_file
        self.names = [f"kwok-{run}-{i}" for i in range(nodes)]
        self.core = client.CoreV1Api(client.ApiClient(_config(kubeconfig)))
        self.proc: subprocess.Popen | None = None

    def start(self) -> "KwokNodes":
        st = Stack()
        exe = ensure_binary(st)
        argv = [str(exe), "--kubeconfig", self.kubeconfig, "--config", str(stages_file(st)),
                "--manage-nodes-with-label-selector", f"{LABEL}={self.run}", "--cidr", POD_CIDR,
                "--node-ip", "10.250.255.254", "--node-lease-duration-seconds", str(LEASE_SECONDS)]
        with open(self.log_file, "ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log(f"kwok {KWOK_VERSION} (pid {self.proc.pid}) managing Nodes {LABEL}={self.run}")
        for name in self.names:
            self.core.create_node(node_manifest(name, self.run))
        wait_for(self.ready, f"kwok's Nodes {self.names} Ready (log {self.log_file})", 60,
                 on_fail=lambda: self.log_file.read_text(errors="replace")[-3000:])
        for name in self.names:
            # The API server taints a new Node not-ready; the node lifecycle controller lifts it once the Node is
            # Ready, but one started by older code runs none: done here too. The Lease (LEASE_SECONDS) keeps the
            # fake Nodes Ready under that controller's 20 s grace (kube.py): their Pods are not marked or evicted.
            self.core.patch_node(name, {"spec": {"taints": [TAINT]}})
        return self

    def ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise StackError(f"kwok exited {self.proc.returncode}: {self.log_file.read_text(errors='replace')[-3000:]}")
        nodes = self.core.list_node(label_selector=f"{LABEL}={self.run}").items
        return len(nodes) == len(self.names) and all(
            any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or [])) for n in nodes)

    def stop(self) -> None:
        for name in self.names:
            try:
                self.core.delete_node(name)
            except client.ApiException:
                pass
        stop_process(self.proc)
        self.proc = None


def _config(kubeconfig: str) -> client.Configuration:
    from kubernetes import config
    conf = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=conf)
    return conf

