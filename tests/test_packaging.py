"""The package as installed: true dependency floors, optional Flask and matplotlib with a
one-line install hint, the files shipped beside the code, one version everywhere."""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import capsnet
from capsnet.extras import EXTRAS, MissingExtraError, install_hint, require_extra

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]
OPTIONAL = PROJECT["optional-dependencies"]
REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?\s*(?:>=\s*([0-9.]+))?")

# What the code calls -> the first release that has it. A floor below one of these is untrue.
FLOOR_FACTS = [
    ("torch", re.compile(r"torch\.get_autocast_dtype\("), (2, 4)),
    ("torch", re.compile(r"torch\.is_autocast_enabled\(\s*\""), (2, 4)),
    ("torch", re.compile(r"torch\.amp\.GradScaler\("), (2, 3)),
    ("torch", re.compile(r"torch\.onnx\.export\([^\n]*dynamo="), (2, 5)),
    ("pillow", re.compile(r"Image\.Resampling\."), (9, 1)),
]


def requirements(entries: list[str]) -> dict[str, tuple[int, ...] | None]:
    """{lower-case name: floor as a tuple, or None without one} of requirement strings."""
    out = {}
    for entry in entries:
        name, floor = REQUIREMENT.match(entry).groups()
        out[name.lower()] = tuple(int(x) for x in floor.split(".")) if floor else None
    return out


CORE = requirements(PROJECT["dependencies"])


def library_source() -> str:
    return "\n".join(path.read_text(encoding="utf-8")
                     for path in sorted((REPO / "capsnet").rglob("*.py")))


@pytest.mark.parametrize("package,call,version", FLOOR_FACTS,
                         ids=[f"{p}:{c.pattern}" for p, c, _ in FLOOR_FACTS])
def test_declared_floors_are_true(package, call, version):
    if not call.search(library_source()):
        pytest.skip(f"the code no longer calls {call.pattern}")
    floor = CORE.get(package)
    assert floor is not None and floor >= version, (
        f"capsnet calls {call.pattern}, first in {package} {'.'.join(map(str, version))}; "
        f"pyproject.toml declares {package} {floor}")


def test_flask_and_matplotlib_are_extras_not_dependencies():
    assert "flask" not in CORE and "matplotlib" not in CORE
    for name, extra in EXTRAS.items():
        assert extra.extra == name
        assert extra.package.lower() in requirements(OPTIONAL[name]), (
            f"capsnet[{name}] must install {extra.package}")


def test_the_test_extra_brings_everything_ci_needs():
    """pip install -e ".[test]" installs every other extra (the web app, figures, export,
    datasets, the documentation build and the notebook runner) and the test tools."""
    test = OPTIONAL["test"]
    self_reference = [entry for entry in test if entry.startswith("capsnet[")]
    assert len(self_reference) == 1
    included = set(re.search(r"\[(.*)\]", self_reference[0])[1].split(","))
    assert included == set(OPTIONAL) - {"test"}
    assert {"pytest", "ruff"} <= set(requirements(test))


def test_install_hint_names_the_extra():
    assert install_hint("web") == 'the web demo needs Flask: pip install "capsnet[web]"'
    assert install_hint("plot") == 'drawing figures needs matplotlib: pip install "capsnet[plot]"'
    with pytest.raises(ValueError, match="unknown extra 'gui'; choose from web, plot"):
        install_hint("gui")


def test_require_extra_raises_the_hint_when_the_module_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "flask", None)  # import flask -> ImportError
    with pytest.raises(MissingExtraError, match=re.escape('pip install "capsnet[web]"')):
        require_extra("web")
    assert issubclass(MissingExtraError, ImportError)


BLOCKED_RUN = textwrap.dedent("""
    import sys
    for name in ("flask", "matplotlib"):
        sys.modules[name] = None  # as if not installed: importing them raises ImportError
    import capsnet
    from capsnet.cli.main import build_parser, main
    build_parser()
    assert not {"flask", "matplotlib"} & {m.split(".")[0] for m in sys.modules
                                          if sys.modules[m] is not None}
    print("serve", main(["serve", "--port", "0"]))
    print("plot", main(["plot", "nowhere"]))
    print("predict", main(["predict", sys.argv[1], "--precision", "fp32", "--conv-impl", "native"]))
""")


def test_without_flask_and_matplotlib_the_commands_say_what_to_install(tmp_path):
    """`import capsnet` and `capsnet predict` need neither; `capsnet serve` and the figure
    commands end with one line that gives the install command, and exit 1."""
    from PIL import Image, ImageDraw

    image = Image.new("L", (60, 60), 255)
    ImageDraw.Draw(image).line([(15, 10), (45, 10), (25, 50)], fill=0, width=5)  # a 7
    image.save(tmp_path / "seven.png")
    done = subprocess.run([sys.executable, "-c", BLOCKED_RUN, str(tmp_path / "seven.png")],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == ["serve 1", "plot 1"] and lines[-1] == "predict 0", done.stdout
    assert done.stderr.splitlines()[:2] == [
        'capsnet: error: the web demo needs Flask: pip install "capsnet[web]"',
        'capsnet: error: drawing figures needs matplotlib: pip install "capsnet[plot]"']
    assert re.match(r".*seven\.png: 7 ", lines[2]), done.stdout


def test_py_typed_ships_with_the_package():
    assert (REPO / "capsnet" / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["capsnet"]


def test_one_version_in_the_package_the_changelog_and_the_citation():
    version = capsnet.__version__
    assert re.search(rf"^## \[{re.escape(version)}\] - \d{{4}}-\d{{2}}-\d{{2}}$",
                     (REPO / "CHANGELOG.md").read_text(encoding="utf-8"), re.MULTILINE), (
        f"CHANGELOG.md needs a '## [{version}] - YYYY-MM-DD' section")
    citation = (REPO / "CITATION.cff").read_text(encoding="utf-8")
    assert re.search(rf"^version: {re.escape(version)}$", citation, re.MULTILINE)
    assert "Dynamic Routing Between Capsules" in citation


def test_every_docs_page_is_in_the_site_nav():
    """mkdocs build --strict (CI) fails on a page missing from mkdocs.yml's nav: caught here
    first, in a second."""
    config = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    in_nav = set(re.findall(r"^\s+- (?:[^:\n]+: )?(\S+\.md)\s*$", config, re.MULTILINE))
    pages = {path.name for path in (REPO / "docs").glob("*.md")}
    assert pages - in_nav == set(), "add these docs pages to the nav in mkdocs.yml"
