"""The node part's images (:mod:`eos_stack.node`): the pause image, built here from a static C program
(``gcc -static``, node_config.PAUSE_C) as an OCI archive, and the project's image (``make image``) saved by
``podman save --format docker-archive`` (its layers uncompressed: saving and importing skip gzip, about
half the time of an OCI archive's, 25 s against 44 s to save 2.3 GB here); both imported into each node's containerd (``ctr images import``, the
``k8s.io`` namespace the CRI reads) for Pods with ``imagePullPolicy: Never``/``IfNotPresent``. The project's
image is imported again only when ``make image`` built a new one (its id is kept beside the node).
"""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

from .common import Stack, StackError, log, run
from .image_common import ensure_tools, image_name, podman
from .node_config import PAUSE_C, PAUSE_IMAGE, NodeLayout, pause_oci_archive


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


def import_images(st: Stack, n: NodeLayout, pause: Path, project: tuple[str, Path] | None) -> None:
    have = set(ctr(n, "images", "ls", "-q").split())
    if PAUSE_IMAGE not in have:
        ctr(n, "images", "import", str(pause))
    if project:
        ident, archive = project
        mark = n.home / "project-image.id"
        if image_name() not in have or not mark.exists() or mark.read_text() != ident:
            t0 = time.monotonic()
            ctr(n, "images", "import", str(archive))
            mark.write_text(ident)
            log(f"node: imported {image_name()} into {n.name} in {time.monotonic() - t0:.0f}s")


def project_archive(st: Stack) -> tuple[str, Path] | None:
    """``podman save`` of the image ``make image`` built (the id and the archive), or None without one."""
    proc = podman(st, "image", "inspect", "--format", "{{.Id}}", image_name(), check=False)
    if proc.returncode != 0:
        log(f"node: {image_name()} is not built (`make image`): the nodes get the pause image only")
        return None
    ident = proc.stdout.strip()
    archive = st.cache_dir("node") / "project-image.docker.tar"
    for old in ("project-image.oci.tar", "project-image.oci.id"):           # the earlier, gzip format
        st.cache_dir("node").joinpath(old).unlink(missing_ok=True)
    stamp = archive.with_suffix(".id")
    if not (archive.exists() and stamp.exists() and stamp.read_text() == ident):
        archive.unlink(missing_ok=True)
        t0 = time.monotonic()
        podman(st, "save", "--format", "docker-archive", "-o", str(archive), image_name(), timeout=1200)
        stamp.write_text(ident)
        log(f"node: saved {image_name()} as an archive in {time.monotonic() - t0:.0f}s")
    return ident, archive
