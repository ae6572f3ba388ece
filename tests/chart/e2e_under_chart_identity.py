"""Opt-in pytest plugin: run the operator end-to-end tests under the chart's identity.

    python -m pytest -p tests.chart.e2e_under_chart_identity tests/e2e/test_operator_e2e.py

For each namespace the e2e tests start an operator in, the chart is installed into that
namespace with ``watchNamespaces=[it]`` (a Role and RoleBinding there, nothing
cluster-wide), and the operator process authenticates with a TokenRequest token of
the chart's ServiceAccount (``--kubeconfig`` and ``$KUBECONFIG``), never as admin.
The namespace's deletion at the end of each test removes the release with it.
The operator log starts with a line naming the kubeconfig it was given.
"""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
for extra in (REPO / "stack", REPO):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from eos_stack import cluster  # noqa: E402
from eos_stack.common import Stack  # noqa: E402

from .helpers import CHART, Helm, Kubectl, token_kubeconfig  # noqa: E402

RELEASE = "eos"
_kubeconfigs: dict[str, Path] = {}
_original_init = cluster.OperatorProcess.__init__


def chart_identity(namespace: str, workdir: Path) -> Path:
    """Install the chart for ``namespace`` (once) and return its ServiceAccount's kubeconfig."""
    if namespace not in _kubeconfigs:
        env = Stack().read_env()
        helm = Helm(env, workdir / "helm-home")
        # The test runs the operator itself, as its own process: the Deployment's Pods (the stack's
        # controller-manager makes them) must never run beside it. They select a node label no node has, so
        # none is ever scheduled, and the Deployment is scaled to 0, so none stays Pending in the namespace.
        helm.run("install", RELEASE, str(CHART), "-n", namespace, "--set", f"watchNamespaces={{{namespace}}}",
                 "--set", "service.enabled=false", "--set", "nodeSelector.eos-test/no-node=the-test-runs-it")
        Kubectl(env).run("scale", "deployment", f"{RELEASE}-spark-eos-operator", "-n", namespace, "--replicas=0")
        _kubeconfigs[namespace] = token_kubeconfig(Kubectl(env), env["KUBECONFIG"], namespace,
                                                   f"{RELEASE}-spark-eos-operator",
                                                   workdir / "operator-sa.kubeconfig")
    return _kubeconfigs[namespace]


def _init_under_chart_identity(self, kubeconfig: str, namespace: str, log_path: Path, **kwargs) -> None:
    sa_kubeconfig = chart_identity(namespace, Path(log_path).parent)
    _original_init(self, str(sa_kubeconfig), namespace, log_path, **kwargs)
    self.switches = {**self.switches, "KUBECONFIG": str(sa_kubeconfig)}
    with open(log_path, "ab") as log:
        log.write(f"===== the operator runs as the chart's ServiceAccount ({sa_kubeconfig})\n".encode())


def pytest_configure(config) -> None:
    cluster.OperatorProcess.__init__ = _init_under_chart_identity


def pytest_unconfigure(config) -> None:
    cluster.OperatorProcess.__init__ = _original_init
