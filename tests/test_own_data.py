"""Your own data through the whole tool: folders of images (grey or colour, any size, any
classes) trained, evaluated, predicted, drawn and exported through ``main([...])``; the
cifar10 preset; bad folders as one-line errors. Tiny generated folders, seconds each."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from capsnet.checkpoint import load_checkpoint, load_model, weights_info
from capsnet.cli.main import main
from capsnet.data import datasets
from capsnet.data.folder import decode_image_file
from capsnet.data.image_dataset import ImageDataset
from capsnet.data.model_view import fit_to_model, load_test_set
from capsnet.export import read_description
from capsnet.inference import predict
from capsnet.models import CapsNetConfig, make_config
from tests.conftest import last_error_line

FAST = ["--precision", "fp32"]
RGB_CLASSES = ["cat", "dog", "frog", "horse", "ship"]
GREY_CLASSES = ["circle", "line"]
COLOURS = [(220, 40, 40), (40, 200, 60), (50, 80, 230), (230, 210, 40), (200, 60, 210)]
PER_CLASS, TEST_PER_CLASS = 8, 2
ATOL = 1e-4


def pattern(label: int, size: tuple[int, int], colour: bool, rng) -> np.ndarray:
    """A learnable image: class k is a coloured (grey: bright) bar at row 2 + 5k on noise.
    Returns (H, W, 3) or (H, W) uint8."""
    H, W = size
    image = rng.integers(0, 40, (H, W, 3), dtype=np.uint8)  # (H, W, 3)
    top = (2 + 5 * label) % (H - 6)
    image[top:top + 5, 3:W - 3] = COLOURS[label % len(COLOURS)]
    if not colour:
        image[top:top + 5, 3:W - 3] = 255
        return image[..., 0]  # (H, W)
    return image


def make_folder(root: Path, classes, per_class: int = PER_CLASS, size=(32, 32),
                colour: bool = True, test: bool = True, seed: int = 0) -> Path:
    """root/train/<class>/<i>.png (and root/test/... with ``test``)."""
    rng = np.random.default_rng(seed)
    splits = [("train", per_class)] + ([("test", TEST_PER_CLASS)] if test else [])
    for split, count in splits:
        for label, name in enumerate(classes):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                Image.fromarray(pattern(label, size, colour, rng)).save(folder / f"{i:02d}.png")
    return root


def train_folder(data: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--dataset", "folder", "--data-dir", str(data), "--preset", "small",
            "--epochs", "1", "--batch-size", "10", "--val-size", "5", "--no-progress",
            "--out-dir", str(out), *FAST, *extra]


def is_colour_png(path: Path) -> bool:
    """True when the PNG has pixels whose channels differ (not grey drawn as RGB)."""
    with Image.open(path) as image:
        array = np.asarray(image.convert("RGB")).astype(int)  # (H, W, 3)
    return bool((np.abs(array[..., 0] - array[..., 1]) > 30).any())


@pytest.fixture(autouse=True)
def _work_in_tmp(tmp_path, monkeypatch):
    """Commands write their default outputs into a scratch directory, never the repo."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def rgb_data(tmp_path_factory) -> Path:
    return make_folder(tmp_path_factory.mktemp("rgb") / "data", RGB_CLASSES)


@pytest.fixture(scope="module")
def rgb_run(rgb_data, tmp_path_factory) -> Path:
    """The small CapsNet trained one epoch on 5 colour classes of 32x32 images (test/ given)."""
    out = tmp_path_factory.mktemp("rgb_run")
    assert main(train_folder(rgb_data, out, "--epochs", "2")) == 0
    return out


# ---- training on folders ----------------------------------------------------------------

def test_colour_folder_with_test_dir_trains_a_colour_model(rgb_run):
    payload = load_checkpoint(rgb_run / "best.pt")
    config = payload["config"]
    assert (config["in_channels"], config["image_size"], config["num_classes"]) == (3, 32, 5)
    assert list(config["class_names"]) == RGB_CLASSES and config["dataset"] == "folder"
    assert config["uncropped_size"] is None
    results = json.loads((rgb_run / "results.json").read_text())
    assert results["complete"] and sum(map(sum, results["final"]["confusion"])) == \
        len(RGB_CLASSES) * TEST_PER_CLASS


