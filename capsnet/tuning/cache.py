"""Measured choices cached per machine in the user cache directory, so later runs start at once.

One JSON file maps a key (a hash of what the choice depends on) to its entry. Writes are
atomic; an unreadable file counts as empty and is rewritten.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from capsnet.atomic import atomic_write
from capsnet.data.sources import default_cache_dir

CACHE_FILE = "speed-plans.json"


def cache_path() -> Path:
    return default_cache_dir() / CACHE_FILE


def cache_key(what: dict) -> str:
    """A stable key for a JSON-serialisable description."""
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:24]


def _read_all(path: Path) -> dict:
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


def read_entry(key: str, path: Path | None = None) -> dict | None:
    entry = _read_all(path or cache_path()).get(key)
    return entry if isinstance(entry, dict) else None


def write_entry(key: str, entry: dict, path: Path | None = None) -> Path:
    """Add or replace one entry; returns the cache file's path. Failing to write (a
    read-only home, say) is no error: the choice is then measured again next time."""
    path = path or cache_path()
    entries = _read_all(path)
    entries[key] = entry
    try:
        atomic_write(path, lambda f: json.dump(entries, f, indent=1, sort_keys=True), mode="w")
    except OSError:
        pass
    return path
