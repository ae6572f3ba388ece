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
   :mod:`eos_stack.spark_s3`; the same versions the Dockerfile pins, checked), and the Debian packages
   of the final stage's ``apt-get install`` with their dependencies, worked out against the final base
   image's own package list by the host's apt. They go into the build context's ``docker/offline/``,
   hard-linked from the caches.
5. **The build**: ``buildah bud --isolation oci --pull=never --network none --layers`` of a context folder
   holding exactly what the Dockerfile copies, tagged as the chart's default image
   (``<image.repository>:<version>``). ``--network none`` proves no ``RUN`` step needs the network. Image
   layers of earlier builds that this one no longer uses are removed afterwards (the disk is small).

``run CMD...`` runs the image (``podman run --rm --runtime runc --network host``), ``podman ARGS...`` runs
podman on this storage, ``env`` prints the variables for a shell (``eval "$(... env)"``).

Disk (measured): the image is 2.3 GB; the storage keeps about 4.4 GB (the bases, each stage's layers). A build
with nothing cached peaks near 8 GB, because buildah 1.28 keeps every step's working container, a second copy
of the data of the layer committed from it, until the build ends. The build stops (and says so) when less than
``EOS_IMAGE_MIN_FREE_GB`` (1) is left for the storage: the disk is shared with everything else on the machine.
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import resource
import shlex
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .common import REPO, Stack, StackError, log

DOCKERFILE = REPO / "Dockerfile"
CHART = REPO / "charts" / "spark-eos-operator"
POM = REPO / "stack" / "spark" / "pom.xml"
# Debian package of each tool (the executable's name is the package's).
TOOLS = ("buildah", "podman", "runc", "mmdebstrap")
STAND_IN_LABEL = "eos.stand-in"
OFFLINE_DIR = "docker/offline"      # in the build context; the Dockerfile's RUN steps bind-mount docker/
PULL_TIMEOUT = 60
# podman 4.3 and buildah 1.28 start the runtime (conmon, runc) with RLIMIT_NPROC 32768 (measured on this
# machine kind); a container asking for more fails ("error setting rlimit type 6"), since raising a hard
# limit needs CAP_SYS_RESOURCE, which the machine does not give.
NPROC_CEILING = 32768
GB = 1 << 30
# What a build with nothing cached needs at its peak (measured: the bases, each stage's layers, and the second
# copy buildah 1.28 keeps of each step's data in its working container until the build ends).
COLD_PEAK_GB = 9
# What Debian's slim images leave out (debuerreotype's slimify: these dpkg exclusions, and the folders left
# empty removed, /usr/share/man/man1 among them), so a stand-in of a "-slim" image is as lean as the real one
# and fails where it would: openjdk's postinst needs /usr/share/man/man1 (the Dockerfile makes it).
SLIM_EXCLUDES = ("path-exclude=/usr/share/doc/*", "path-include=/usr/share/doc/*/copyright",
                 "path-exclude=/usr/share/man/*", "path-exclude=/usr/share/groff/*",
                 "path-exclude=/usr/share/info/*", "path-exclude=/usr/share/lintian/*",
                 "path-exclude=/usr/share/linda/*", "path-exclude=/usr/share/locale/*")
DEBIAN_SUITES = ("bullseye", "bookworm", "trixie")


# -- paths and configuration ---------------------------------------------------------
def home(st: Stack) -> Path:
    return st.cache_dir("image")


def image_name() -> str:
    """The chart's default image, ``<image.repository>:<appVersion>`` (the CRD's default job image too)."""
    import yaml

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return f"{values['image']['repository']}:{chart['appVersion']}"


def qualified(name: str) -> str:
    """``python:3.11`` -> ``docker.io/library/python:3.11``: the name a pull of that ``FROM`` line asks for."""
    first = name.split("/", 1)[0]
    if "/" in name and ("." in first or ":" in first or first == "localhost"):
        return name
    return f"docker.io/{name}" if "/" in name else f"docker.io/library/{name}"


def _toml_list(values: list[str]) -> str:
    return "[" + ", ".join(json.dumps(v) for v in values) + "]"


def storage_driver(st: Stack) -> str:
    recorded = home(st) / "driver"
    return recorded.read_text().strip() if recorded.is_file() else "overlay"


def write_config(st: Stack, driver: str | None = None) -> dict[str, str]:
    """Write the configuration files; return the environment that points buildah and podman at them."""
    h = home(st)
    conf = h / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    (h / "tmp").mkdir(exist_ok=True)
    run_dir = h / "run"
    # The runroot is state of the running system (mount counts, locks): one left by an earlier boot is stale.
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    if run_dir.is_dir() and (run_dir / "boot_id").is_file() and (run_dir / "boot_id").read_text().strip() != boot:
        shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(exist_ok=True)
    (run_dir / "boot_id").write_text(boot)
    driver = driver or storage_driver(st)
    (conf / "storage.conf").write_text(
        "# Written by eos_stack.image: the project's own container storage, under the cache folder.\n"
        f'[storage]\ndriver = "{driver}"\ngraphroot = "{h / "storage"}"\nrunroot = "{run_dir}"\n')
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nofile = min(nofile if nofile != resource.RLIM_INFINITY else 1 << 20, 1 << 20)
    nproc = min(nproc if nproc != resource.RLIM_INFINITY else NPROC_CEILING, NPROC_CEILING)
    # Both, always: podman replaces the whole list when a `--ulimit` is given, and what it leaves out falls
    # back to its default 1048576, which is refused.
    limits = [f"nofile={nofile}:{nofile}", f"nproc={nproc}:{nproc}"]
    (conf / "containers.conf").write_text(
        "# Written by eos_stack.image. runc: crun fails on this machine kind's hybrid cgroups. The limits: no\n"
        "# higher than this process's hard limits, nproc no higher than the 32768 podman gives conmon and runc\n"
        "# (a container cannot get more without CAP_SYS_RESOURCE). A `podman run --ulimit` replaces both.\n"
        f"[containers]\ndefault_ulimits = {_toml_list(limits)}\n\n"
        f'[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n'
        f'tmp_dir = "{run_dir / "libpod"}"\nimage_copy_tmp_dir = "{h / "tmp"}"\n')
    (conf / "registries.conf").write_text(
        "# Written by eos_stack.image: short names (FROM python:...) mean Docker Hub's, as Docker reads them.\n"
        'unqualified-search-registries = ["docker.io"]\nshort-name-mode = "permissive"\n')
    return {"CONTAINERS_STORAGE_CONF": str(conf / "storage.conf"),
            "CONTAINERS_CONF": str(conf / "containers.conf"),
            "CONTAINERS_REGISTRIES_CONF": str(conf / "registries.conf"),
            "TMPDIR": str(h / "tmp")}


def engine_env(st: Stack) -> dict[str, str]:
    """The environment of every buildah/podman call: the process's, plus the configuration above."""
    return {**os.environ, **write_config(st)}


def podman(st: Stack, *args: str, check: bool = True, timeout: float | None = 600,
           capture: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["podman", *args], env=engine_env(st), text=True, timeout=timeout,
                          stdout=subprocess.PIPE if capture else None, stderr=subprocess.PIPE if capture else None)
    if check and proc.returncode != 0:
        raise StackError(f"podman {' '.join(args)} failed (exit {proc.returncode}):\n{(proc.stderr or '')[-3000:]}")
    return proc


def run_argv(*, read_only: bool = False) -> list[str]:
    """``podman run`` as the tests and ``run`` use it: runc, the host's network, removed afterwards. No
    HEALTHCHECK: podman runs it with systemd timers, which this machine kind has none of (Kubernetes ignores it
    too; the chart's probes check the operator)."""
    return ["podman", "run", "--rm", "--runtime", "runc", "--network", "host", "--no-healthcheck",
            *(["--read-only", "--read-only-tmpfs=false"] if read_only else [])]


# -- tools ---------------------------------------------------------------------------
def ensure_tools() -> None:
    missing = [t for t in TOOLS if not shutil.which(t)]
    if not missing:
        return
    if os.geteuid() != 0:
        raise StackError(f"missing {', '.join(missing)}: install them (apt-get install {' '.join(missing)}) as "
                         "root; `make image` runs buildah rootful, so run it as root")
    log(f"installing {', '.join(missing)} with apt-get (Debian packages; first run only)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv, what in ((["apt-get", "update", "-qq"], "apt-get update"),
                       (["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
                        f"apt-get install {' '.join(missing)}")):
        proc = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=1200)
        if proc.returncode != 0:
            tail = "\n".join(proc.stdout.splitlines()[-15:])
            raise StackError(f"{what} failed (exit {proc.returncode}); the image build needs the Debian "
                             f"package(s) {', '.join(missing)}. Install them by hand (apt-get install "
                             f"{' '.join(missing)}), or check that Debian's mirror in /etc/apt/sources.list.d "
                             f"is reachable, then run `make image` again.\n{tail}")
    still = [t for t in TOOLS if not shutil.which(t)]
    if still:
        raise StackError(f"apt-get installed the packages but {', '.join(still)} is still not on PATH")


def ensure_storage(st: Stack) -> None:
    """Use overlay if this machine's kernel and file system allow it, else vfs (recorded once: the graphroot
    holds one driver's layers)."""
    recorded = home(st) / "driver"
    if recorded.is_file():
        return
    env = {**os.environ, **write_config(st, "overlay")}
    proc = subprocess.run(["podman", "info", "--format", "{{.Store.GraphDriverName}}"], env=env,
                          capture_output=True, text=True, timeout=120)
    if proc.returncode == 0 and proc.stdout.strip() == "overlay":
        driver = "overlay"
    else:
        log(f"WARNING: the overlay storage driver does not work here ({proc.stderr.strip()[-300:]}); using vfs "
            "(every layer a full copy: slower, and several GB more disk)")
        shutil.rmtree(home(st) / "storage", ignore_errors=True)
        driver = "vfs"
    recorded.write_text(driver + "\n")


# -- the Dockerfile ------------------------------------------------------------------
@dataclass
class Stage:
    base: str
    name: str | None
    lines: list[str]      # its instructions, continuation lines joined, comments dropped


def stages(path: Path = DOCKERFILE) -> list[Stage]:
    out: list[Stage] = []
    logical = ""
    for raw in path.read_text().splitlines():
        s = raw.strip()
        if s.startswith("#") or (not logical and not s):
            continue
        if s.endswith("\\"):
            logical += s[:-1] + " "
            continue
        logical, line = "", logical + s
        keyword, _, args = line.partition(" ")
        if keyword.upper() == "FROM":
            words = [w for w in args.split() if not w.startswith("--")]
            out.append(Stage(words[0], words[2] if len(words) >= 3 and words[1].upper() == "AS" else None, []))
        elif out:
            out[-1].lines.append(line)
    return out


def external_bases(path: Path = DOCKERFILE) -> list[str]:
    """The ``FROM`` images that are not stages of the same file, in order, once each."""
    found: list[str] = []
    names: set[str] = set()
    for stage in stages(path):
        if stage.base not in names and stage.base != "scratch" and stage.base not in found:
            if "$" in stage.base:
                raise StackError(f"FROM {stage.base}: a base named by a build argument is not supported here")
            found.append(stage.base)
        if stage.name:
            names.add(stage.name)
    return found


def final_apt_packages(path: Path = DOCKERFILE) -> list[str]:
    """The packages the final stage's ``apt-get install`` names (the online branch)."""
    for line in stages(path)[-1].lines:
        for m in re.finditer(r"apt-get install ([^;&|]*)", line):
            pkgs = [w for w in m.group(1).split() if not w.startswith("-") and "/" not in w and "$" not in w]
            if pkgs:
                return pkgs
    raise StackError(f"{path}: the final stage has no `apt-get install <packages>`: cannot tell which Debian "
                     "packages the offline build needs")


def dockerfile_args(path: Path = DOCKERFILE) -> dict[str, str]:
    """Every ``ARG NAME=default`` of the file."""
    args: dict[str, str] = {}
    for stage in stages(path):
        for line in stage.lines:
            if line.upper().startswith("ARG "):
                for word in shlex.split(line[4:]):
                    name, eq, value = word.partition("=")
                    if eq:
                        args[name] = value
    return args


def s3_artifacts(path: Path = DOCKERFILE) -> list[str]:
    """``<artifact>-<version>.jar`` of each ``group:artifact:${VERSION}`` the Dockerfile downloads for S3A."""
    args = dockerfile_args(path)
    text = "\n".join(line for s in stages(path) for line in s.lines)
    coords = re.findall(r"\b([\w.]+):([\w.-]+):\$\{(\w+)\}", text)
    missing = [v for _, _, v in coords if v not in args]
    if missing:
        raise StackError(f"{path}: no ARG default for {missing}")
    return [f"{artifact}-{args[var]}.jar" for _, artifact, var in coords]


def copied_sources(path: Path = DOCKERFILE) -> list[str]:
    """What the build reads from its context: the sources of ``COPY`` without ``--from`` and of ``RUN``'s
    bind mounts."""
    found: list[str] = []
    for stage in stages(path):
        for line in stage.lines:
            keyword, _, args = line.partition(" ")
            words = shlex.split(args)
            if keyword.upper() in ("COPY", "ADD") and not any(w.startswith("--from") for w in words):
                found += [w for w in words if not w.startswith("--")][:-1]
            elif keyword.upper() == "RUN":
                for w in words:
                    if w.startswith("--mount=") and "type=bind" in w and "from=" not in w:
                        opts = dict(o.split("=", 1) for o in w[len("--mount="):].split(",") if "=" in o)
                        found.append(opts.get("source", opts.get("src", ".")))
    return list(dict.fromkeys(found))


# -- base images ---------------------------------------------------------------------
@dataclass
class Recipe:
    suite: str
    packages: list[str]
    changes: list[str]      # podman import --change
    check: str              # a customize hook: fails the stand-in when the base's promise is not kept
    summary: str
    slim: bool = False      # a "-slim" image: Debian's slim file exclusions (SLIM_EXCLUDES), kept for later installs

    def digest(self) -> str:
        return hashlib.sha256(json.dumps([self.suite, self.packages, self.changes, self.check, self.slim,
                                          SLIM_EXCLUDES, mirror_lines(self.suite)]).encode()).hexdigest()[:16]


def host_codename() -> str:
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            return line.split("=", 1)[1].strip().strip('"')
    return "bookworm"


def dpkg_arch() -> str:
    return subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True).stdout.strip() or "amd64"


