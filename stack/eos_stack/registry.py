"""The registry part: a local OCI registry on loopback, plain HTTP (``python -m eos_stack up registry``).

- **Binary.** go-containerregistry's ``crane`` (``crane registry serve``), built with ``go install`` into
  ``<cache>/bin/crane-<ver>/`` like helm. Chosen over ``distribution/v3``'s ``cmd/registry`` for its build:
  37 requirements in its ``go.mod`` against 110 (the storage drivers for Azure, GCS and S3 come with
  distribution's), one 17 MB binary, a cold build of 63 s on 2 busy cores (measured, an empty GOCACHE;
  docs/local-stack.md). Its costs: manifests and tags live in the process's memory (lost when it stops: every
  user pushes what it needs when it starts, :func:`has`) and a streamed upload is buffered in memory until
  it ends (a layer of the project's image, transiently).
- **Storage.** Blobs on disk under the cache, ``<cache>/registry/blobs`` (``--disk``): content-addressed,
  written to a temporary file then renamed, checked against their digest when asked for, so every stack on
  the machine shares them and they outlive clean clones: a warm push sends manifests only. Manifests are in
  memory (above), so nothing of one stack's tags leaks into another's.
- **Address.** ``127.0.0.1:<port>``, the port chosen once per stack (``<state>/registry/port``). The real
  nodes' containerd runs on this machine's network, not in a Pod's: it pulls from loopback directly
  (``node_config.registry_hosts_toml``), no services-address forwarder needed.

``.stack/env`` gets ``EOS_REGISTRY`` (``127.0.0.1:<port>``).
"""
from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from .common import Stack, StackError, free_port, log, port_open, wait_for
from .go_build import go_install

CRANE_VERSION = "v0.22.1"
MODULE = "github.com/google/go-containerregistry"
DAEMON = "registry"
ENV_KEYS = ["EOS_REGISTRY"]
# The Go runtime's soft memory limit for the registry: it buffers a streamed upload in memory (a cold push of the
# project's image peaked at 4.1 GB RSS) and without a limit kept that memory after the push (4.2 GB, 12 minutes
# later); with it the collector returns what the finished upload held.
MEMORY_LIMIT = "256MiB"


def crane_bin(st: Stack) -> Path:
    return st.cache / "bin" / f"crane-{CRANE_VERSION}" / "crane"


def blobs_dir(st: Stack) -> Path:
    return st.cache_dir("registry", "blobs")


def ensure_binary(st: Stack) -> Path:
    return go_install(st, crane_bin(st), f"{MODULE}/cmd/crane@{CRANE_VERSION}", what="registry",
                      estimate="about a minute cold", flags=("-trimpath",))


def port(st: Stack) -> int:
    """The registry's port, chosen once for this stack and kept."""
    pf = st.dir("registry") / "port"
    if pf.exists():
        return int(pf.read_text())
    p = free_port()
    pf.write_text(f"{p}\n")
    return p


def address(st: Stack) -> str:
    return f"127.0.0.1:{port(st)}"


def ready(st: Stack) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address(st)}/v2/", timeout=3) as r:
            return r.status == 200
    except (OSError, urllib.error.URLError):
        return False


