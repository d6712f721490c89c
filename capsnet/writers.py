"""The one Markdown table writer and the one JSON file writer of capsnet's results; imports
nothing from the package but :mod:`capsnet.atomic`."""
from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence

from capsnet.atomic import atomic_write

JSON_INDENT = 2


def markdown_table(head: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A Markdown table: the ``head`` line, its rule, a line per row (each cell ``str``-ed)."""
    lines = [head, ["---"] * len(head), *rows]
    return "\n".join("| " + " | ".join(map(str, cells)) + " |" for cells in lines)


def write_json(path: str | os.PathLike, values: object) -> None:
    """``values`` as indented JSON (and a final newline) in ``path``, written atomically."""
    atomic_write(path, lambda f: f.write(json.dumps(values, indent=JSON_INDENT) + "\n"),
                 mode="w")
