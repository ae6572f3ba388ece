"""An offline link checker for the repository's Markdown: every relative link resolves to a file or folder of the
repository, and every ``#anchor`` to a heading of its target (GitHub's slugs) or an HTML ``id``/``name``.

Links in fenced code blocks and inline code are not links. Absolute URLs (``https:``, ``mailto:``, ...) are not
checked: no network. A link that leaves the repository is broken: a reader of a clone cannot follow it.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

# The pages the checker covers (issue 31), as globs relative to the repository root.
PAGES = ("README.md", "docs/*.md", "charts/**/README.md", "CHANGELOG.md", "SECURITY.md", "benchmarks/README.md")

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)
# [text](target) and ![alt](target); the target may be <...> and may carry a "title".
INLINE_LINK = re.compile(r"\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)", re.M)
HTML_ID = re.compile(r"<[a-zA-Z][^>]*\s(?:id|name)\s*=\s*[\"']([^\"']+)[\"']")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


@dataclass(frozen=True)
class Broken:
    page: str      # the page, relative to the repository root
    line: int
    target: str    # the link as written
    why: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.target}: {self.why}"


def _blank(match: re.Match) -> str:
    # Keep the length and the newlines, so offsets still give line numbers.
    return re.sub(r"[^\n]", " ", match.group(0))


def unfenced(text: str) -> str:
    """The text with fenced code blocks blanked out (same length, same lines)."""
    out, fence = [], None
    for line in text.split("\n"):
        opened = FENCE.match(line)
        if fence is None and opened:
            fence = opened.group(1)[0] * len(opened.group(1))
            out.append(" " * len(line))
        elif fence is not None:
            if line.strip().startswith(fence) and set(line.strip()) <= {fence[0]}:
                fence = None
            out.append(" " * len(line))
        else:
            out.append(line)
    return "\n".join(out)


def prose(text: str) -> str:
    """The text with fenced code blocks and inline code blanked out (same length, same lines)."""
    return INLINE_CODE.sub(_blank, unfenced(text))


def heading_text(raw: str) -> str:
    """A heading's text as GitHub renders it: inline code's content kept, links and images by their text,
    emphasis markers and HTML tags dropped."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    text = re.sub(r"<[^>]+>", "", text)
    text = text.replace("`", "")
    return re.sub(r"(\*+|(?<!\w)_+|_+(?!\w))", "", text)


def slug(text: str) -> str:
    """GitHub's anchor of a heading (github-slugger): lower case; letters, marks, digits, connector punctuation
    (``_``), spaces and hyphens kept, everything else dropped; each space becomes a hyphen."""
    kept = []
    for ch in text.lower():
        category = unicodedata.category(ch)
        if ch in " -" or category[0] in "LMN" or category == "Pc":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a page has: its headings' slugs (a repeated slug gets -1, -2, ...) and HTML ids."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in unfenced(text).split("\n"):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(heading_text(match.group(2)))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    found.update(HTML_ID.findall(text))
    return found


def links(text: str) -> list[tuple[int, str]]:
    """(line, target) of every inline link, image and reference definition outside code."""
    clean = prose(text)
    out = []
    for pattern in (INLINE_LINK, REFERENCE_DEF):
        for match in pattern.finditer(clean):
            target = match.group(1)
            if target.startswith("<") and target.endswith(">"):
                target = target[1:-1]
            out.append((clean.count("\n", 0, match.start(1)) + 1, target))
    return sorted(out)


def check_page(page: Path, root: Path) -> list[Broken]:
    root = root.resolve()
    text = page.read_text(encoding="utf-8")
    name = page.resolve().relative_to(root).as_posix()
    broken = []
    for line, target in links(text):
        if SCHEME.match(target) or target.startswith("//"):
            continue
        path_part, _, anchor = target.partition("#")
        path_part = path_part.split("?", 1)[0]
        if path_part.startswith("/"):
            broken.append(Broken(name, line, target, "an absolute path: GitHub resolves it against the site, "
                                 "not the repository; write it relative to this page"))
            continue
        dest = (page.parent / path_part).resolve() if path_part else page.resolve()
        if dest != root and root not in dest.parents:
            broken.append(Broken(name, line, target, "leaves the repository: a reader of a clone cannot follow "
                                 "it; name the file in code instead of linking it"))
            continue
        if not dest.exists():
            broken.append(Broken(name, line, target, f"no such file: {dest.relative_to(root).as_posix()}"))
            continue
        if anchor:
            if dest.is_dir() or dest.suffix.lower() not in (".md", ".markdown"):
                broken.append(Broken(name, line, target, "an anchor into something that is not a Markdown page"))
            elif anchor not in anchors(dest.read_text(encoding="utf-8")):
                broken.append(Broken(name, line, target, f"no heading in {dest.relative_to(root).as_posix()} "
                                     f"has the anchor #{anchor}"))
    return broken


def pages(root: Path, globs=PAGES) -> list[Path]:
    found: dict[Path, None] = {}
    for pattern in globs:
        for path in sorted(root.glob(pattern)):
            if path.is_file():
                found[path] = None
    return list(found)


def check(root: Path, globs=PAGES) -> list[Broken]:
    return [broken for page in pages(root, globs) for broken in check_page(page, root)]
