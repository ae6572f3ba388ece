"""What the other ``eos_stack.image*`` modules share: the project's paths, the container storage and its
configuration (every buildah/podman call runs on it, never on the system's), the ``podman`` call, the tools
``make image`` needs, and reading the ``Dockerfile`` (its stages, ``FROM`` images, the final stage's Debian
packages and what it copies from the build context). Nothing here builds or pulls anything: :mod:`eos_stack.image` does that,
with :mod:`eos_stack.image_bases` and :mod:`eos_stack.image_inputs`.
"""
from __future__ import annotations

import json
import os
import re
import resource
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .common import REPO, Stack, StackError, log

DOCKERFILE = REPO / "Dockerfile"
CHART = REPO / "charts" / "spark-eos-operator"
# Debian package of each tool (the executable's name is the package's).
TOOLS = ("buildah", "podman", "runc", "mmdebstrap")
# podman 4.3 and buildah 1.28 start the runtime (conmon, runc) with RLIMIT_NPROC 32768 (measured on this
# machine kind); a container asking for more fails ("error setting rlimit type 6"), since raising a hard
# limit needs CAP_SYS_RESOURCE, which the machine does not give.
NPROC_CEILING = 32768


# -- paths and configuration ---------------------------------------------------------
def home(st: Stack) -> Path:
    return st.cache_dir("image")


def image_name() -> str:
    """The chart's default image, ``<image.repository>:<appVersion>`` (the CRD's default job image too)."""
    import yaml

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return f"{values['image']['repository']}:{chart['appVersion']}"


def image_under_test() -> str:
    """The image the tests run (tests/stack/test_image.py, Pods in containers, the real nodes' streams):
    ``EOS_TEST_IMAGE`` (another build, ``make image EOS_IMAGE_TAG=...``: the chart's default stays as it is),
    else the chart's default image."""
    return os.environ.get("EOS_TEST_IMAGE") or image_name()


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
def ensure_tools(tools: tuple[str, ...] = TOOLS, *, packages: tuple[str, ...] | None = None,
                 needed_by: str = "the image build (`make image`)") -> None:
    """Install the Debian packages of the ``tools`` that are not on PATH (``packages``: their package names,
    default the tools' own names) with apt-get, as root, saying what it installs and for what."""
    packages = packages or tools
    missing = list(dict.fromkeys(pkg for tool, pkg in zip(tools, packages) if not shutil.which(tool)))
    if not missing:
        return
    if os.geteuid() != 0:
        raise StackError(f"missing {', '.join(missing)}: install them (apt-get install {' '.join(missing)}) as "
                         f"root; {needed_by} needs them")
    log(f"installing {', '.join(missing)} with apt-get for {needed_by} (Debian packages; first run only)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv, what in ((["apt-get", "update", "-qq"], "apt-get update"),
                       (["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
                        f"apt-get install {' '.join(missing)}")):
        proc = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=1200)
        if proc.returncode != 0:
            tail = "\n".join(proc.stdout.splitlines()[-15:])
            raise StackError(f"{what} failed (exit {proc.returncode}); {needed_by} needs the Debian "
                             f"package(s) {', '.join(missing)}. Install them by hand (apt-get install "
                             f"{' '.join(missing)}), or check that Debian's mirror in /etc/apt/sources.list.d "
                             f"is reachable, then try again.\n{tail}")
    still = [t for t in tools if not shutil.which(t)]
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