def suite_of(bases: list[str]) -> str:
    """The Debian release the bases name (``...-slim-bookworm``), else this machine's."""
    for base in bases:
        for suite in DEBIAN_SUITES:
            if suite in base.rpartition(":")[2]:
                return suite
    return host_codename()


def recipe_for(base: str, suite: str) -> Recipe:
    repo, _, tag = base.rpartition(":")
    repo = repo.rsplit("/", 1)[-1]
    env_path = "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    if repo == "python" and (m := re.match(r"(\d+)\.(\d+)", tag)):
        want = f"{m[1]}.{m[2]}"
        return Recipe(
            suite, ["python3", "python3-venv", "python-is-python3", "ca-certificates", "netbase", "tzdata", "passwd"],
            [env_path, "ENV LANG=C.UTF-8", 'CMD ["python3"]'],
            f'v=$(chroot "$1" python3 -c \'import sys; print("%d.%d" % sys.version_info[:2])\'); '
            f'[ "$v" = "{want}" ] || {{ echo "Debian {suite}\'s python3 is $v, the base {base} is Python {want}: '
            f'no stand-in from Debian {suite}" >&2; exit 1; }}',
            f"Debian {suite}'s python3 ({want}), python3-venv, python-is-python3" + (", slim" if "slim" in tag else ""),
            slim="slim" in tag)
    if (repo == "maven" and (m := re.search(r"(?:temurin|jdk|openjdk)-?(\d+)", tag))) or \
            (repo in ("eclipse-temurin", "openjdk") and (m := re.match(r"(\d+)", tag))):
        jdk = m[1]
        java_home = f"/usr/lib/jvm/java-{jdk}-openjdk-{dpkg_arch()}"
        packages = [f"openjdk-{jdk}-jdk-headless", "ca-certificates"] + (["maven"] if repo == "maven" else [])
        return Recipe(
            suite, packages,
            [env_path, "ENV LANG=C.UTF-8", f"ENV JAVA_HOME={java_home}"]
            + (["ENV MAVEN_HOME=/usr/share/maven", 'CMD ["mvn"]'] if repo == "maven" else ['CMD ["jshell"]']),
            f'chroot "$1" java -version 2>&1 | grep -q \'version "{jdk}\' || {{ echo "no Java {jdk} in the '
            f'stand-in for {base}" >&2; exit 1; }}' + (' && chroot "$1" mvn -v >/dev/null' if repo == "maven" else ""),
            f"Debian {suite}'s openjdk-{jdk}-jdk-headless" + (" and maven" if repo == "maven" else ""))
    raise StackError(f"FROM {base}: it cannot be pulled and there is no stand-in recipe for it in "
                     f"stack/eos_stack/image.py (python:3.X-* and maven/eclipse-temurin Java bases only)")


