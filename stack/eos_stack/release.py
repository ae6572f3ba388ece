"""``make release VERSION=X.Y.Z`` (``python -m eos_stack.release X.Y.Z``): the release checklist, followed by a
script so no step is forgotten. In a clean work tree of the commit to release it

1. checks the version (``X.Y.Z`` or ``X.Y.Z-rc.N``), that the tree is clean, that ``vX.Y.Z`` is not a tag yet and
   that ``CHANGELOG.md``'s ``## Unreleased`` section says something;
2. writes the version into every place that carries it (:data:`PLACES`: ``pyproject.toml``, both packages'
   ``__version__``, the runtime image's default tag in ``eos_job.spec``, the chart's ``version`` and
   ``appVersion``, the job-image example's base), regenerates what is made from them (``crds/``, the chart's copy of them,
   ``docs/reference.md``), and turns ``## Unreleased`` into ``## X.Y.Z - <date>`` under a new, empty
   ``## Unreleased``;
3. commits that as "Release X.Y.Z" and tags it ``vX.Y.Z`` (annotated, the changelog section as its message);
4. packages the chart (``helm package`` into ``dist/``), builds the image tagged ``<repository>:X.Y.Z``
   (``python -m eos_stack.image build``; ``--no-image`` leaves it out) and its SBOM (``eos_stack.sbom``: CycloneDX
   and SPDX JSON in ``dist/``), and writes ``dist/SHA256SUMS``;
5. prints what is left to a person: pushing the tag, the chart (``helm push dist/... oci://<registry>``) and the
   image, which need credentials this script never holds.

Nothing is pushed and nothing outside the work tree is changed but the image store. A failed step stops with
what to do; the version bump is one commit, so ``git reset --hard HEAD~1 && git tag -d vX.Y.Z`` undoes a
release that was not pushed.
"""
from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VERSION_RE = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-rc\.(0|[1-9]\d*))?$")
CHART = Path("charts/spark-eos-operator")
# Every file that carries the version, and the pattern of the line that carries it (group 1 is kept).
PLACES: tuple[tuple[str, str], ...] = (
    ("pyproject.toml", r'(?m)^(version = ")[^"]+(")'),
    ("jobs/eos_job/__init__.py", r'(?m)^(__version__ = ")[^"]+(")'),
    ("operator/eos_operator/__init__.py", r'(?m)^(__version__ = ")[^"]+(")'),
    ("jobs/eos_job/spec.py", r'(?m)^(DEFAULT_IMAGE = "[^":]+:)[^"]+(")'),
    ("charts/spark-eos-operator/Chart.yaml", r'(?m)^(version: )\S+()$'),
    ("charts/spark-eos-operator/Chart.yaml", r'(?m)^(appVersion: ")[^"]+(")'),
    ("examples/job-image/Dockerfile", r'(?m)^(ARG EOS_IMAGE=[^:\s]+:)\S+()$'),
)


class ReleaseError(Exception):
    """A step that cannot go on; the message says what to do."""


def log(msg: str) -> None:
    print(f"[release] {msg}", flush=True)


