"""The operator as users install it: the chart's Deployment, its Pod on the real nodes.

``helm install`` of ``charts/spark-eos-operator`` into a test's namespace (``watchNamespaces`` = it: Roles
there, nothing cluster-wide), one replica (leader election on, as the chart sets it), the stack's
controller-manager making its ReplicaSet and Pod, and a real node's kubelet running it from the image in the
stack's registry: the image's default command, the chart's arguments, its ServiceAccount's token, its
``securityContext`` (uid 10001, read-only root, no capabilities) under the namespace's ``restricted`` Pod
Security. Placed and wired as ``real_nodes.chart_values_on_nodes`` says (the nodes' scheduler and toleration,
the API server at the services address). Only the reconcile periods are set shorter than the chart's defaults,
through the chart's own values, so a test does not wait for them.
"""
from __future__ import annotations

from pathlib import Path

import yaml

from eos_stack.cluster import Kubectl, wait_until
from eos_stack.common import Stack
from tests.chart.helpers import CHART, Helm
from tests.harness.node_pods import NodePods
from tests.harness.real_nodes import chart_values_on_nodes, root_ca_config_map

RELEASE = "eos"


class ChartOperator:
    """The chart's operator Deployment in ``namespace``; ``tail()`` is its Pod's log (for Diagnostics)."""

    def __init__(self, stack_env: dict[str, str], kubectl: Kubectl, namespace: str, kubelet: NodePods,
                 workdir: Path):
        self.kubectl, self.namespace, self.kubelet = kubectl, namespace, kubelet
        self.helm = Helm(stack_env, workdir / "helm-home")
        self.values = workdir / "chart-values.yaml"
        self.pod: str | None = None

    def start(self) -> "ChartOperator":
        ns = self.namespace
        st = Stack()
        self.kubectl.apply(root_ca_config_map(st), ns)
        values = chart_values_on_nodes(st)
        values["operator"].update(reconcileIntervalSeconds=1, progressIntervalSeconds=2,
                                  replayHorizonIntervalSeconds=2, resolutionTimeoutSeconds=30)
        values.update(watchNamespaces=[ns], replicas=1, service={"enabled": False})
        self.values.write_text(yaml.safe_dump(values))
        self.helm.run("install", RELEASE, str(CHART), "-n", ns, "-f", str(self.values))
        selector = f"app.kubernetes.io/instance={RELEASE}"

        def running() -> str | None:
            pods = self.kubectl.json("get", "pods", "-n", ns, "-l", selector)["items"]
            up = [p for p in pods if p.get("status", {}).get("phase") == "Running"]
            return up[0]["metadata"]["name"] if up else None

        self.pod = wait_until(running, "the chart's operator Pod to run (Deployment -> ReplicaSet -> Pod)", 120,
                              lambda: self.kubectl.run("get", "deploy,rs,pods,events", "-n", ns).stdout, 1)
        return self

    def tail(self, n: int = 60) -> str:
        if not self.pod:
            return "(the operator Pod never ran)"
        path = self.kubelet.log_path(self.namespace, self.pod)
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])

    def stop(self) -> None:
        self.helm.run("uninstall", RELEASE, "-n", self.namespace, "--wait", "--timeout", "60s", check=False)