def mirror_lines(suite: str) -> list[str]:
    """This machine's Debian sources (``/etc/apt/sources.list.d/*.sources``, ``sources.list``) as one-line
    entries for ``suite``: the stand-ins come from the mirror the machine is configured with."""
    host = host_codename()
    lines: list[str] = []
    files = sorted(Path("/etc/apt/sources.list.d").glob("*.sources")) + [Path("/etc/apt/sources.list")]
    for f in files:
        if not f.is_file():
            continue
        if f.suffix == ".sources":
            for block in re.split(r"\n\s*\n", f.read_text()):
                fields: dict[str, str] = {}
                for line in block.splitlines():
                    if line.startswith("#") or ":" not in line:
                        continue
                    k, v = line.split(":", 1)
                    fields[k.strip().lower()] = v.strip()
                if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes") == "no":
                    continue
                signed = f" [signed-by={fields['signed-by']}]" if fields.get("signed-by", "").startswith("/") else ""
                for uri in fields.get("uris", "").split():
                    for s in fields.get("suites", "").split():
                        lines.append(f"deb{signed} {uri} {s.replace(host, suite)} {fields.get('components', 'main')}")
        else:
            for line in f.read_text().splitlines():
                if line.strip().startswith("deb "):
                    lines.append(re.sub(rf"\b{host}\b", suite, line.strip()))
    if not lines:
        lines = [f"deb http://deb.debian.org/debian {suite} main", f"deb http://deb.debian.org/debian {suite}-updates main",
                 f"deb http://deb.debian.org/debian-security {suite}-security main"]
    return lines


