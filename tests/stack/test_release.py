"""``make release VERSION=...`` (stack/eos_stack/release.py) on a clone of this repository: the version in every
place, the CRDs and reference regenerated, the changelog section, one commit and an annotated tag, the chart
packaged by the stack's helm with the version inside, checksums; and the refusals that keep a release honest
(a version that is not one, a dirty tree, a tag that exists, nothing in the changelog). The image step is the
same ``python -m eos_stack.image build`` that ``make test`` runs before these tests; here it is left out
(``--no-image``)."""
from __future__ import annotations

import datetime as dt
import hashlib
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from eos_stack import release

REPO = Path(__file__).resolve().parents[2]
DAY = dt.date(2026, 12, 1)


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def clone(tmp_path) -> Path:
    root = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", str(REPO), str(root)], check=True)
    git(root, "config", "user.email", "release-test@example.invalid")
    git(root, "config", "user.name", "release test")
    # The changelog's Unreleased section as a release finds it (whatever this repository's says today).
    text = (root / "CHANGELOG.md").read_text()
    text = re.sub(r"(?m)^## Unreleased[ \t]*\n", "## Unreleased\n\n- The release test's entry.\n", text, count=1)
    (root / "CHANGELOG.md").write_text(text)
    git(root, "commit", "-q", "-am", "changelog entry")
    return root


def test_a_release_bumps_every_place_commits_tags_and_packages_the_chart(stack_env, clone):
    out = release.release(clone, "0.2.0", image=False, day=DAY, helm=stack_env["HELM"])

    assert git(clone, "log", "-1", "--format=%s").strip() == "Release 0.2.0"
    assert git(clone, "status", "--porcelain", "--untracked-files=no") == ""
    tag = git(clone, "cat-file", "-p", "v0.2.0")
    assert "type commit" in tag and "The release test's entry." in tag, tag      # annotated, with its notes
    assert git(clone, "rev-parse", "v0.2.0^{commit}") == git(clone, "rev-parse", "HEAD")

    assert 'version = "0.2.0"' in (clone / "pyproject.toml").read_text()
    chart = yaml.safe_load((clone / release.CHART / "Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == ("0.2.0", "0.2.0")
    for rel in ("jobs/eos_job/__init__.py", "operator/eos_operator/__init__.py"):
        assert '__version__ = "0.2.0"' in (clone / rel).read_text(), rel
    assert re.search(r'DEFAULT_IMAGE = "[^"]+:0\.2\.0"', (clone / "jobs/eos_job/spec.py").read_text())
    assert "ARG EOS_IMAGE=ghcr.io/spark-eos/spark-eos-operator:0.2.0\n" in (clone / "examples/job-image/Dockerfile").read_text()
    for crds in (clone / "crds", clone / release.CHART / "crds"):     # regenerated from the bumped model
        text = (crds / "exactlyoncestreams.streaming.eos.dev.yaml").read_text()
        assert "spark-eos-operator:0.2.0" in text and "spark-eos-operator:0.1.0" not in text, crds
    log = (clone / "CHANGELOG.md").read_text()
    assert "## Unreleased\n\n## 0.2.0 - 2026-12-01\n\n- The release test's entry.\n" in log

    packaged = Path(out["chart"])
    assert packaged == clone / "dist" / "spark-eos-operator-0.2.0.tgz" and packaged.is_file()
    shown = yaml.safe_load(subprocess.run([stack_env["HELM"], "show", "chart", str(packaged)], check=True,
                                          capture_output=True, text=True).stdout)
    assert (shown["version"], shown["appVersion"]) == ("0.2.0", "0.2.0")
    sums = (clone / "dist" / "SHA256SUMS").read_text()
    assert f"{hashlib.sha256(packaged.read_bytes()).hexdigest()}  {packaged.name}" in sums

    # A second release of the same version is refused (tags are never moved) and so is a dirty tree.
    with pytest.raises(release.ReleaseError, match="tag v0.2.0 exists already"):
        release.release(clone, "0.2.0", image=False, day=DAY, helm=stack_env["HELM"])
    (clone / "README.md").write_text("changed\n")
    with pytest.raises(release.ReleaseError, match="uncommitted changes"):
        release.release(clone, "0.2.1", image=False, day=DAY, helm=stack_env["HELM"])


@pytest.mark.parametrize("version", ["0.2", "v0.2.0", "0.2.0-beta", "01.2.3", "0.2.0-rc.01"])
def test_a_version_that_is_not_one_is_refused_naming_the_form(version):
    with pytest.raises(release.ReleaseError, match=r"give X\.Y\.Z or X\.Y\.Z-rc\.N"):
        release.check_version(version)


def test_an_empty_unreleased_section_is_refused():
    with pytest.raises(release.ReleaseError, match="lists nothing"):
        release.bump_changelog("# Changelog\n\n## Unreleased\n\n## 0.1.0 - 2026-11-01\n- old\n", "0.2.0", DAY)
    with pytest.raises(release.ReleaseError, match="no `## Unreleased` section"):
        release.bump_changelog("# Changelog\n\n## 0.1.0 - 2026-11-01\n- old\n", "0.2.0", DAY)
    bumped = release.bump_changelog("# C\n\n## Unreleased\n### Fixed\n- a\n\n## 0.1.0 - 2026-11-01\n- old\n",
                                    "0.2.0", DAY)
    assert bumped == "# C\n\n## Unreleased\n\n## 0.2.0 - 2026-12-01\n### Fixed\n- a\n\n## 0.1.0 - 2026-11-01\n- old\n"
