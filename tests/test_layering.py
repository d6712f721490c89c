"""The package's layering (docs/architecture.md, "Layers"), checked on the source: every
import in capsnet/, at the top of a file or inside a function, goes to the same part or a
lower layer, and no chain of imports between files comes back to where it started."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "capsnet"

# Each top-level module or subpackage of capsnet by layer, lowest first; a part imports only
# from its own files and from parts of lower layers. "capsnet" is the package's __init__.
LAYERS = [
    ["config", "atomic", "squashing", "extras"],  # leaves
    ["routing", "data", "devices", "losses", "writers"],
    ["layers"],
    ["models"],  # assemblies and their registry
    ["checkpoint", "tuning", "preprocess", "routing_trace", "attacks"],
    ["pretrained", "inference", "training", "export"],
    ["experiments"],
    ["figures"],
    ["capsnet"],  # the package's public names
    ["web"],
    ["cli"],
    ["__main__"],
]
LAYER_OF = {part: rank for rank, parts in enumerate(LAYERS) for part in parts}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def part_of(module: str) -> str:
    """'capsnet.models.base' -> 'models'; 'capsnet' -> 'capsnet'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "capsnet"


def is_module(name: str) -> bool:
    relative = Path(*name.split(".")[1:]) if "." in name else Path()
    return (PACKAGE / relative).with_suffix(".py").is_file() or (
        PACKAGE / relative / "__init__.py").is_file()


def imports_of(path: Path) -> set[str]:
    """Every capsnet module ``path`` imports, anywhere in the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:  # `from capsnet.models import capsnet` names a module
                sub = f"{node.module}.{alias.name}"
                found.add(sub if is_module(sub) else node.module)
    return {name for name in found if name == "capsnet" or name.startswith("capsnet.")}


GRAPH = {module_name(path): imports_of(path) for path in PACKAGE.rglob("*.py")}


def test_every_part_has_a_layer():
    assert {part_of(module) for module in GRAPH} <= set(LAYER_OF)


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_no_upward_import(module):
    here = part_of(module)
    upward = [name for name in sorted(GRAPH[module])
              if part_of(name) != here and LAYER_OF[part_of(name)] >= LAYER_OF[here]]
    assert not upward, f"{module} (layer {LAYER_OF[here]}) imports {upward} from its layer or above"


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One chain a -> b -> ... -> a in ``graph``, or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for child in sorted(graph.get(node, ())):
            if state.get(child) == "open":
                return stack[stack.index(child):] + [child]
            if child not in state and (cycle := visit(child)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_circle():
    assert find_cycle(GRAPH) is None, " -> ".join(find_cycle(GRAPH))


def test_the_checks_can_fail():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert part_of("capsnet.models.base") == "models" and LAYER_OF["config"] == 0
    assert imports_of(PACKAGE / "config.py") == set()  # the leaf
