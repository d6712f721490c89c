"""Files that appear whole or not at all: every file capsnet writes goes through here.

A file is written under a temporary name beside its real one and renamed over it only
when complete, so an interrupted write (a crash, Ctrl-C, a full disk) never leaves a
half-written file under the real name. A leaf: imports nothing from the package.
"""
from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path beside ``path`` (its folder made if missing) to write to; renamed
    over ``path`` when the block ends cleanly, removed when it raises."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # the permissions open() would give, not mkstemp's 0600
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def atomic_write(path: str | os.PathLike, write: Callable[[IO[Any]], Any],
                 mode: str = "wb") -> None:
    """Call ``write(file)`` on a file opened with ``mode`` ('wb' or 'w'), flushed to disk,
    that appears as ``path`` only once written."""
    with atomic_path(path) as tmp, open(tmp, mode) as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def write_text(path: str | os.PathLike, text: str) -> None:
    """``text`` as the whole of the file ``path``, atomically."""
    atomic_write(path, lambda f: f.write(text), mode="w")


def append_text(path: str | os.PathLike, text: str) -> None:
    """The file ``path`` with ``text`` added at its end, atomically: rewritten whole, so
    that an interrupted write never leaves half a line (for small files: logs, tables)."""
    path = Path(path)
    write_text(path, (path.read_text() if path.exists() else "") + text)


def write_json(path: str | os.PathLike, values: Any) -> None:
    """``values`` as indented JSON, atomically: the package's one JSON writer."""
    write_text(path, json.dumps(values, indent=2) + "\n")
