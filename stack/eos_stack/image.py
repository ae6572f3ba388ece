"""``python -m eos_stack.image build|status|run|podman|env`` (PYTHONPATH=stack): the project's ``Dockerfile``
built for real with Debian's ``buildah`` and run with ``podman``, on a machine with no Docker engine and no
registry but the package registries (``make image``). Test and demo tooling only.

What ``build`` does, in order:

1. **Tools.** ``buildah``, ``podman``, ``runc`` and ``mmdebstrap`` from Debian (``apt-get install``, said so,
   when one is missing; this needs root, as rootful buildah does).
2. **Configuration**, all under ``<cache>/image`` (``EOS_CACHE``, default ``~/.cache/eos``): a
   ``storage.conf`` (the ``overlay`` driver, ``vfs`` if overlay does not work here; graphroot
   ``storage/``, runroot ``run/``), a ``containers.conf`` (runtime ``runc``: ``crun`` fails on hybrid
   cgroups; ``nofile``/``nproc`` limits no higher than this process's hard limits, since raising them
   needs CAP_SYS_RESOURCE) and a ``registries.conf``. Every buildah/podman call gets them through
   ``CONTAINERS_STORAGE_CONF`` / ``CONTAINERS_CONF`` / ``CONTAINERS_REGISTRIES_CONF``, so the system's
   container storage is never touched and a second build reuses every cached layer.
3. **Base images.** Each ``FROM`` image that is not in that storage yet is pulled; when it cannot be
   (Docker Hub is not reachable from this machine kind), a **local stand-in** is made from Debian
   packages with ``mmdebstrap --variant=minbase`` (Debian's own ``python3`` for ``python:3.X-*``, checked
   to be 3.X; ``openjdk-N-jdk-headless`` and ``maven`` for ``maven:*-eclipse-temurin-N``), imported with
   ``podman import`` under the ``FROM`` line's name and labelled ``eos.stand-in``. The output says so.
4. **Offline inputs** for ``--build-arg OFFLINE=...`` (see the Dockerfile): the Python wheels of
   ``pyproject.toml``'s dependencies and build requirements (``pip wheel``, with the project's pip cache),
   the Spark Kafka connector and S3A jars of the stack's cache (:mod:`eos_stack.spark`,
   :mod:`eos_stack.spark_s3`; the same versions the Dockerfile resolves, checked), the JVM slot writer's jar
   the stack built (:mod:`eos_stack.slot_writer`; build argument ``SLOT_WRITER``), and the Debian packages
   of the final stage's ``apt-get install`` with their dependencies, worked out against the final base
   image's own package list by the host's apt. They go into the build context's ``docker/offline/``,
   hard-linked from the caches.
5. **The build**: ``buildah bud --isolation oci --pull=never --network none --layers`` of a context folder
   holding exactly what the Dockerfile copies, tagged as the chart's default image
   (``<image.repository>:<version>``). ``--network none`` proves no ``RUN`` step needs the network. Image
   layers of earlier builds that this one no longer uses are removed afterwards (the disk is small).
   The Dockerfile's layers go from the slowest to change to the fastest: the dependencies' environment
   (keyed by ``pyproject.toml``), the jars, the class-data archive (keyed by ``eos_job/session.py`` and
   ``cds.py``), then the project's own wheel, so a code change rebuilds in about 30 s, not 2.5 min (measured
   on this machine kind, 2026-11-28: 27 s against 152 s).

``run CMD...`` runs the image (``podman run --rm --runtime runc --network host``), ``podman ARGS...`` runs
podman on this storage, ``env`` prints the variables for a shell (``eval "$(... env)"``).

Disk (measured): the image is 1.63 GB (2.3 GB with the AWS SDK bundle, before issue 31); the storage keeps about 4.4 GB (the bases, each stage's layers). A build
with nothing cached peaks near 8 GB, because buildah 1.28 keeps every step's working container, a second copy
of the data of the layer committed from it, until the build ends. The build stops (and says so) when less than
``EOS_IMAGE_MIN_FREE_GB`` (1) is left for the storage: the disk is shared with everything else on the machine.

Where it lives: this module holds the command line, the build itself and ``status``;
:mod:`eos_stack.image_common` the paths, the storage's configuration, ``podman`` and reading the Dockerfile;
:mod:`eos_stack.image_bases` the base images and their stand-ins; :mod:`eos_stack.image_inputs` the offline
inputs and the build context. The names other code uses (``image_name``, ``home``, ``podman``, ``engine_env``,
``run_argv``, ...) are importable from here.
"""
from __future__ import annotations