def has(st: Stack, repository: str, tag: str) -> str | None:
    """The digest of ``repository:tag`` in the registry, or None when it holds no such tag."""
    req = urllib.request.Request(f"http://{address(st)}/v2/{repository}/manifests/{tag}", method="HEAD", headers={
        "Accept": "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json,"
                  " application/vnd.oci.image.index.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.headers.get("Docker-Content-Digest") or ""
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise StackError(f"registry at {address(st)}: HEAD {repository}:{tag} answered {exc.code}") from exc


def tags(st: Stack, repository: str) -> list[str]:
    try:
        with urllib.request.urlopen(f"http://{address(st)}/v2/{repository}/tags/list", timeout=10) as r:
            return list(json.load(r).get("tags") or [])
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return []
        raise


def up(st: Stack) -> dict[str, str]:
    exe = ensure_binary(st)
    p = port(st)
    argv = [str(exe), "registry", "serve", f"--address=127.0.0.1:{p}", f"--disk={blobs_dir(st)}"]
    if st.running_pid(DAEMON) is None:
        if port_open(p):
            raise StackError(f"registry: port {p} (kept in {st.dir('registry') / 'port'}) is taken by another "
                             "process; stop it, or delete that file so `up registry` picks a free port")
        st.start_daemon(DAEMON, argv, marker=str(exe), env={"GOMEMLIMIT": MEMORY_LIMIT})
    wait_for(lambda: st.running_pid(DAEMON) and ready(st), f"the registry on {address(st)}", 30,
             on_fail=lambda: st.log_tail(DAEMON))
    return {"EOS_REGISTRY": address(st)}


def down(st: Stack, purge: bool = False) -> None:
    st.stop_daemon(DAEMON, grace=5.0)
    if purge:
        st.drop_env(ENV_KEYS)


def status(st: Stack) -> tuple[str, str]:
    if not os.access(crane_bin(st), os.X_OK):
        return "missing", f"{crane_bin(st)} not built yet (`up registry` builds it)"
    if st.running_pid(DAEMON) is None or not ready(st):
        return "stopped", f"not answering on http://{address(st)}/v2/"
    return "running", f"http://{address(st)} (blobs in {blobs_dir(st)}, manifests in memory)"


def image_ref(st: Stack, local: str) -> str:
    """Where the registry holds the local image ``local``: ``<registry>/<last path part>:<tag>``
    (``ghcr.io/spark-eos/spark-eos-operator:0.1.0`` -> ``127.0.0.1:<port>/spark-eos-operator:0.1.0``)."""
    return f"{address(st)}/{local.rsplit('/', 1)[-1]}"


def push_image(st: Stack, local: str) -> str:
    """Push the local image ``local`` (podman's store) to the registry (:func:`image_ref`) and return the
    reference. zstd layers: compressed about as small as gzip, much faster both ways. Layers whose blobs the
    registry holds already are not sent again."""
    from .image_common import podman
    ref = image_ref(st, local)
    podman(st, "push", "--tls-verify=false", "--compression-format=zstd", local, f"docker://{ref}", timeout=1800)
    return ref


def ensure_image(st: Stack, local: str) -> str | None:
    """``local`` in the registry as it is in podman's store now, pushed when the registry lacks its tag (it
    keeps manifests in memory) or holds an older build (the image id pushed last is kept beside the port);
    the reference, or None when ``local`` is not built."""
    from .image_common import podman
    proc = podman(st, "image", "inspect", "--format", "{{.Id}}", local, check=False)
    if proc.returncode != 0:
        return None
    ident, ref = proc.stdout.strip(), image_ref(st, local)
    mark = st.dir("registry") / ("pushed-" + ref.split("/", 1)[1].replace("/", "_").replace(":", "@") + ".id")
    repo, _, tag = ref.split("/", 1)[1].rpartition(":")
    if has(st, repo, tag) is not None and mark.exists() and mark.read_text() == ident:
        return ref
    t0 = time.monotonic()
    push_image(st, local)
    mark.write_text(ident)
    log(f"registry: pushed {local} as {ref} in {time.monotonic() - t0:.0f}s")
    return ref


def push_chart(st: Stack, helm: str, packaged: Path, *, env: dict[str, str] | None = None) -> str:
    """``helm push`` a packaged chart (``helm package``, ``make release``) to ``oci://<registry>/charts`` over
    plain HTTP; returns the chart's OCI reference without its version (``helm install <ref> --version X``)."""
    base = f"oci://{address(st)}/charts"
    proc = subprocess.run([helm, "push", str(packaged), base, "--plain-http"], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)
    if proc.returncode != 0:
        raise StackError(f"helm push {packaged.name} to {base} failed: {(proc.stderr or proc.stdout).strip()}")
    pushed = [line.split(":", 1)[1].strip() for line in (proc.stdout + proc.stderr).splitlines()
              if line.startswith("Pushed:")]
    if not pushed:
        raise StackError(f"helm push {packaged.name} said nothing about what it pushed: {proc.stdout}{proc.stderr}")
    return "oci://" + pushed[0].rpartition(":")[0]
