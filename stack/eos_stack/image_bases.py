"""The ``FROM`` images of the Dockerfile in the project's container storage (step 3 of ``make image``, see
:mod:`eos_stack.image`): each one is pulled, or, when it cannot be (Docker Hub is not reachable from this
machine kind), a **local stand-in** is made from Debian packages with ``mmdebstrap --variant=minbase`` (a
:class:`Recipe` per kind of base: ``python:3.X-*``, maven/eclipse-temurin Java images), imported with
``podman import`` under the ``FROM`` line's name and labelled ``eos.stand-in`` with its recipe's digest, so a
changed recipe makes it again.
"""
from __future__ import annotations

import hashlib
import json
import re
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .common import Stack, StackError, log
from .image_common import external_bases, home, podman, qualified

STAND_IN_LABEL = "eos.stand-in"
PULL_TIMEOUT = 60
# What Debian's slim images leave out (debuerreotype's slimify: these dpkg exclusions, and the folders left
# empty removed, /usr/share/man/man1 among them), so a stand-in of a "-slim" image is as lean as the real one
# and fails where it would: openjdk's postinst needs /usr/share/man/man1 (the Dockerfile makes it).
SLIM_EXCLUDES = ("path-exclude=/usr/share/doc/*", "path-include=/usr/share/doc/*/copyright",
                 "path-exclude=/usr/share/man/*", "path-exclude=/usr/share/groff/*",
                 "path-exclude=/usr/share/info/*", "path-exclude=/usr/share/lintian/*",
                 "path-exclude=/usr/share/linda/*", "path-exclude=/usr/share/locale/*")
DEBIAN_SUITES = ("bullseye", "bookworm", "trixie")


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
                     f"stack/eos_stack/image_bases.py (python:3.X-* and maven/eclipse-temurin Java bases only)")


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
