"""The node part's images (:mod:`eos_stack.node`): the pause image, built here from a static C program
(``gcc -static``, node_config.PAUSE_C) as an OCI archive imported into each node's containerd (``ctr images
import``, the ``k8s.io`` namespace the CRI reads); the project's image (``make image``) pushed to the stack's
registry (:mod:`eos_stack.registry`) and pulled by each node's containerd from there, as a real cluster's nodes
get theirs (a ``hosts.toml`` per node, plain HTTP on loopback). Pods name it by its registry reference
(``eos_stack.registry.image_ref``); a tag the registry lacks is ``ErrImagePull`` from the real kubelet.
Until 2026-11-28 the image was saved as a docker-archive and imported into each node (about 52 s per node
for each new build); pulls measured against that in docs/measurements.md.
"""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

from .common import Stack, StackError, log, run
from .image_common import ensure_tools
from .node_config import PAUSE_C, PAUSE_IMAGE, NodeLayout, pause_oci_archive, registry_hosts_toml


def ensure_pause(st: Stack) -> Path:
    """The pause image's OCI archive, built once into the cache (``gcc -static``)."""
    d = st.cache_dir("node")
    archive = d / "pause-oci.tar"
    src = d / "pause.c"
    if archive.exists() and src.exists() and src.read_text() == PAUSE_C:
        return archive
    ensure_tools(("gcc",), needed_by="the node part's pause image")
    src.write_text(PAUSE_C)
    run(["gcc", "-static", "-Os", "-s", "-o", str(d / "pause"), str(src)], what="gcc -static pause.c")
    tmp = archive.with_suffix(".tmp")
    tmp.write_bytes(pause_oci_archive((d / "pause").read_bytes()))
    tmp.replace(archive)
    return archive


def ctr(n: NodeLayout, *args: str, timeout: float = 900, check: bool = True) -> str:
    proc = subprocess.run(["ctr", f"--address={n.socket}", "--namespace=k8s.io", *args], capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise StackError(f"ctr {' '.join(args)} failed: {proc.stderr.strip()[-1500:]}")
    return proc.stdout


def write_registry_hosts(n: NodeLayout, address: str) -> Path:
    """The node's containerd ``hosts.toml`` for the stack's registry (read at each pull: no restart needed)."""
    d = n.registry_hosts_dir / address
    d.mkdir(parents=True, exist_ok=True)
    (d / "hosts.toml").write_text(registry_hosts_toml(address))
    return d / "hosts.toml"


def load_images(st: Stack, n: NodeLayout, pause: Path, project: str | None) -> None:
    """The pause image imported (it is never pulled: the sandbox image), the project's image ``project`` (a
    registry reference, :func:`eos_stack.registry.ensure_image`) pulled from the stack's registry through the
    node's ``hosts.toml``: the content containerd holds already is neither fetched nor unpacked again."""
    have = set(ctr(n, "images", "ls", "-q").split())
    if PAUSE_IMAGE not in have:
        ctr(n, "images", "import", str(pause))
    if project:
        t0 = time.monotonic()
        ctr(n, "images", "pull", f"--hosts-dir={n.registry_hosts_dir}", project)
        log(f"node: pulled {project} into {n.name} in {time.monotonic() - t0:.1f}s")
