"""The classes of a model, by name: how they are listed, printed and chosen on the command
line. Reads any config with ``num_classes`` and ``class_names`` (capsnet.config)."""
from __future__ import annotations

from collections.abc import Sequence


def class_names(config) -> list[str]:
    """The classes' names in index order: the config's, else "0", "1", ..."""
    return list(config.class_names) or [str(i) for i in range(config.num_classes)]


def label_of(config, index: int) -> str:
    """How class ``index`` is named in text: "7" for digits named by their index, else the
    name with the index, "Sneaker (7)"."""
    return indexed_name(class_names(config), index)


def indexed_name(names: Sequence[str], index: int) -> str:
    """names[index], followed by " (index)" unless the name is the index itself."""
    name = names[index]
    return name if name == str(index) else f"{name} ({index})"


def class_index(config, text: str) -> int:
    """A class named on the command line, by index ("7") or by name ("Sneaker"), -> its
    index; ValueError naming the classes when there is no such class."""
    names = class_names(config)
    if text in names:
        return names.index(text)
    if text.lstrip("-").isdigit() and 0 <= int(text) < len(names):
        return int(text)
    named = any(name != str(j) for j, name in enumerate(names))
    listed = f" ({', '.join(f'{j}={n}' for j, n in enumerate(names))})" if named else ""
    raise ValueError(f"no class {text!r}: the model's classes are 0..{len(names) - 1}{listed}")