def image_labels(st: Stack, ref: str) -> dict[str, str] | None:
    """The labels of local image ``ref``, or None when it is not in the project's storage."""
    proc = podman(st, "image", "inspect", "--format", "{{json .Labels}}", ref, check=False)
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout.strip() or "null") or {}


def try_pull(st: Stack, ref: str) -> str | None:
    """Pull ``ref``; None if that worked, else why not (one line)."""
    try:
        proc = podman(st, "pull", "--quiet", ref, check=False, timeout=PULL_TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"no answer within {PULL_TIMEOUT}s"
    if proc.returncode == 0:
        return None
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else f"exit {proc.returncode}")[:240]


def make_stand_in(st: Stack, base: str, recipe: Recipe) -> None:
    ref = qualified(base)
    h = home(st)
    tar = h / "bases" / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', base)}.tar"
    tar.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    log(f"making a LOCAL STAND-IN for {base}: mmdebstrap --variant=minbase {recipe.suite} with "
        f"{', '.join(recipe.packages)} (about a minute)")
    argv = ["mmdebstrap", "--variant=minbase", "--format=tar", f"--include={','.join(recipe.packages)}",
            *(f"--dpkgopt={o}" for o in (SLIM_EXCLUDES if recipe.slim else ())), "--aptopt=Acquire::Retries \"3\";",
            f"--customize-hook={recipe.check}", recipe.suite, str(tar), *mirror_lines(recipe.suite)]
    logf = st.dir("logs") / "image-bases.log"
    with open(logf, "a") as out:
        out.write(f"\n==== {time.strftime('%F %T')} {base}: {shlex.join(argv)}\n")
        out.flush()
        proc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=1800)
    if proc.returncode != 0:
        tar.unlink(missing_ok=True)
        tail = "\n".join(logf.read_text(errors="replace").splitlines()[-20:])
        raise StackError(f"mmdebstrap could not make the stand-in for {base} (exit {proc.returncode}; "
                         f"is Debian's mirror reachable?); log: {logf}\n{tail}")
    label = f"{recipe.summary}; mmdebstrap {recipe.suite} minbase; recipe {recipe.digest()}"
    changes = [*recipe.changes, f"LABEL {STAND_IN_LABEL}={json.dumps(label)}"]
    podman(st, "import", *(a for c in changes for a in ("--change", c)), "--message",
           f"eos_stack.image stand-in for {base}", str(tar), ref, timeout=900)
    tar.unlink(missing_ok=True)
    size = podman(st, "image", "inspect", "--format", "{{.Size}}", ref).stdout.strip()
    log(f"stand-in {ref} ready in {time.monotonic() - t0:.0f}s ({int(size) >> 20} MiB): {recipe.summary}")


