"""benchmarks/make_data.py: class folders from the fake MNIST (resized, painted) that the folder
loader reads back with the same labels; a seeded study set; own digits made and scored."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from benchmarks import make_data
from capsnet.data.datasets import load_split


def test_folder_names_are_safe_for_file_systems():
    assert make_data.folder_name("T-shirt/top") == "T-shirt_top"
    assert make_data.folder_name("Ankle boot") == "Ankle_boot"
    assert make_data.folder_name("//") == "class"


def test_colour_folders_hold_the_idx_labels(tiny_mnist_dir, tmp_path):
    out = tmp_path / "folders"
    assert make_data.main(["folders", "--dataset", "mnist", "--data-dir", str(tiny_mnist_dir),
                           "--out", str(out), "--size", "32", "--colour", "--limit", "40"]) == 0
    source = load_split("mnist", "train", str(tiny_mnist_dir), download=False)
    written = load_split("folder", "train", str(out))
    assert written.classes == source.classes and len(written.labels) == 40
    assert Counter(written.labels.tolist()) == Counter(source.labels[:40].tolist())
    first = np.asarray(Image.open(next((out / "train").glob("*/00000.png"))))
    assert first.shape == (32, 32, 3)
    grounds = {tuple(np.asarray(Image.open(p))[0, 0]) for p in (out / "test").glob("*/*.png")}
    assert len(grounds) > 10  # a colour per image, not per class


def test_study_set_is_seeded(tiny_mnist_dir, tmp_path):
    for copy in ("a", "b"):
        make_data.write_study_set("textured", tmp_path / copy, str(tiny_mnist_dir), seed=0)
    files = sorted((tmp_path / "a" / "textured" / "test").glob("*/*.png"))
    assert len(files) == 200 and Image.open(files[0]).size == (32, 32)  # the fake test split
    twin = tmp_path / "b" / "textured" / "test" / files[0].relative_to(
        tmp_path / "a" / "textured" / "test")
    assert files[0].read_bytes() == twin.read_bytes()


@pytest.mark.skipif(not any(d.is_dir() for d in make_data.FONT_DIRS), reason="no fonts")
def test_own_digits_are_made_and_scored(tmp_path, capsys):
    out = tmp_path / "digits"
    assert make_data.main(["own-digits", "--out", str(out), "--per-digit", "2"]) == 0
    files = sorted(p.name for p in out.iterdir())
    assert len(files) == 20 and {f[0] for f in files} == set("0123456789")
    predictions = [{"source": str(out / f), "digit": int(f[0]), "length": 0.9} for f in files]
    predictions[0]["digit"] = (predictions[0]["digit"] + 1) % 10
    (tmp_path / "own.json").write_text(json.dumps(predictions))
    assert make_data.score(tmp_path / "own.json") == pytest.approx(19 / 20)
    assert f"{Path(files[0]).name}: predicted" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["translated-60", "cluttered-60", "numbers-100"])
def test_bigger_sets_place_their_items_and_label_pairs(name):
    """Translated and cluttered digits keep the whole item on the canvas; a pair's label is
    10 x first + second, its class named by the two digits."""
    spec = make_data.STUDY_SETS[name]
    rng = np.random.default_rng(0)
    items = [np.full((28, 28), 10 * (k + 1), np.uint8) for k in range(4)]  # four flat items
    labels = np.array([1, 2, 3, 4])
    pictures, classes = make_data.study_pictures(items, labels, [str(k) for k in range(10)],
                                                 spec, rng)
    pictures = list(pictures)
    assert all(p.shape == (spec.size(rng),) * 2 for p, _ in pictures)
    if name == "numbers-100":
        assert len(classes) == 100 and classes[42] == "42"
        for picture, label in pictures:  # both items' values appear, in label order
            first, second = divmod(label, 10)
            assert {10 * first, 10 * second} <= set(np.unique(picture).tolist())
    else:
        for (picture, label), item in zip(pictures, items, strict=True):
            assert label in labels and (picture == item[0, 0]).sum() >= 28 * 28 - (
                make_data.CLUTTER_PIECES * make_data.CLUTTER_SIDE ** 2 if "clutter" in name
                else 0)