def git(root: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ReleaseError(f"git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


def check_version(version: str) -> str:
    if not VERSION_RE.match(version):
        raise ReleaseError(f"VERSION={version!r} is not a release version: give X.Y.Z or X.Y.Z-rc.N, "
                           f"for example `make release VERSION=0.1.0`")
    return version


def check_tree(root: Path, version: str) -> None:
    dirty = git(root, "status", "--porcelain", "--untracked-files=no").strip()
    if dirty:
        raise ReleaseError(f"the work tree has uncommitted changes; commit or stash them first:\n{dirty}")
    if git(root, "tag", "--list", f"v{version}").strip():
        raise ReleaseError(f"tag v{version} exists already: pick the next version (tags are never moved)")


def unreleased(changelog: str) -> tuple[int, int, str]:
    """The ``## Unreleased`` section: its start, its end and its body."""
    m = re.search(r"(?m)^## Unreleased[ \t]*\n", changelog)
    if not m:
        raise ReleaseError("CHANGELOG.md has no `## Unreleased` section: add one with what this release changes")
    nxt = re.search(r"(?m)^## ", changelog[m.end():])
    end = m.end() + nxt.start() if nxt else len(changelog)
    body = changelog[m.end():end]
    if not re.search(r"(?m)^\s*[-*] \S", body):
        raise ReleaseError("CHANGELOG.md's `## Unreleased` section lists nothing: say what this release changes")
    return m.start(), end, body


def bump_changelog(changelog: str, version: str, day: dt.date) -> str:
    start, end, body = unreleased(changelog)
    section = f"## Unreleased\n\n## {version} - {day.isoformat()}\n{body}"
    return changelog[:start] + section + changelog[end:]


def set_version(root: Path, version: str) -> list[str]:
    """Write ``version`` into every place of :data:`PLACES`; the files changed."""
    changed: list[str] = []
    for rel, pattern in PLACES:
        path = root / rel
        text = path.read_text()
        new, n = re.subn(pattern, lambda m: f"{m.group(1)}{version}{m.group(2)}", text, count=1)
        if n != 1:
            raise ReleaseError(f"{rel}: the version line ({pattern}) is not there; the release script and the "
                               f"file disagree: fix PLACES in stack/eos_stack/release.py")
        if new != text:
            path.write_text(new)
            changed.append(rel)
    return sorted(set(changed))


def regenerate(root: Path) -> None:
    """The CRDs (and the chart's copy) and the field reference, made from the models that carry the image tag."""
    env = {**os.environ, "PYTHONPATH": f"{root / 'jobs'}:{root / 'operator'}"}
    for argv in (["-m", "eos_operator.crd"], ["-m", "eos_operator.crd", "--dir", str(root / CHART / "crds")],
                 ["-m", "eos_operator.crd_reference"]):
        proc = subprocess.run([sys.executable, *argv], cwd=root, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ReleaseError(f"python {' '.join(argv)} failed:\n{proc.stdout}{proc.stderr}")


def helm_binary() -> str:
    """The stack's helm (built into the cache by ``eos_stack up`` when missing)."""
    from eos_stack import helm
    from eos_stack.common import Stack
    return helm.up(Stack())["HELM"]


def package_chart(root: Path, helm: str, dist: Path) -> Path:
    dist.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([helm, "package", str(root / CHART), "--destination", str(dist)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise ReleaseError(f"helm package failed: {proc.stderr.strip()}")
    return Path(proc.stdout.strip().rsplit(": ", 1)[-1])


def sha256sums(dist: Path) -> Path:
    lines = []
    for f in sorted(p for p in dist.iterdir() if p.is_file() and p.name != "SHA256SUMS"):
        lines.append(f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.name}")
    out = dist / "SHA256SUMS"
    out.write_text("\n".join(lines) + "\n")
    return out


def release(root: Path, version: str, *, image: bool, day: dt.date, helm: str | None = None) -> dict[str, str]:
    check_version(version)
    check_tree(root, version)
    changelog_path = root / "CHANGELOG.md"
    changelog = bump_changelog(changelog_path.read_text(), version, day)
    log(f"version {version}: {', '.join(set_version(root, version)) or 'already set everywhere'}")
    changelog_path.write_text(changelog)
    regenerate(root)
    git(root, "add", "-u")
    git(root, "commit", "-q", "-m", f"Release {version}")
    notes = changelog.split(f"## {version} - {day.isoformat()}\n", 1)[1].split("\n## ", 1)[0]
    git(root, "tag", "-a", f"v{version}", "-m", f"Release {version}\n{notes}")
    log(f"committed and tagged v{version} ({git(root, 'rev-parse', '--short', 'HEAD').strip()})")
    dist = root / "dist"
    chart = package_chart(root, helm or helm_binary(), dist)
    log(f"chart packaged: {chart}")
    result = {"tag": f"v{version}", "chart": str(chart)}
    if image:
        from eos_stack.image_common import image_name
        tag = image_name()
        proc = subprocess.run([sys.executable, "-m", "eos_stack.image", "--tag", tag, "build"], cwd=root)
        if proc.returncode != 0:
            raise ReleaseError(f"the image build failed (its log above); the tag v{version} is made: fix, then "
                               f"`python -m eos_stack.image --tag {tag} build` by hand")
        result["image"] = tag
        log(f"image built: {tag}")
        from eos_stack import sbom
        from eos_stack.common import Stack
        try:
            cdx, spdx = sbom.make(Stack(), tag, dist)
        except Exception as exc:  # noqa: BLE001 - any failure: say what to run by hand
            raise ReleaseError(f"the image's SBOM failed ({exc}); the tag v{version} is made: fix, then "
                               f"`python -m eos_stack.sbom --tag {tag}` by hand") from exc
        result["sbom"] = f"{cdx}, {spdx}"
    result["sums"] = str(sha256sums(dist))
    log("left to a person with the credentials: "
        f"`git push origin v{version}`; `helm push {chart} oci://<registry>/charts`; "
        f"`podman push {result.get('image', '<image>')}`; the GitHub release with the changelog section; "
        f"then PREVIOUS_BUILD = \"v{version}\" in tests/previous_build.py (later builds are "
        "tested as upgrades from this release)")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eos_stack.release", description=__doc__.split("\n\n")[0])
    ap.add_argument("version", help="X.Y.Z or X.Y.Z-rc.N")
    ap.add_argument("--no-image", action="store_true", help="leave the image build out")
    ap.add_argument("--repo", type=Path, default=REPO, help="the work tree to release (default: this one)")
    args = ap.parse_args(argv)
    try:
        release(args.repo.resolve(), args.version, image=not args.no_image, day=dt.date.today())
    except ReleaseError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