def ensure_bases(st: Stack, *, mode: str) -> dict[str, str]:
    """Each external ``FROM`` image present locally; returns {base: "pulled"|"stand-in: ..."}."""
    bases = external_bases()
    suite = suite_of(bases)
    kinds: dict[str, str] = {}
    for base in bases:
        ref = qualified(base)
        labels = image_labels(st, ref)
        recipe = None
        if labels is not None and STAND_IN_LABEL not in labels:
            kinds[base] = "pulled"
            continue
        if labels is not None:
            recipe = recipe_for(base, suite)
            if labels[STAND_IN_LABEL].endswith(f"recipe {recipe.digest()}"):
                kinds[base] = f"stand-in ({labels[STAND_IN_LABEL]})"
                log(f"base {base}: the LOCAL STAND-IN made earlier ({labels[STAND_IN_LABEL]})")
                continue
            log(f"base {base}: the stand-in's recipe changed; making it again")
        if labels is None and mode != "stand-in":
            log(f"base {base}: not in the project's container storage; trying to pull {ref}")
            why = try_pull(st, ref)
            if why is None:
                log(f"base {base}: pulled {ref}")
                kinds[base] = "pulled"
                continue
            if mode == "pull":
                raise StackError(f"base {base}: {ref} cannot be pulled ({why})")
            log(f"base {base}: cannot be pulled ({why}); Docker Hub is not reachable from here")
        recipe = recipe or recipe_for(base, suite)
        make_stand_in(st, base, recipe)
        kinds[base] = f"stand-in ({image_labels(st, ref)[STAND_IN_LABEL]})"
    return kinds


