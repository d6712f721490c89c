"""Every relative link and image in README.md and docs/*.md points to a file that exists.

A link with a fragment (`page.md#heading`) must also name a heading of that page, spelled
the way GitHub turns a heading into an anchor. Links inside code (fenced blocks, `inline`)
are text, not links, and are not checked; web addresses are not fetched.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
# [text](target) and ![alt](target), with an optional "title"; text may hold `code`
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...


def prose(text: str) -> str:
    """The text with fenced code blocks and inline code spans blanked out."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def links(text: str) -> list[str]:
    return LINK.findall(prose(text))


def github_anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces -> '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", text)):
        base = github_anchor(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(page: Path) -> list[str]:
    """'page: target (why)' for every relative link or image of `page` that does not resolve."""
    problems = []
    for target in links(page.read_text(encoding="utf-8")):
        if EXTERNAL.match(target):
            continue
        path_part, _, fragment = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        name = page.relative_to(REPO) if page.is_relative_to(REPO) else page
        if not dest.exists():
            problems.append(f"{name}: {target} (no such file)")
        elif fragment and dest.suffix == ".md":
            if fragment not in anchors(dest.read_text(encoding="utf-8")):
                problems.append(f"{name}: {target} (no heading #{fragment} in {dest.name})")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_image_resolves(page):
    assert broken_links(page) == []


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(REPO / t.partition("#")[0]).resolve()
              for t in links((REPO / "README.md").read_text(encoding="utf-8"))
              if not EXTERNAL.match(t)}
    orphans = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert orphans == []


def test_the_check_finds_links_and_catches_broken_ones(tmp_path):
    (tmp_path / "there.png").write_bytes(b"")
    (tmp_path / "other.md").write_text("# A page\n\n## `capsnet predict`: photos, scans\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n"
        "![fine](there.png) [fine](other.md#capsnet-predict-photos-scans) [web](https://x.org/y)\n"
        "![gone](missing.png) and [gone too](sub/none.md), [bad anchor](other.md#nowhere)\n"
        "[here](#title) [not here](#elsewhere)\n"
        "`[in code](nothing.md)`\n\n```\n[in a block](nothing.md)\n```\n"
    )
    assert len(links(page.read_text())) == 8
    assert sorted(p.split(": ", 1)[1] for p in broken_links(page)) == [
        "#elsewhere (no heading #elsewhere in page.md)",
        "missing.png (no such file)",
        "other.md#nowhere (no heading #nowhere in other.md)",
        "sub/none.md (no such file)",
    ]
