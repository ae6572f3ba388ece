"""The chart from the stack's OCI registry (issue 31): ``helm package`` of the work tree's chart, ``helm push`` to
``oci://<EOS_REGISTRY>/charts`` over plain HTTP (eos_stack.registry.push_chart), then ``helm show``, ``helm
template`` and ``helm install`` from the OCI reference on the local API server. The pushed version is unique per
run (the registry keeps manifests in memory and is shared by the stack's tests), so what is installed is what this
test pushed; a version never pushed is refused by the registry."""
from __future__ import annotations

import uuid

import yaml

from eos_stack import registry
from eos_stack.common import Stack

from .helpers import CHART, Helm, Kubectl, unique


def test_the_chart_pushed_to_the_local_oci_registry_installs_from_there(helm: Helm, kubectl: Kubectl, namespaces,
                                                                        releases, stack_env, tmp_path):
    version = f"0.0.0-oci.{uuid.uuid4().hex[:8]}"
    packaged = tmp_path / f"spark-eos-operator-{version}.tgz"
    helm.run("package", str(CHART), "--version", version, "--destination", str(tmp_path))
    assert packaged.is_file()

    ref = registry.push_chart(Stack(), helm.bin, packaged, env=helm.env)
    assert ref == f"oci://{stack_env['EOS_REGISTRY']}/charts/spark-eos-operator"
    assert registry.has(Stack(), "charts/spark-eos-operator", version.replace("+", "_")) is not None

    shown = yaml.safe_load(helm.run("show", "chart", ref, "--version", version, "--plain-http").stdout)
    assert shown["name"] == "spark-eos-operator" and shown["version"] == version

    # The same rendering as the chart folder's at that version: the registry served the package pushed.
    from_oci = helm.run("template", "eos", ref, "--version", version, "--plain-http", "-n", "eos-system").stdout
    from_dir = helm.run("template", "eos", str(packaged), "-n", "eos-system").stdout
    assert from_oci == from_dir and "kind: Deployment" in from_oci

    ns = namespaces("chart-oci")
    release = unique("oci")
    helm.run("install", release, ref, "--version", version, "--plain-http", "-n", ns)
    releases(release, ns)
    dep = kubectl.json("get", "deployment", f"{release}-spark-eos-operator", "-n", ns)
    assert dep["metadata"]["labels"]["helm.sh/chart"] == f"spark-eos-operator-{version}"

    missing = helm.run("show", "chart", ref, "--version", "0.0.0-never.pushed", "--plain-http", check=False)
    assert missing.returncode != 0 and "not found" in (missing.stderr + missing.stdout).lower(), missing.stderr