import argparse
import fcntl
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from .common import Stack, StackError, log
from .image_bases import STAND_IN_LABEL, ensure_bases, image_labels, suite_of
from .image_common import (TOOLS, engine_env, ensure_storage, ensure_tools, external_bases, final_apt_packages,
                           home, image_name, image_under_test, podman, qualified, run_argv, stages, storage_driver,
                           write_config)
from .image_inputs import (add_slot_writer, assemble_context, ensure_debs, ensure_jars, ensure_slot_writer,
                           ensure_wheels)

# The names other code takes from here (tests/stack/test_image.py: image.podman, image.run_argv, ...).
__all__ = ["build", "engine_env", "home", "image_name", "image_under_test", "main", "podman", "run_argv", "status",
           "write_config"]

GB = 1 << 30
# What a build with nothing cached needs at its peak (measured: the bases, each stage's layers, and the second
# copy buildah 1.28 keeps of each step's data in its working container until the build ends).
COLD_PEAK_GB = 9


# -- the build -----------------------------------------------------------------------
def image_id(st: Stack, ref: str) -> str | None:
    proc = podman(st, "image", "inspect", "--format", "{{.Id}}", ref, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None


def prune(st: Stack, used: set[str], keep: set[str]) -> int:
    """Remove the untagged images this build did not use (earlier builds' layers and stages), leaves first,
    round after round (a removed leaf makes its parent one); returns how many went."""
    removed = 0
    for _ in range(100):
        proc = podman(st, "images", "--all", "--noheading", "--no-trunc", "--format", "{{.ID}} {{.Dangling}}")
        stale = []
        for line in proc.stdout.splitlines():
            iid, dangling = line.split()[0].removeprefix("sha256:"), line.split()[-1]
            if dangling == "true" and iid not in keep and not any(iid.startswith(u) for u in used):
                stale.append(iid)
        gone = [i for i in stale if podman(st, "rmi", i, check=False).returncode == 0]
        removed += len(gone)
        if not gone:
            break
    return removed


def min_free() -> int:
    return int(float(os.environ.get("EOS_IMAGE_MIN_FREE_GB", "1")) * GB)


def check_disk(st: Stack, *, cold: bool) -> Path:
    """The container storage's folder; fails when its file system is already under the floor, warns when a build
    with nothing cached may not fit (buildah keeps each step's container, its data a second copy of the layer
    committed from it, until the build ends)."""
    storage = home(st) / "storage"
    storage.mkdir(exist_ok=True)
    free = shutil.disk_usage(storage).free
    if free < min_free() + GB:
        raise StackError(f"only {free / GB:.1f} GB free for the container storage ({storage}): free some space "
                         f"(a build with nothing cached peaks at about {COLD_PEAK_GB} GB)")
    if cold and free < COLD_PEAK_GB * GB:
        log(f"WARNING: {free / GB:.1f} GB free for the container storage ({storage}); a build with nothing cached "
            f"peaks at about {COLD_PEAK_GB} GB. The build stops if less than {min_free() / GB:.1f} GB is left "
            "(EOS_IMAGE_MIN_FREE_GB)")
    return storage


class DiskWatch(threading.Thread):
    """Stops ``proc`` when the file system of ``path`` gets under the floor: the disk is shared with everything
    else on the machine, and a full one breaks all of it."""

    def __init__(self, proc: subprocess.Popen, path: Path):
        super().__init__(daemon=True)
        self.proc, self.path, self.tripped, self.low = proc, path, False, None
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(2) and self.proc.poll() is None:
            free = shutil.disk_usage(self.path).free
            self.low = free if self.low is None else min(self.low, free)
            if free < min_free():
                self.tripped = True
                self.proc.terminate()
                return


def build(st: Stack, *, tag: str, bases_mode: str) -> dict[str, str]:
    t0 = time.monotonic()
    ensure_tools()
    ensure_storage(st)
    lock = open(home(st) / ".lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    # Working containers an interrupted build left (they pin their layers); none is in use under the lock.
    subprocess.run(["buildah", "rm", "--all"], env=engine_env(st), capture_output=True, timeout=300)
    storage = check_disk(st, cold=image_id(st, tag) is None)
    kinds = ensure_bases(st, mode=bases_mode)
    bases = external_bases()
    python_base = next((b for b in bases if b.rsplit("/", 1)[-1].startswith("python:")), None)
    if python_base is None:
        raise StackError("the Dockerfile has no python:3.X base: cannot tell which Python the wheels are for")
    base_python = ".".join(re.match(r"(\d+)\.(\d+)", python_base.rpartition(":")[2]).groups())
    kafka, s3 = ensure_jars(st)
    offline = {"wheels": ensure_wheels(st, base_python), "jars": kafka, "s3jars": s3,
               "debs": ensure_debs(st, stages()[-1].base, final_apt_packages())}
    ctx, digest = assemble_context(st, offline)
    writer = add_slot_writer(ctx, ensure_slot_writer(st, kafka))
    stand_ins = [b for b, k in kinds.items() if k.startswith("stand-in")]
    if stand_ins:
        log(f"NOTE: building on LOCAL STAND-INS for {', '.join(stand_ins)} (Debian {suite_of(bases)} packages, "
            "not the Docker Hub images)")
    logf = st.dir("logs") / "image-build.log"
    argv = ["buildah", "bud", "--isolation", "oci", "--runtime", shutil.which("runc") or "runc", "--pull=never",
            "--network", "none", "--layers", "--force-rm", "--format", "docker", "--build-arg", f"OFFLINE={digest}",
            "--build-arg", f"SLOT_WRITER={writer}",
            "--label", f"eos.bases={'stand-in: ' + ', '.join(stand_ins) if stand_ins else 'as pulled'}",
            "-f", str(ctx / "Dockerfile"), "-t", tag, str(ctx)]
    before = image_id(st, tag)
    log(f"buildah bud (offline inputs {digest}; log {logf})")
    b0 = time.monotonic()
    used: set[str] = set()
    with open(logf, "w") as out:
        out.write(f"{shlex.join(argv)}\n")
        proc = subprocess.Popen(argv, env=engine_env(st), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, cwd=str(ctx))
        watch = DiskWatch(proc, storage)
        watch.start()
        for line in proc.stdout:
            out.write(line)
            out.flush()
            if m := re.match(r"--> (?:Using cache )?([0-9a-f]{11,64})\b", line.strip()):
                used.add(m[1])
            if re.match(r"(\[\d+/\d+\] )?(STEP |COMMIT)|--> Using cache", line):
                print(f"  {line.rstrip()[:150]}", file=sys.stderr, flush=True)
        rc = proc.wait()
        watch.done.set()
    if watch.tripped:
        subprocess.run(["buildah", "rm", "--all"], env=engine_env(st), capture_output=True, timeout=300)
        raise StackError(f"stopped the build: less than {min_free() / GB:.1f} GB was left free for the container "
                         f"storage ({storage}); a build with nothing cached peaks at about {COLD_PEAK_GB} GB. The "
                         "layers built so far are kept: free some space and run it again")
    if rc != 0:
        tail = "\n".join(logf.read_text(errors="replace").splitlines()[-40:])
        raise StackError(f"buildah bud failed (exit {rc}); full log: {logf}\n{tail}")
    after = image_id(st, tag)
    if before and before != after:
        podman(st, "rmi", before, check=False)
    pruned = prune(st, used, {after or ""})
    size = int(podman(st, "image", "inspect", "--format", "{{.Size}}", tag).stdout.strip())
    low = f"; lowest free space for the storage {watch.low / GB:.1f} GB" if watch.low is not None else ""
    log(f"image {tag} built in {time.monotonic() - b0:.0f}s (all steps {time.monotonic() - t0:.0f}s): "
        f"{size / 1e9:.2f} GB{f'; removed {pruned} stale cache images' if pruned else ''}{low}")
    return {"EOS_IMAGE": tag, "EOS_IMAGE_SIZE": str(size)}


def build_on_project_image(st: Stack, context: Path, *, tag: str) -> str:
    """A Dockerfile ``FROM`` the project's image (``ARG EOS_IMAGE``: a user's job image, examples/job-image)
    built on this storage, offline; the project's image must be built. Returns the image id."""
    ensure_tools()
    base = image_name()
    if image_id(st, base) is None:
        raise StackError(f"{base} is not built: run `make image` first")
    with open(home(st) / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        argv = ["buildah", "bud", "--isolation", "oci", "--runtime", shutil.which("runc") or "runc",
                "--pull=never", "--network", "none", "--layers", "--format", "docker",
                "--build-arg", f"EOS_IMAGE={base}", "-t", tag, str(context)]
        proc = subprocess.run(argv, env=engine_env(st), capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise StackError(f"buildah bud of {context} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}"
                         f"{proc.stderr[-2000:]}")
    log(f"image {tag} built on {base} from {context}")
    return image_id(st, tag) or ""


# -- status --------------------------------------------------------------------------
def status(st: Stack, tag: str) -> tuple[str, str]:
    missing = [t for t in TOOLS if not shutil.which(t)]
    if missing:
        return "missing", f"tools not installed: {', '.join(missing)} (make image installs them)"
    lines = []
    for base in external_bases():
        labels = image_labels(st, qualified(base))
        lines.append(f"  base {base}: " + ("absent" if labels is None else
                                            f"LOCAL STAND-IN ({labels[STAND_IN_LABEL]})" if STAND_IN_LABEL in labels
                                            else "pulled"))
    proc = podman(st, "image", "inspect", "--format", "{{.Id}} {{.Size}} {{.Created}}", tag, check=False)
    storage = home(st) / "storage"
    du = subprocess.run(["du", "-xsh", str(storage)], capture_output=True, text=True).stdout.split("\t")[0]
    lines.append(f"  storage: {storage_driver(st)} in {storage} ({du or '?'}; "
                 f"{shutil.disk_usage(storage if storage.is_dir() else home(st)).free / GB:.1f} GB free there)")
    if proc.returncode != 0:
        return "missing", f"no image {tag} (run `make image`)\n" + "\n".join(lines)
    iid, size, created = proc.stdout.split(" ", 2)
    return "ready", f"{tag} {iid[:12]} {int(size) / 1e9:.2f} GB, built {created.strip()[:19]}\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eos_stack.image", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tag", default=None, help="the image's name (default: the chart's default image)")
    sub = ap.add_subparsers(dest="action", required=True)
    b = sub.add_parser("build", help="build the Dockerfile (make image)")
    b.add_argument("--bases", choices=["auto", "pull", "stand-in"], default=os.environ.get("EOS_IMAGE_BASES", "auto"),
                   help="base images: pull, else make local stand-ins (auto); pull only; stand-ins without trying")
    sub.add_parser("status", help="the image, its bases and the storage")
    sub.add_parser("push", help="push the image to the stack's registry (started if it is not), for the real nodes")
    r = sub.add_parser("run", help="podman run --rm --runtime runc --network host IMAGE [CMD...]")
    r.add_argument("cmd", nargs=argparse.REMAINDER)
    p = sub.add_parser("podman", help="podman ARGS... on the project's container storage")
    p.add_argument("args", nargs=argparse.REMAINDER)
    sub.add_parser("env", help="shell export lines for podman/buildah on the project's storage")
    args = ap.parse_args(argv)
    st = Stack()
    tag = args.tag or image_name()
    try:
        if args.action == "build":
            build(st, tag=tag, bases_mode=args.bases)
        elif args.action == "push":
            from . import registry
            st.update_env(registry.up(st))
            ref = registry.ensure_image(st, tag)
            if ref is None:
                raise StackError(f"no image {tag} to push: build it first (`make image`)")
            print(ref)
        elif args.action == "status":
            state, detail = status(st, tag)
            print(f"image      {state:8} {detail}")
            return 0 if state == "ready" else 3
        elif args.action == "env":
            for k, v in write_config(st).items():
                print(f"export {k}={shlex.quote(v)}")
        else:
            ensure_tools()
            argv_ = [*run_argv(), tag, *args.cmd] if args.action == "run" else ["podman", *args.args]
            return subprocess.run(argv_, env=engine_env(st)).returncode
    except StackError as exc:
        print(f"image {args.action} failed: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
