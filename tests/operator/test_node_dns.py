"""The real nodes' cluster DNS (stack/eos_stack/node_dns.py): its Corefile, its RBAC and the wrapper module's
plugin list, pure; CoreDNS itself answering Pods is tests/stack/test_node_dns.py."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from eos_stack import node_dns

pytestmark = pytest.mark.unit

COREFILE = node_dns.corefile("10.243.7.1", Path("/state/node/dns/coredns.kubeconfig"), 1001, 1002)


def blocks(corefile: str) -> dict[str, str]:
    """Server block keys -> body (top-level blocks only)."""
    out, depth, key, body = {}, 0, None, []
    for line in corefile.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        if depth == 0:
            key = line.rstrip("{ ").strip()
            depth, body = 1, []
            continue
        depth += line.count("{") - line.count("}")
        if depth == 0:
            out[key] = "\n".join(body)
        else:
            body.append(line.strip())
    return out


def directives(body: str) -> list[str]:
    return [line.split()[0] for line in body.splitlines() if line and line[0].isalpha() and not line.startswith(
        ("kubeconfig", "pods", "ttl", "class", "rcode"))]


def test_cluster_zone_from_the_api_server_everything_else_nxdomain_nothing_forwarded():
    b = blocks(COREFILE)
    assert set(b) == {"cluster.local:53 in-addr.arpa:53 ip6.arpa:53", ".:53"}
    cluster, rest = b["cluster.local:53 in-addr.arpa:53 ip6.arpa:53"], b[".:53"]
    assert "kubernetes cluster.local in-addr.arpa ip6.arpa {" in cluster
    assert "kubeconfig /state/node/dns/coredns.kubeconfig" in cluster and "pods disabled" in cluster
    assert "template ANY ANY {" in rest and "rcode NXDOMAIN" in rest
    # No upstream: a name outside the cluster never leaves the machine.
    assert not re.search(r"^\s*(forward|proxy|grpc)\b", COREFILE, re.M)
    # Only the services address, never every interface; health and readiness on loopback.
    assert [line.split()[1:] for line in COREFILE.splitlines() if line.strip().startswith("bind")] == \
        [["10.243.7.1"], ["10.243.7.1"]]
    assert "health 127.0.0.1:1001" in cluster and "ready 127.0.0.1:1002" in cluster


def test_every_directive_of_the_corefile_is_linked_and_ordered_by_the_wrapper():
    """A Corefile directive whose plugin main.go does not import, or that its Directives list leaves out, makes
    CoreDNS refuse to start: the Corefile and the wrapper module must agree."""
    main_go = (node_dns.BUILD_DIR / "main.go").read_text()
    imported = set(re.findall(r'_ "github.com/coredns/coredns/plugin/(\w+)"', main_go))
    ordered = re.findall(r'"(\w+)"', re.search(r"var Directives = \[\]string\{([^}]*)\}", main_go).group(1))
    used = {d for body in blocks(COREFILE).values() for d in directives(body)}
    assert used == {"bind", "errors", "log", "health", "ready", "kubernetes", "cache", "template"}
    assert used <= imported and used <= set(ordered)
    assert set(ordered) == imported          # nothing linked that is never used, nothing ordered unlinked
    # The cache answers before the plugins it caches; errors and log see every answer.
    assert ordered.index("cache") < ordered.index("kubernetes") and ordered.index("log") < ordered.index("cache")


def test_the_wrapper_pins_the_version_the_stack_names():
    go_mod = (node_dns.BUILD_DIR / "go.mod").read_text()
    assert f"github.com/coredns/coredns {node_dns.COREDNS_VERSION}" in go_mod
    assert "azure" not in go_mod.lower() and "aws-sdk" not in go_mod    # the cloud plugins are not linked


def test_rbac_only_lists_and_watches_what_the_kubernetes_plugin_reads():
    role, binding = node_dns.rbac()
    assert role["kind"] == "ClusterRole" and binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": node_dns.USER}]
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}
    assert granted == {(g, r, v) for g, r in (("", "services"), ("", "namespaces"),
                                               ("discovery.k8s.io", "endpointslices")) for v in ("list", "watch")}
