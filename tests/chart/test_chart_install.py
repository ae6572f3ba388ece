"""helm install, upgrade and uninstall on the local API server.

There is no kubelet and no Deployment controller in the local stack, so no operator
Pod runs here: "working" means every object is there and the operator's identity
keeps every permission it needs, across upgrades (test_rbac.py runs the operator
itself under that identity).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from .helpers import CHART, chart_version, Helm, Kubectl, can_i, install, one, sa_user, token_kubeconfig, unique, wait_until
from .rbac_model import ALL_CALLS, NAMESPACED_CALLS, SECRET_CALLS

CRD_NAME = "exactlyoncestreams.streaming.eos.dev"
SNAPSHOT_CRD_NAME = "exactlyoncesnapshots.streaming.eos.dev"


def bumped_chart(tmp: Path, version: str) -> Path:
    """A copy of the chart with another chart version, as a release of the next chart would be."""
    copy = tmp / "spark-eos-operator"
    shutil.copytree(CHART, copy)
    meta = copy / "Chart.yaml"
    lines = meta.read_text().splitlines()
    assert sum(line.startswith("version: ") for line in lines) == 1
    meta.write_text("\n".join(f"version: {version}" if line.startswith("version: ") else line
                              for line in lines) + "\n")
    return copy


def release_status(helm: Helm, release: str, namespace: str) -> dict:
    return yaml.safe_load(helm.run("status", release, "-n", namespace, "-o", "yaml").stdout)


def test_install_upgrade_uninstall(helm: Helm, kubectl: Kubectl, namespaces, releases, stack_env, tmp_path):
    ns = namespaces("chart-inst")
    release = unique("inst")
    manifest = install(helm, release, ns)
    releases(release, ns)
    status = release_status(helm, release, ns)
    assert status["info"]["status"] == "deployed" and status["version"] == 1
    assert "kubectl apply" in status["info"]["notes"]

    name = f"{release}-spark-eos-operator"
    cluster_name = f"{ns}-{name}"
    dep = kubectl.json("get", "deployment", name, "-n", ns)
    assert dep["spec"]["replicas"] == 2 and dep["spec"]["strategy"]["type"] == "RollingUpdate"
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == name
    assert dep["metadata"]["labels"]["helm.sh/chart"] == f"spark-eos-operator-{chart_version()}"
    sa = kubectl.json("get", "serviceaccount", name, "-n", ns)
    assert kubectl.exists("service", name, "-n", ns)
    role = kubectl.json("get", "clusterrole", cluster_name)
    binding = kubectl.json("get", "clusterrolebinding", cluster_name)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": ns}]
    assert role["rules"] == one(manifest, "ClusterRole")["rules"]
    assert kubectl.exists("crd", CRD_NAME), "the chart's crds/ installs the CRD (or finds it installed)"
    assert kubectl.exists("crd", SNAPSHOT_CRD_NAME), "the chart's crds/ installs the snapshot CRD too"

    user = sa_user(ns, name)
    wait_until(lambda: can_i(kubectl, user, NAMESPACED_CALLS[0], ns), "the binding to take effect", 30)
    # A token minted before the upgrade must still work after it: the ServiceAccount is
    # patched in place, never recreated (a new uid would invalidate the running Pod's token).
    kubeconfig = token_kubeconfig(kubectl, stack_env["KUBECONFIG"], ns, name, tmp_path / "sa.kubeconfig")

    # -- upgrade to the next chart version -------------------------------------------
    helm.run("upgrade", release, str(bumped_chart(tmp_path / "next", "0.1.1")), "-n", ns)
    status = release_status(helm, release, ns)
    assert status["info"]["status"] == "deployed" and status["version"] == 2
    after = kubectl.json("get", "deployment", name, "-n", ns)
    assert after["metadata"]["labels"]["helm.sh/chart"] == "spark-eos-operator-0.1.1"
    assert after["spec"]["template"] == dep["spec"]["template"], (
        "a chart-only upgrade must not change the Pod template (it would restart the operator)")
    assert kubectl.json("get", "serviceaccount", name, "-n", ns)["metadata"]["uid"] == sa["metadata"]["uid"]
    assert kubectl.json("get", "clusterrole", cluster_name)["metadata"]["uid"] == role["metadata"]["uid"]
    as_operator = Kubectl(stack_env, str(kubeconfig))
    assert as_operator.run("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}").stdout == user
    denied = [str(c) for c in ALL_CALLS if c not in SECRET_CALLS and not can_i(kubectl, user, c, ns)]
    assert not denied, f"after the upgrade {user} may not: {denied}"
    assert not can_i(kubectl, user, SECRET_CALLS[0], ns), "cluster-wide, Secrets only in rbac.secretNamespaces"

    # -- upgrade to namespaced mode: the cluster-wide grant goes, Roles come -----------
    watched = namespaces("chart-inst-w")
    helm.run("upgrade", release, str(CHART), "-n", ns, "--set", f"watchNamespaces={{{watched}}}")
    assert not kubectl.exists("clusterrole", cluster_name)
    assert not kubectl.exists("clusterrolebinding", cluster_name)
    assert kubectl.exists("role", name, "-n", watched) and kubectl.exists("rolebinding", name, "-n", watched)
    args = kubectl.json("get", "deployment", name, "-n", ns)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--namespace={watched}" in args and "--all-namespaces" not in args
    wait_until(lambda: not can_i(kubectl, user, NAMESPACED_CALLS[0], ns), "the cluster-wide grant to go", 30)
    wait_until(lambda: all(can_i(kubectl, user, c, watched) for c in NAMESPACED_CALLS),
               "the namespaced grant to take effect", 30)

    # -- rollback to revision 2 restores the cluster-wide mode --------------------------
    helm.run("rollback", release, "2", "-n", ns)
    assert kubectl.exists("clusterrole", cluster_name) and not kubectl.exists("role", name, "-n", watched)

    # -- uninstall: everything of the release goes, the CRD (and so every stream) stays --
    helm.run("uninstall", release, "-n", ns, "--wait", "--timeout", "60s")
    for kind in ("deployment", "serviceaccount", "service"):
        assert not kubectl.exists(kind, name, "-n", ns), kind
    assert not kubectl.exists("clusterrole", cluster_name)
    assert not kubectl.exists("clusterrolebinding", cluster_name)
    assert kubectl.exists("crd", CRD_NAME) and kubectl.exists("crd", SNAPSHOT_CRD_NAME)
