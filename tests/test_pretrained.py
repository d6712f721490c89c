"""Pretrained weights: every table row's file is there with its SHA-256 and scores its figure;
a damaged or missing file is one line naming it."""
import re
import shutil
from pathlib import Path

import pytest
import torch

from capsnet import create_model
from capsnet.checkpoint import load_model, weights_info
from capsnet.data.datasets import load_split
from capsnet.pretrained import (
    PRETRAINED,
    Pretrained,
    PretrainedError,
    cache_dir,
    file_sha256,
    load_pretrained,
    pretrained_names,
    weights_path,
)
from capsnet.training.loop import evaluate

MEASURED = [name for name, entry in PRETRAINED.items() if entry.test_accuracy is not None]
README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.parametrize("name", MEASURED)
def test_the_readme_states_each_pretrained_models_figure(name):
    """The README's pretrained table: one row per name, its accuracy the one tested below."""
    row = re.search(rf"^\| `{re.escape(name)}` \|.*?\*\*(\d+\.\d+)%\*\*", README.read_text(),
                    re.MULTILINE)
    assert row, f"README.md has no pretrained row for {name!r}"
    assert float(row.group(1)) / 100 == PRETRAINED[name].test_accuracy


@pytest.mark.parametrize("name", pretrained_names())
def test_every_weights_file_is_there_with_its_checksum_and_model(name):
    path = weights_path(name)
    assert path.is_file(), f"{path} is missing"
    assert file_sha256(path) == PRETRAINED[name].sha256
    assert weights_info(path)["model"] == name.partition("-")[0]  # 'em-small' holds an 'em'


def test_the_shipped_capsnet_loads_in_eval_mode_as_load_model_gives_it():
    model = load_pretrained("capsnet")
    assert not model.training
    x = torch.rand(2, 1, 28, 28)
    torch.testing.assert_close(model(x).scores, load_model()(x).scores, rtol=0, atol=0)


@pytest.mark.parametrize("name", pretrained_names())
def test_the_readmes_python_lines_work_for_every_pretrained_name(name):
    import capsnet

    model = capsnet.create_model(name, pretrained=True)
    cfg = model.config
    images = torch.rand(2, cfg.in_channels, cfg.image_size, cfg.image_size)
    out = model(images)
    assert out.scores.shape == (2, cfg.num_classes)
    assert torch.equal(capsnet.class_scores(out), out.scores)
    assert out.reconstructions is None or out.reconstructions.shape == images.shape
    assert len(capsnet.predict(images, model=model)) == 2


def test_an_unknown_name_lists_the_choices():
    with pytest.raises(PretrainedError, match="no pretrained weights named 'nope'; choose from "
                                              "capsnet"):
        load_pretrained("nope")


@pytest.fixture
def cached_copy(monkeypatch):
    """A row 'copy' for a file not shipped: the CapsNet weights copied into the user cache."""
    shipped = weights_path("capsnet")
    monkeypatch.setitem(PRETRAINED, "copy", Pretrained(
        "copy.safetensors", PRETRAINED["capsnet"].sha256, None, "mnist", "cp"))
    cache_dir().mkdir(parents=True, exist_ok=True)
    target = cache_dir() / "copy.safetensors"
    shutil.copyfile(shipped, target)
    yield target
    target.unlink(missing_ok=True)


def test_weights_not_shipped_are_read_from_the_user_cache(cached_copy):
    assert weights_path("copy") == cached_copy
    assert "copy" in pretrained_names()
    assert not load_pretrained("copy").training


def test_a_damaged_file_is_one_line_naming_it(cached_copy):
    data = bytearray(cached_copy.read_bytes())
    data[-1] ^= 0xFF
    cached_copy.write_bytes(bytes(data))
    with pytest.raises(PretrainedError, match=r"copy\.safetensors: SHA-256 .* is not the "
                                              r"expected .*replace it") as error:
        load_pretrained("copy")
    assert "\n" not in str(error.value)


def test_a_missing_file_is_one_line_saying_where_to_put_it(cached_copy):
    cached_copy.unlink()
    with pytest.raises(PretrainedError, match=r"copy\.safetensors: the 'copy' weights are "
                                              r"neither in the package .* put the file there"):
        load_pretrained("copy")


@pytest.mark.slow
@pytest.mark.parametrize("name", MEASURED)
def test_pretrained_model_scores_its_stated_test_accuracy(name, mnist_dir):
    entry = PRETRAINED[name]
    assert entry.dataset == "mnist", "this test measures MNIST models"
    model = create_model(name, pretrained=True)
    test = load_split("mnist", "test", mnist_dir, download=False)
    result = evaluate(model, test.images, test.labels)
    # one test image either way, for float rounding on other CPUs
    assert abs(result.accuracy - entry.test_accuracy) <= 1 / len(test) + 1e-9
