"""No broken links in the repository's Markdown (issue 31), and the checker itself: it finds what is broken and
takes GitHub's anchors for what they are. Offline."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.links import anchors, check, pages, slug

REPO = Path(__file__).resolve().parents[2]


def test_every_relative_link_and_anchor_of_the_documentation_resolves():
    covered = {page.relative_to(REPO).as_posix() for page in pages(REPO)}
    # The pages the issue names exist, so an empty glob cannot pass for a clean check.
    for name in ("README.md", "docs/user-guide.md", "docs/operations.md", "docs/exactly-once.md",
                 "docs/testing.md", "docs/measurements.md", "docs/reference.md", "CHANGELOG.md", "SECURITY.md",
                 "benchmarks/README.md", "charts/spark-eos-operator/README.md"):
        assert name in covered, f"{name} is not among the checked pages {sorted(covered)}"
    broken = check(REPO)
    assert not broken, "broken links:\n" + "\n".join(map(str, broken))


def test_the_readme_indexes_every_page_of_docs():
    readme = (REPO / "README.md").read_text()
    for page in sorted((REPO / "docs").glob("*.md")):
        assert f"](docs/{page.name})" in readme, f"README.md's docs index has no link to docs/{page.name}"


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def found(root: Path) -> list[tuple[str, int, str]]:
    return [(b.page, b.line, b.target) for b in check(root, ("*.md", "docs/*.md"))]


def test_a_link_to_a_missing_file_is_reported_with_its_page_and_line(tmp_path):
    write(tmp_path, {"README.md": "# Title\n\nSee [the guide](docs/guide.md) and\n[gone](docs/gone.md).\n",
                     "docs/guide.md": "# Guide\n"})
    assert found(tmp_path) == [("README.md", 4, "docs/gone.md")]


def test_a_link_to_a_missing_anchor_is_reported_and_a_present_one_is_not(tmp_path):
    write(tmp_path, {"README.md": "[ok](docs/guide.md#the-resource) [bad](docs/guide.md#the-resources) "
                                  "[self](#top) [self-bad](#nowhere)\n\n# Top\n",
                     "docs/guide.md": "# Guide\n\n## The resource\n"})
    assert found(tmp_path) == [("README.md", 1, "#nowhere"), ("README.md", 1, "docs/guide.md#the-resources")]


def test_a_link_leaving_the_repository_or_absolute_is_broken_and_urls_are_not_checked(tmp_path):
    root = write(tmp_path / "repo", {"README.md": "[out](../shared/x.md) [abs](/docs/a.md) "
                                                  "[web](https://example.com/x#y) [mail](mailto:a@b.c)\n"})
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "x.md").write_text("# X\n")   # exists, but outside the repository
    assert found(root) == [("README.md", 1, "../shared/x.md"), ("README.md", 1, "/docs/a.md")]


def test_code_is_not_a_link_but_reference_definitions_and_images_are(tmp_path):
    write(tmp_path, {"README.md": "```md\n[in a fence](missing1.md)\n```\n"
                                  "`[inline](missing2.md)`\n\n"
                                  "![plot](missing3.png)\n\n[ref]: missing4.md\n"})
    assert found(tmp_path) == [("README.md", 6, "missing3.png"), ("README.md", 8, "missing4.md")]


def test_an_anchor_into_a_file_that_is_not_markdown_is_broken(tmp_path):
    write(tmp_path, {"README.md": "[code](job.py#L3)\n", "job.py": "x = 1\n"})
    assert found(tmp_path) == [("README.md", 1, "job.py#L3")]


@pytest.mark.parametrize("heading, anchor", [
    ("## The resource", "the-resource"),
    ("### `kubectl eos`", "kubectl-eos"),
    ("## Monitoring bundle: ServiceMonitor, alerts, dashboard", "monitoring-bundle-servicemonitor-alerts-dashboard"),
    ("### A batch is its input, not its number", "a-batch-is-its-input-not-its-number"),
    ("### The image, built here (`make image`)", "the-image-built-here-make-image"),
    ("## Slots from the source's partitions", "slots-from-the-sources-partitions"),
    ("## Chaos: what each kill hit", "chaos-what-each-kill-hit"),
    ("## `make test` runs, newest first", "make-test-runs-newest-first"),
    ("## snake_case and **bold** [linked](x.md)", "snake_case-and-bold-linked"),
    ("## Exactly–once ≠ at-least-once", "exactlyonce--at-least-once"),
])
def test_headings_get_githubs_anchors(heading, anchor):
    assert anchor in anchors(heading + "\n")


def test_a_repeated_heading_gets_a_numbered_anchor_and_html_ids_count():
    text = "# Results\n\n## Results\n\n## Results\n\n<a id=\"kept\"></a>\n\n```\n# not a heading\n```\n"
    assert anchors(text) == {"results", "results-1", "results-2", "kept"}


def test_slug_drops_punctuation_and_keeps_letters_of_any_script():
    assert slug("Ça va? Oui!") == "ça-va-oui"

