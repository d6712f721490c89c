"""Optional dependencies: a missing one is a one-line error that gives the install command,
e.g. ``capsnet: error: the web demo needs Flask: pip install "capsnet[web]"``."""
from __future__ import annotations

import importlib
from typing import NamedTuple


class Extra(NamedTuple):
    """One optional dependency: module, package name, ``capsnet[...]`` extra, what needs it."""

    module: str
    package: str
    extra: str
    needed_by: str


# one entry per extra whose absence a user can meet at run time (pyproject.toml's extras)
EXTRAS = {
    "web": Extra("flask", "Flask", "web", "the web demo"),
    "plot": Extra("matplotlib", "matplotlib", "plot", "drawing figures"),
}


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message is one line with the command."""


def install_hint(name: str) -> str:
    """'<what> needs <package>: pip install "capsnet[<extra>]"' for the extra ``name``."""
    if name not in EXTRAS:
        raise ValueError(f"unknown extra {name!r}; choose from {', '.join(EXTRAS)}")
    extra = EXTRAS[name]
    return f'{extra.needed_by} needs {extra.package}: pip install "capsnet[{extra.extra}]"'


def require_extra(name: str) -> None:
    """Import the extra ``name``'s module, or raise :class:`MissingExtraError`."""
    hint = install_hint(name)
    try:
        importlib.import_module(EXTRAS[name].module)
    except ImportError as exc:
        raise MissingExtraError(hint) from exc