# -- offline inputs ------------------------------------------------------------------
def link_or_copy(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.unlink(missing_ok=True)
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def python_requirements() -> list[str]:
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    return [*meta["build-system"]["requires"], *meta["project"]["dependencies"]]


def ensure_wheels(st: Stack, base_python: str) -> list[Path]:
    """Wheels of the project's dependencies and build requirements for the image's Python: once per set of
    requirements (``pip wheel`` with the project's pip cache; PyPI only the first time)."""
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if here != base_python:
        raise StackError(f"the wheels are made with this Python ({sys.executable}, {here}) for the image's "
                         f"Python {base_python}: run `make image` (the project's {base_python} venv)")
    reqs = python_requirements()
    key = hashlib.sha256(json.dumps([reqs, here, sys.platform, os.uname().machine]).encode()).hexdigest()[:12]
    root = home(st) / "wheels"
    out = root / key
    if not (out / ".complete").is_file():
        t0 = time.monotonic()
        log(f"making wheels of {len(reqs)} requirements for the image (pip wheel; from the pip cache when it has them)")
        tmp = root / f"{key}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check",
                               "--wheel-dir", str(tmp), *reqs], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=3600)
        if proc.returncode != 0:
            raise StackError(f"pip wheel failed (exit {proc.returncode}; is PyPI reachable?):\n{proc.stdout[-3000:]}")
        (tmp / ".complete").write_text("\n".join(reqs) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
        size = sum(p.stat().st_size for p in out.glob("*.whl"))
        log(f"{len(list(out.glob('*.whl')))} wheels ({size >> 20} MiB) in {time.monotonic() - t0:.0f}s")
    for old in root.iterdir():          # one set is kept: the disk is small
        if old != out:
            shutil.rmtree(old, ignore_errors=True)
    return sorted(out.glob("*.whl"))


def pom_spark_version() -> str:
    m = re.search(r"<spark\.version>([^<]+)</spark\.version>", POM.read_text())
    if not m:
        raise StackError(f"{POM} names no spark.version")
    return m[1]


def ensure_jars(st: Stack) -> tuple[list[Path], list[Path]]:
    """The Kafka connector and S3A jars of the stack's cache (fetched by the stack first if missing), checked to
    be the versions the Dockerfile pins."""
    from . import spark, spark_s3

    if spark.connector_version() != pom_spark_version():
        raise StackError(f"the stack's Spark Kafka connector is {spark.connector_version()} (for pyspark "
                         f"{spark.pyspark_version()}), the Dockerfile's {POM.relative_to(REPO)} pins "
                         f"{pom_spark_version()}: make them agree")
    kafka = spark.ensure_jars(st)
    s3 = spark_s3.ensure_jars(st)
    have = {p.name for p in s3}
    want = s3_artifacts()
    if sorted(have) != sorted(want):
        raise StackError(f"the stack's S3A jars ({sorted(have)}) are not the ones the Dockerfile's ARGs pin "
                         f"({sorted(want)}): make them agree (stack/eos_stack/spark_s3.py derives them)")
    return kafka, s3


def dpkg_status_of(st: Stack, ref: str) -> str:
    mount = podman(st, "image", "mount", ref).stdout.strip()
    try:
        return (Path(mount) / "var" / "lib" / "dpkg" / "status").read_text()
    finally:
        podman(st, "image", "unmount", ref, check=False)


def ensure_debs(st: Stack, base: str, packages: list[str]) -> list[Path]:
    """The .deb files ``apt-get install packages`` would add to image ``base``: worked out by this machine's apt
    against the base's own package list, downloaded into ``<cache>/image/debs`` (kept: a later build finds
    them there)."""
    h = home(st)
    archives = h / "debs"
    (archives / "partial").mkdir(parents=True, exist_ok=True)
    work = h / "apt"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    (work / "status").write_text(dpkg_status_of(st, qualified(base)))
    (work / "extended_states").write_text("")
    (work / "plan" / "partial").mkdir(parents=True)
    opts = ["-o", f"Dir::State::status={work / 'status'}", "-o", f"Dir::State::extended_states={work / 'extended_states'}",
            "-o", "Dir::Cache::pkgcache=", "-o", "Dir::Cache::srcpkgcache=",
            "-o", "Debug::NoLocking=1", "-o", "APT::Sandbox::User=root", "-o", "Acquire::Retries=3"]
    argv = ["apt-get", "install", "--yes", "--no-install-recommends", *opts]

    def plan() -> subprocess.CompletedProcess:
        # Against an empty archive folder: --print-uris leaves out what the archive folder already holds.
        return subprocess.run([*argv, "-o", f"Dir::Cache::archives={work / 'plan'}/", "--print-uris", "-qq",
                               *packages], capture_output=True, text=True, timeout=300)

    proc = plan()
    if proc.returncode != 0:
        log("apt could not plan the image's Debian packages with this machine's package lists; apt-get update")
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, text=True, timeout=600)
        proc = plan()
    if proc.returncode != 0:
        raise StackError(f"apt cannot work out {' '.join(packages)} for {base}:\n{proc.stderr[-2000:]}")
    files = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("'")]
    if not files:
        raise StackError(f"{base} already has {' '.join(packages)}: nothing for the offline apt-get install")
    if any(not (archives / f).is_file() for f in files):
        t0 = time.monotonic()
        proc = subprocess.run([*argv, "-o", f"Dir::Cache::archives={archives}/", "--download-only", "-q", *packages],
                              capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            raise StackError(f"apt-get could not download {' '.join(packages)} (is Debian's mirror reachable?):\n"
                             f"{proc.stderr[-2000:]}")
        log(f"downloaded {len(files)} Debian packages for the final stage in {time.monotonic() - t0:.0f}s")
    return [archives / f for f in files]


# -- the build -----------------------------------------------------------------------
def assemble_context(st: Stack, offline: dict[str, list[Path]]) -> tuple[Path, str]:
    """A build context with exactly what the Dockerfile reads, and the offline inputs under docker/offline/.
    Returns it and a digest of the offline files (the value of the OFFLINE build argument: a change rebuilds
    the steps that use them)."""
    ctx = home(st) / "context"
    shutil.rmtree(ctx, ignore_errors=True)
    ctx.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".pytest_cache")
    for source in copied_sources():
        src = REPO / source
        if source in (".", "./"):
            raise StackError("the Dockerfile copies or mounts the whole context: not supported by eos_stack.image")
        if src.is_dir():
            shutil.copytree(src, ctx / source, ignore=ignore, symlinks=True)
        elif src.is_file():
            (ctx / source).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, ctx / source)
        elif not any(ch in source for ch in "*?["):
            raise StackError(f"the Dockerfile reads {source} from the context, and {src} does not exist")
    shutil.copy2(DOCKERFILE, ctx / "Dockerfile")
    digest = hashlib.sha256()
    for kind, files in sorted(offline.items()):
        for f in sorted(files, key=lambda p: p.name):
            link_or_copy(f, ctx / OFFLINE_DIR / kind / f.name)
            s = f.stat()
            digest.update(f"{kind}/{f.name} {s.st_size} {s.st_mtime_ns}\n".encode())
    return ctx, digest.hexdigest()[:16]


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
    stand_ins = [b for b, k in kinds.items() if k.startswith("stand-in")]
    if stand_ins:
        log(f"NOTE: building on LOCAL STAND-INS for {', '.join(stand_ins)} (Debian {suite_of(bases)} packages, "
            "not the Docker Hub images)")
    logf = st.dir("logs") / "image-build.log"
    argv = ["buildah", "bud", "--isolation", "oci", "--runtime", shutil.which("runc") or "runc", "--pull=never",
            "--network", "none", "--layers", "--force-rm", "--format", "docker", "--build-arg", f"OFFLINE={digest}",
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
