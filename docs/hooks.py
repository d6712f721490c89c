"""MkDocs hook (mkdocs.yml ``hooks``): the pages are written to be read on the repository,
where a link may leave docs/ (``../README.md``). On the site the README's place is taken by
index.md, so a link to the README goes there; a link to any other file outside docs/ (not
part of the site) is kept as its text. Links inside docs/ are left alone, for
``mkdocs build --strict`` to check."""
from __future__ import annotations

import posixpath
import re

# [text](target) and ![alt](target); the target up to whitespace or ')'
LINK = re.compile(r"(?P<bang>!?)\[(?P<text>(?:[^\[\]]|\[[^\[\]]*\])*)\]\((?P<target>[^)\s]+)\)")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...
README = "README.md"
SITE_HOME = "index.md"


def outside_target(page_path: str, target: str) -> str | None:
    """The path relative to the repository root of a link that leaves docs/, else None."""
    if EXTERNAL.match(target) or target.startswith("#"):
        return None
    path = target.split("#", 1)[0]
    resolved = posixpath.normpath(posixpath.join("docs", posixpath.dirname(page_path), path))
    return None if resolved.startswith("docs/") else resolved


def rewrite_link(match: re.Match, page_path: str) -> str:
    target = outside_target(page_path, match["target"])
    if target is None:
        return match[0]
    if target == README and not match["bang"]:
        home = posixpath.relpath(SITE_HOME, posixpath.dirname(page_path) or ".")
        return f"[{match['text']}]({home})"
    return match["text"]


def on_page_markdown(markdown: str, page, config, files) -> str:
    return LINK.sub(lambda m: rewrite_link(m, page.file.src_uri), markdown)
