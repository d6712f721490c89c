"""The trained CapsNet that ships with capsnet reaches the test accuracy the README states."""
import re
from pathlib import Path

from capsnet.checkpoint import DEFAULT_WEIGHTS, weights_info
from capsnet.pretrained import PRETRAINED

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
RESULTS = REPO / "docs" / "results.md"
STATED = re.compile(r"shipped model[^*]*\*\*(\d+\.\d+)% test accuracy\*\*")


def stated_accuracy(page: Path = README) -> float:
    match = STATED.search(page.read_text())
    assert match, (f"{page.name} must state the shipped model's accuracy as "
                   "'**NN.NN% test accuracy**'")
    return float(match.group(1)) / 100


def test_the_readme_and_the_results_page_state_one_accuracy():
    assert stated_accuracy(README) == stated_accuracy(RESULTS)


def test_the_stated_accuracy_is_the_one_its_pretrained_entry_is_tested_for():
    """tests/test_pretrained.py evaluates the shipped weights on the full test set against
    PRETRAINED["capsnet"]; here the README states that same figure."""
    assert DEFAULT_WEIGHTS.is_file(), f"{DEFAULT_WEIGHTS}: the package must ship a trained model"
    assert DEFAULT_WEIGHTS.stat().st_size < 40 * 2**20  # compact: float16
    assert weights_info(DEFAULT_WEIGHTS)["model"] == "capsnet"
    assert PRETRAINED["capsnet"].file == DEFAULT_WEIGHTS.name
    assert stated_accuracy() == PRETRAINED["capsnet"].test_accuracy
