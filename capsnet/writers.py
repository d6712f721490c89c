"""The one Markdown table writer of capsnet's results (the one JSON writer is
:func:`capsnet.atomic.write_json`); a leaf module."""
from __future__ import annotations

from collections.abc import Iterable, Sequence


def markdown_table(head: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A Markdown table: the ``head`` line, its rule, a line per row (each cell ``str``-ed)."""
    lines = [head, ["---"] * len(head), *rows]
    return "\n".join("| " + " | ".join(map(str, cells)) + " |" for cells in lines)
