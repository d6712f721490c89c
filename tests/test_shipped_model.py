"""The trained CapsNet that ships with capsnet reaches the test accuracy the README states."""
import re
from pathlib import Path

import pytest

from capsnet.checkpoint import DEFAULT_WEIGHTS, load_model, weights_info
from capsnet.data.datasets import load_split
from capsnet.training.loop import evaluate

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


@pytest.mark.slow
def test_shipped_model_reaches_the_stated_accuracy(mnist_dir):
    if not DEFAULT_WEIGHTS.is_file():
        pytest.fail(f"{DEFAULT_WEIGHTS} is missing: the package must ship a trained model")
    assert DEFAULT_WEIGHTS.stat().st_size < 40 * 2**20  # compact: float16
    model = load_model()  # the default: the shipped weights
    assert weights_info(DEFAULT_WEIGHTS)["model"] == "capsnet"
    test = load_split("mnist", "test", mnist_dir, download=False)
    result = evaluate(model, test.images, test.labels)
    # one test image either way, for float rounding on other CPUs
    assert abs(result.accuracy - stated_accuracy()) <= 1 / len(test) + 1e-9