def test_grey_two_classes_without_test_dir(tmp_path, capsys):
    data = make_folder(tmp_path / "grey", GREY_CLASSES, per_class=10, size=(28, 28),
                       colour=False, test=False)
    out = tmp_path / "run"
    assert main(train_folder(data, out, "--seed", "3")) == 0
    config = load_checkpoint(out / "best.pt")["config"]
    assert (config["in_channels"], config["num_classes"]) == (1, 2)
    assert list(config["class_names"]) == GREY_CLASSES
    # the carved test split belongs to the folder, not the run's seed: evaluate finds it again
    tested = sum(map(sum, json.loads((out / "results.json").read_text())["final"]["confusion"]))
    capsys.readouterr()
    assert main(["evaluate", str(out / "best.pt"), "--data-dir", str(data), "--json",
                 *FAST]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["images"] == tested == 2 and report["classes"] == GREY_CLASSES
    assert report["dataset"] == "folder"


def test_odd_sizes_resized_with_image_size(tmp_path):
    data = make_folder(tmp_path / "odd", GREY_CLASSES, size=(30, 34))
    out = tmp_path / "run"
    assert main(train_folder(data, out, "--image-size", "32")) == 0
    assert load_checkpoint(out / "best.pt")["config"]["image_size"] == 32


# ---- class names and the input spec survive every file format -------------------------------

def test_class_names_survive_checkpoint_weights_and_exports(rgb_run, tmp_path, capsys):
    model = load_model(rgb_run / "best.pt")
    assert model.config.class_names == tuple(RGB_CLASSES) and model.config.in_channels == 3
    weights = tmp_path / "model.safetensors"
    assert main(["export", str(rgb_run / "best.pt"), "--format", "safetensors",
                 "-o", str(weights)]) == 0
    assert weights_info(weights)["config"]["class_names"] == RGB_CLASSES
    assert load_model(weights).config == model.config
    for fmt, name in [("onnx", "model.onnx"), ("pt2", "model.pt2")]:
        if fmt == "onnx":
            pytest.importorskip("onnxscript")  # the ONNX exporter needs it (and onnx)
        path = tmp_path / name
        assert main(["export", str(weights), "--format", fmt, "-o", str(path)]) == 0
        info = read_description(path)
        assert info["input_shape"] == ["batch", 3, 32, 32]
        assert info["class_names"] == RGB_CLASSES and info["dataset"] == "folder"
    assert "classes cat, dog, frog, horse, ship" in capsys.readouterr().out


def test_colour_onnx_matches_pytorch(rgb_run, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")  # the ONNX exporter needs it (and onnx)
    path = tmp_path / "rgb.onnx"
    assert main(["export", str(rgb_run / "best.pt"), "-o", str(path)]) == 0
    model = load_model(rgb_run / "best.pt")
    images = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    lengths, recon = session.run(None, {"images": images.numpy()})
    with torch.no_grad():
        out = model(images)
    assert recon.shape == (3, 3, 32, 32)
    np.testing.assert_allclose(lengths, out.scores.numpy(), atol=ATOL, rtol=0)
    np.testing.assert_allclose(recon, out.reconstructions.numpy(), atol=ATOL, rtol=0)


# ---- predict -----------------------------------------------------------------------------

def test_predict_names_the_class_in_text_and_json(rgb_run, rgb_data, capsys):
    frog = rgb_data / "test" / "frog"
    capsys.readouterr()
    assert main(["predict", str(frog), "--checkpoint", str(rgb_run / "best.pt"), *FAST]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    expected = predict(sorted(frog.glob("*.png")), model=rgb_run / "best.pt")
    assert len(lines) == TEST_PER_CLASS
    for line, p in zip(lines, expected, strict=True):
        assert line.startswith(f"{p.source}: {p.class_name} ({p.index})  length {p.length:.3f}")
        assert f"then {p.name_of(p.alternatives[0][0])} ({p.alternatives[0][0]}) " in line
    assert main(["predict", str(frog / "00.png"), "--checkpoint", str(rgb_run / "best.pt"),
                 "--json", "--top-k", "2", *FAST]) == 0
    [result] = json.loads(capsys.readouterr().out)
    assert result["class"] == RGB_CLASSES[result["index"]] and result["digit"] == result["index"]
    assert len(result["lengths"]) == 5
    [other] = result["alternatives"]
    assert other["class"] == RGB_CLASSES[other["index"]] and other["digit"] == other["index"]


def test_predict_prepares_an_own_image_like_the_folder_reader(rgb_run, rgb_data, tmp_path):
    """Another size, RGBA: resized to 32x32 as the reader would, transparency onto black;
    the image comes back (H, W, 3) in the display layout."""
    model = load_model(rgb_run / "best.pt")
    source = rgb_data / "test" / "dog" / "01.png"
    same = predict(source, model=model)
    np.testing.assert_array_equal(same.image, np.moveaxis(decode_image_file(source), 0, -1))
    assert same.reconstruction.shape == (32, 32, 3) and same.reconstruction.dtype == np.uint8
    big = tmp_path / "big.png"
    with Image.open(source) as image:
        image.convert("RGBA").resize((64, 50)).save(big)
    resized = predict(big, model=model)
    expected = decode_image_file(big, (32, 32), 3)  # (3, 32, 32)
    np.testing.assert_array_equal(resized.image, np.moveaxis(expected, 0, -1))
    array = np.asarray(Image.open(source).convert("RGB"))  # (32, 32, 3)
    assert predict(array, model=model).lengths == pytest.approx(same.lengths)


# ---- evaluate and the pictures, at the model's input --------------------------------------

def test_evaluate_defaults_to_the_models_own_folder(rgb_run, rgb_data, capsys):
    capsys.readouterr()
    assert main(["evaluate", str(rgb_run / "best.pt"), "--data-dir", str(rgb_data), *FAST]) == 0
    out = capsys.readouterr().out
    assert "on folder test (10 images, precision" in out
    for name in RGB_CLASSES:
        assert f"  {name}  " in out
    assert main(["evaluate", str(rgb_run / "best.pt"), "--data-dir", str(rgb_data), "--json",
                 *FAST]) == 0
    report = json.loads(capsys.readouterr().out)
    results = json.loads((rgb_run / "results.json").read_text())
    assert report["classes"] == RGB_CLASSES
    assert report["accuracy"] == pytest.approx(results["best"]["accuracy"])


def test_evaluate_a_folder_model_without_its_folder_says_so(rgb_run, capsys):
    assert main(["evaluate", str(rgb_run / "best.pt"), *FAST]) == 1
    assert "needs its root folder" in last_error_line(capsys)


def test_evaluate_on_other_classes_is_refused(rgb_run, tmp_path, capsys):
    other = make_folder(tmp_path / "other", ["a", "b", "c", "d", "e"], per_class=2)
    assert main(["evaluate", str(rgb_run / "best.pt"), "--data-dir", str(other), *FAST]) == 1
    assert "are not the model's (cat, dog, frog, horse, ship)" in last_error_line(capsys)


@pytest.mark.slow
def test_reconstruct_manipulate_routing_draw_in_colour(rgb_run, rgb_data, tmp_path, capsys):
    ckpt, data = str(rgb_run / "best.pt"), ["--data-dir", str(rgb_data), *FAST]
    recon, manip, routing = tmp_path / "r.png", tmp_path / "m.png", tmp_path / "routing.png"
    assert main(["reconstruct", "--checkpoint", ckpt, "--count", "4", "--misclassified", "1",
                 "--out", str(recon), *data]) == 0
    assert main(["manipulate", "--checkpoint", ckpt, "--classes", "frog", "4",
                 "--out", str(manip), *data]) == 0
    assert main(["routing", "--checkpoint", ckpt, "--index", "0", "9", "--out", str(routing),
                 *data]) == 0
    own = tmp_path / "own.png"
    Image.fromarray(pattern(3, (40, 40), True, np.random.default_rng(5))).save(own)
    own_routing = tmp_path / "own-routing.png"
    assert main(["routing", "--checkpoint", ckpt, str(own), "--out", str(own_routing),
                 *FAST]) == 0
    for path in (recon, routing, own_routing):
        assert is_colour_png(path), path


def test_manipulate_names_classes_and_refuses_unknown_ones(rgb_run, rgb_data, capsys):
    ckpt, data = str(rgb_run / "best.pt"), ["--data-dir", str(rgb_data), *FAST]
    capsys.readouterr()
    assert main(["manipulate", "--checkpoint", ckpt, "--digits", "cat", "2", *data]) == 0
    assert "wrote manipulation.png: classes cat (0), frog (2), 16 dimensions" in \
        capsys.readouterr().out
    assert main(["manipulate", "--checkpoint", ckpt, "--classes", "zebra", *data]) == 1
    assert "no class 'zebra'" in last_error_line(capsys)


def test_robustness_of_a_colour_model(rgb_run, rgb_data, tmp_path, capsys):
    out = tmp_path / "robust"
    assert main(["robustness", str(rgb_run / "best.pt"), "--data-dir", str(rgb_data),
                 "--max-angle", "30", "--step", "30", "--out-dir", str(out), *FAST]) == 0
    assert "accuracy (%) on 10 folder test images" in capsys.readouterr().out
    assert is_colour_png(out / "examples.png")


# ---- the test set as a model sees it ---------------------------------------------------------

def test_fit_to_model_channels_size_crop_and_canvas():
    grey = ImageDataset(torch.randint(0, 256, (4, 28, 28), dtype=torch.uint8),
                        torch.arange(4) % 2, ("a", "b"), "mnist")
    rgb = fit_to_model(grey, CapsNetConfig(in_channels=3, image_size=32, dataset="folder"))
    assert rgb.images.shape == (4, 3, 32, 32)
    cropped = fit_to_model(rgb, CapsNetConfig(in_channels=3, image_size=24, uncropped_size=32))
    assert torch.equal(cropped.images, rgb.images[..., 4:28, 4:28])
    canvas = fit_to_model(grey, CapsNetConfig(image_size=40))  # an affNIST digit model
    assert canvas.images.shape == (4, 40, 40)
    assert torch.equal(canvas.images[:, 6:34, 6:34], grey.images)
    assert canvas.images[:, :6].sum() == 0
    fashion = fit_to_model(grey, CapsNetConfig(image_size=32, dataset="fashion-mnist"))
    assert torch.equal(fashion.images, grey.resized(32).images)  # resized, not placed


def test_load_test_set_reads_a_folder_at_the_models_size(tmp_path):
    data = make_folder(tmp_path / "odd", GREY_CLASSES, per_class=3, size=(30, 34), colour=True)
    config = CapsNetConfig(in_channels=1, image_size=20, uncropped_size=24, num_classes=2,
                           class_names=tuple(GREY_CLASSES), dataset="folder",
                           conv1_kernel=5, primary_kernel=5)
    test = load_test_set(config, data_dir=data, progress=False)
    assert test.images.shape == (2 * TEST_PER_CLASS, 1, 20, 20) and test.classes == (
        "circle", "line")
    full = decode_image_file(data / "test" / "circle" / "00.png", (24, 24), 1)  # (1, 24, 24)
    np.testing.assert_array_equal(test.images[0].numpy(), full[:, 2:22, 2:22])


# ---- the cifar10 preset ----------------------------------------------------------------------

def write_tiny_cifar(directory: Path, per_batch: int = 2) -> Path:
    """The six CIFAR-10 binary batch files with ``per_batch`` random records each."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name in datasets.CIFAR_FILES:
        labels = rng.integers(0, 10, (per_batch, 1), dtype=np.uint8)
        pixels = rng.integers(0, 256, (per_batch, 3 * 32 * 32), dtype=np.uint8)
        (directory / name).write_bytes(np.concatenate([labels, pixels], axis=1).tobytes())
    return directory


def test_cifar10_preset_trains_24x24_colour_crops_with_64_types(tmp_path, capsys):
    config = make_config("capsnet", "cifar10", image_size=24, in_channels=3)
    assert config.primary_types == 64 and config.none_of_the_above
    data, out = write_tiny_cifar(tmp_path / "cifar"), tmp_path / "run"
    assert main(["train", "--dataset", "cifar10", "--preset", "cifar10", "--data-dir", str(data),
                 "--no-download", "--epochs", "1", "--batch-size", "8", "--val-size", "2",
                 "--no-progress", "--out-dir", str(out), *FAST]) == 0
    saved = load_checkpoint(out / "best.pt")["config"]
    assert (saved["image_size"], saved["in_channels"], saved["uncropped_size"]) == (24, 3, 32)
    assert saved["primary_types"] == 64 and saved["none_of_the_above"]
    assert list(saved["class_names"][:2]) == ["airplane", "automobile"]
    capsys.readouterr()
    assert main(["evaluate", str(out / "best.pt"), "--data-dir", str(data), "--no-download",
                 "--json", *FAST]) == 0
    report = json.loads(capsys.readouterr().out)  # the 2 test images, centre-cropped
    assert report["images"] == 2 and report["dataset"] == "cifar10"
    assert report["accuracy"] == pytest.approx(
        json.loads((out / "results.json").read_text())["final"]["accuracy"])


# ---- bad folders at the command line -------------------------------------------------------

def test_unreadable_image_is_one_line_and_no_run_directory(tmp_path, capsys):
    data = make_folder(tmp_path / "data", GREY_CLASSES, per_class=6, test=False)
    bad = data / "train" / "line" / "03.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n not really")
    out = tmp_path / "run"
    assert main(train_folder(data, out)) == 1
    line = last_error_line(capsys)
    assert str(bad) in line
    assert not out.exists()


def test_skip_bad_images_warns_through_the_log_and_trains(tmp_path, capsys):
    data = make_folder(tmp_path / "data", GREY_CLASSES, per_class=6, test=False)
    (data / "train" / "line" / "03.png").write_bytes(b"broken")
    (data / "train" / "circle" / "01.png").write_bytes(b"")
    out = tmp_path / "run"
    capsys.readouterr()
    assert main(train_folder(data, out, "--skip-bad-images")) == 0
    text = capsys.readouterr().out
    assert "warning: skipped 2 unreadable image files under" in text
    assert "train/line/03.png" in text and "train/circle/01.png" in text
    assert (out / "best.pt").is_file()


def test_a_failed_start_leaves_an_existing_run_untouched(rgb_run, tmp_path, capsys):
    """Bad data given with an existing --out-dir: the run's checkpoints are not touched."""
    before = {p.name: p.stat().st_mtime_ns for p in rgb_run.iterdir()}
    assert main(train_folder(tmp_path / "missing", rgb_run)) == 1
    assert "dataset folder not found" in last_error_line(capsys)
    assert {p.name: p.stat().st_mtime_ns for p in rgb_run.iterdir()} == before


@pytest.mark.parametrize("layout, extra, words", [
    ("empty-class", [], "empty class folder"),
    ("one-class", [], "only one class folder (only); need at least 2 classes"),
    ("mixed-sizes", [], "pass --image-size N"),
    ("no-images", [], "no image files in any class folder"),
    ("missing", [], "dataset folder not found"),
    ("good", ["--image-size", "12", "--preset", "paper"], "the smallest workable size is 17"),
])
def test_bad_folders_are_one_line_errors(layout, extra, words, tmp_path, capsys):
    data = tmp_path / "data"
    if layout in ("empty-class", "mixed-sizes", "good"):
        make_folder(data, GREY_CLASSES, per_class=6, test=False)
    if layout == "empty-class":
        (data / "train" / "empty").mkdir()
    elif layout == "one-class":
        make_folder(data, ["only"], per_class=3, test=False)
    elif layout == "mixed-sizes":
        Image.new("L", (20, 24)).save(data / "train" / "line" / "odd.png")
    elif layout == "no-images":
        for name in GREY_CLASSES:
            (data / "train" / name).mkdir(parents=True)
            (data / "train" / name / "notes.txt").write_text("no pictures here")
    out = tmp_path / "run"
    assert main(train_folder(data, out, *extra)) == 1
    line = last_error_line(capsys)
    assert words in line
    if layout == "empty-class":
        assert str(data / "train" / "empty") in line
    elif layout != "good":
        assert str(data) in line
    assert not out.exists()


def test_a_folder_of_large_images_trains_the_scalable_model_and_a_small_one_is_warned(
        tmp_path, capsys, monkeypatch):
    """No --model: a folder of 64 px images gets capshead, as create_model('auto') picks, from
    the folder's listing and one header (the folder is loaded once, to train); too few images
    for the batch get a warning naming a batch size that gives enough steps."""
    data = make_folder(tmp_path / "data", ["a", "b", "c"], per_class=6, size=(64, 64), test=False)
    out = tmp_path / "run"
    loads = []
    real_load = datasets.load_folder_dataset
    monkeypatch.setattr(datasets, "load_folder_dataset",
                        lambda *args, **kwargs: loads.append(1) or real_load(*args, **kwargs))
    assert main(train_folder(data, out, "--batch-size", "128")) == 0
    assert len(loads) == 1
    printed = capsys.readouterr().out
    assert "--model auto: capshead for 64x64 images of 3 classes" in printed
    assert "optimiser steps an epoch at batch 128; --batch-size 8 gives" in printed
    assert json.loads((out / "config.json").read_text())["settings"]["model"] == "capshead"
