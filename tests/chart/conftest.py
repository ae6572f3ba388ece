"""Fixtures of the chart tests.

Every test that talks to helm or the API server uses ``stack_env`` (the helm binary and
the kube-apiserver come from the local stack), so it is a stack test and fails, never
skips, when the stack cannot start.
"""
from __future__ import annotations

from typing import Any, Iterator

import pytest

from eos_stack.cluster import RESTRICTED

from .helpers import Helm, Kubectl, unique


@pytest.fixture
def helm(stack_env, tmp_path) -> Helm:
    return Helm(stack_env, tmp_path / "helm-home")


@pytest.fixture
def kubectl(stack_env) -> Kubectl:
    return Kubectl(stack_env)


@pytest.fixture
def namespaces(kubectl) -> Iterator[Any]:
    """``namespaces("prefix")`` creates a fresh namespace; all are deleted after the test."""
    made: list[str] = []

    def make(prefix: str = "chart") -> str:
        name = unique(prefix)
        kubectl.run("create", "namespace", name)
        kubectl.run("label", "namespace", name, *RESTRICTED)
        made.append(name)
        return name

    yield make
    for name in made:
        kubectl.run("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture
def releases(helm: Helm):
    """Uninstalls every release a test installed (cluster-scoped RBAC included)."""
    made: list[tuple[str, str]] = []
    yield lambda release, namespace: made.append((release, namespace))
    for release, namespace in made:
        helm.run("uninstall", release, "-n", namespace, "--wait", "--timeout", "60s", check=False)
