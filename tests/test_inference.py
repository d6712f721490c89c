"""The prediction API, capsule perturbations and `capsnet predict`."""
from __future__ import annotations

import io
import json
import sys

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

import capsnet.checkpoint
from capsnet.checkpoint import CheckpointError, load_model
from capsnet.cli.main import main
from capsnet.data.image_dataset import to_model_input
from capsnet.inference import (
    Prediction,
    decode_pose,
    first_of_each_class,
    perturbation_deltas,
    perturbation_grid,
    pick_examples,
    predict,
    predict_prepared,
    predict_until,
    run_model,
    to_uint8,
)
from capsnet.preprocess import PreprocessError, prepare_image
from tests.helpers import perturb_capsule


def sketch(kind: int, size: int = 200) -> Image.Image:
    """Dark strokes on white paper: a few different shapes."""
    image = Image.new("L", (size, size), 255)
    draw = ImageDraw.Draw(image)
    if kind == 0:
        draw.ellipse([50, 30, 150, 170], outline=0, width=14)
    elif kind == 1:
        draw.line([(100, 20), (100, 180)], fill=0, width=14)
    else:
        draw.line([(50, 40), (150, 40), (80, 180)], fill=0, width=14)
    return image


@pytest.fixture(scope="module")
def model(small_checkpoint):
    return load_model(small_checkpoint)


@pytest.fixture()
def image_files(tmp_path):
    folder = tmp_path / "digits"
    folder.mkdir()
    for kind in range(3):
        sketch(kind).save(folder / f"shape{kind}.png")
    return folder


def test_predict_fields_agree_with_the_model(model):
    images = [sketch(k) for k in range(3)]
    results = predict(images, model=model, top_k=3)
    assert len(results) == 3 and all(isinstance(r, Prediction) for r in results)
    x = to_model_input(torch.from_numpy(np.stack([prepare_image(i) for i in images])))
    with torch.no_grad():
        out = model(x)
    for i, r in enumerate(results):
        np.testing.assert_allclose(r.lengths, out.scores[i].numpy(), rtol=1e-5, atol=1e-6)
        assert r.digit == int(out.scores[i].argmax())
        assert r.length == pytest.approx(max(r.lengths))
        assert [d for d, _ in r.top] == np.argsort(r.lengths)[::-1][:3].tolist()
        assert r.alternatives == r.top[1:] and len(r.alternatives) == 2
        assert r.image.shape == (28, 28) and r.image.dtype == np.uint8
        np.testing.assert_array_equal(r.reconstruction, to_uint8(out.reconstructions[i:i + 1])[0])
        np.testing.assert_allclose(r.pose, out.poses[i, r.digit].numpy(), rtol=1e-5, atol=1e-6)
        assert set(r.as_dict()) == {"source", "class", "index", "digit", "length",
                                    "alternatives", "lengths"}
        assert r.as_dict()["class"] == str(r.digit) == r.class_name and r.index == r.digit


def test_predict_accepts_paths_bytes_and_single_images(model, image_files):
    path = image_files / "shape1.png"
    by_path = predict(path, model=model)  # one image: one Prediction
    [by_str] = predict([str(path)], model=model)  # a list: a list
    by_bytes = predict(path.read_bytes(), model=model)
    assert isinstance(by_path, Prediction) and isinstance(by_bytes, Prediction)
    assert by_path.source == str(path) and by_bytes.source == "<image 0>"
    assert by_path.lengths == by_str.lengths == by_bytes.lengths


def test_predict_loads_a_checkpoint_path(small_checkpoint, image_files):
    result = predict(image_files / "shape0.png", model=small_checkpoint, top_k=1)
    assert result.top == [(result.digit, result.length)] and result.alternatives == []


def test_predict_names_the_bad_image(model, image_files, tmp_path):
    blank = tmp_path / "blank.png"
    Image.new("L", (50, 50), 255).save(blank)
    with pytest.raises(PreprocessError, match="blank.png: no ink"):
        predict([image_files / "shape0.png", blank], model=model)


def test_default_model_missing_is_a_clear_error(monkeypatch, tmp_path, image_files):
    monkeypatch.setattr(capsnet.checkpoint, "DEFAULT_WEIGHTS", tmp_path / "none.safetensors")
    with pytest.raises(CheckpointError, match="no trained model ships"):
        predict(image_files / "shape0.png")


def test_decode_pose_matches_the_models_own_reconstruction(model):
    x = to_model_input(torch.from_numpy(prepare_image(sketch(2)))[None])  # (1, 1, 28, 28)
    with torch.no_grad():
        out = model(x)
    digit = int(out.scores.argmax())
    torch.testing.assert_close(decode_pose(model, out.poses[:, digit], digit),
                               out.reconstructions)


def test_perturbation_grid_equals_one_perturbation_at_a_time(model):
    x = to_model_input(torch.from_numpy(prepare_image(sketch(0)))[None])
    with torch.no_grad():
        out = model(x)
    digit = int(out.scores.argmax())
    deltas = perturbation_deltas()
    assert deltas.shape == (11,)
    torch.testing.assert_close(deltas[[0, 5, -1]], torch.tensor([-0.25, 0.0, 0.25]))
    grid = perturbation_grid(model, out.poses[0, digit], digit, deltas)  # (16, 11, 1, 28, 28)
    assert grid.shape == (16, 11, 1, 28, 28)
    for dim in (0, 7, 15):
        for s in (0, 5, 10):
            expected = perturb_capsule(model, out.poses, digit, dim, float(deltas[s]))[0]
            torch.testing.assert_close(grid[dim, s], expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grid[3, 5], out.reconstructions[0], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(grid[3, 0], grid[3, 10])  # moving a dimension changes the image


def test_perturb_capsule_ignores_other_capsules(model):
    poses = torch.randn(2, 10, 16) * 0.1
    noisy = poses.clone()
    noisy[:, 4] += 1.0  # capsule 4 is masked when decoding capsule 2
    torch.testing.assert_close(perturb_capsule(model, poses, 2, 5, 0.1),
                               perturb_capsule(model, noisy, 2, 5, 0.1))


def test_pick_examples_adds_misclassified_after_the_first():
    labels = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7])
    predictions = torch.tensor([9, 1, 2, 3, 0, 5, 1, 0])
    assert pick_examples(labels, predictions, 3, 2).tolist() == [0, 1, 2, 4, 6]
    assert pick_examples(labels, predictions, 3, 9).tolist() == [0, 1, 2, 4, 6, 7]
    assert pick_examples(labels, predictions, 0, 1).tolist() == [0]


def test_tensors_are_never_made_numpy_arrays(model, monkeypatch):
    """Image tensors go to the model as tensors (a CUDA tensor is no numpy array), results
    are read back in one piece, and labels on another device than the predictions are
    brought together (on a CPU: the same code, numpy refusing tensors as for CUDA)."""
    import capsnet.inference as inference

    def refuse(value, *args, **kwargs):
        assert not isinstance(value, torch.Tensor), "np.asarray on a tensor"
        return np.asarray(value, *args, **kwargs)

    monkeypatch.setattr(inference.np, "asarray", refuse)
    images = torch.randint(0, 256, (6, 1, 28, 28), dtype=torch.uint8)
    labels = torch.tensor([0, 1, 2, 3, 4, 5])
    scores, poses, recons = run_model(model, images, batch_size=4)
    assert scores.shape == (6, 10) and poses.shape[:2] == (6, 10)
    [p] = predict_prepared(model, images[:1], ["t"])
    assert p.lengths == pytest.approx(scores[0].tolist(), abs=1e-5)
    assert predict_until(model, images, labels, 2, 0).shape == (6,)
    predicted = scores.argmax(1)
    present = [int(c) for c in labels.unique()]
    assert len(first_of_each_class(model, images, labels, present)) == len(present)
    assert pick_examples(labels, predicted, 2, 1).numel() >= 2


# ---- `capsnet predict` -------------------------------------------------------------------

def test_cli_predict_text(small_checkpoint, image_files, capsys):
    path = image_files / "shape2.png"
    assert main(["predict", str(path), "--checkpoint", str(small_checkpoint),
                 "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    expected = predict(path, model=small_checkpoint)
    assert f"{path}: {expected.digit}  length {expected.length:.3f}" in out
    assert "then" in out


def test_cli_predict_folder_json(small_checkpoint, image_files, capsys):
    assert main(["predict", str(image_files), "--checkpoint", str(small_checkpoint), "--json",
                 "--top-k", "2"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert [r["source"] for r in results] == sorted(str(p) for p in image_files.glob("*.png"))
    for r in results:
        assert 0 <= r["digit"] <= 9 and len(r["lengths"]) == 10 and len(r["alternatives"]) == 1
        assert r["length"] == pytest.approx(max(r["lengths"]))


def test_cli_predict_stdin(small_checkpoint, image_files, capsys, monkeypatch):
    data = (image_files / "shape1.png").read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert main(["predict", "-", "--checkpoint", str(small_checkpoint), "--json"]) == 0
    [result] = json.loads(capsys.readouterr().out)
    assert result["source"] == "stdin"
    assert result["digit"] == predict(data, model=small_checkpoint).digit


def test_cli_predict_reports_bad_files_and_goes_on(small_checkpoint, image_files, tmp_path,
                                                   capsys):
    (tmp_path / "notes.txt").write_text("hello")
    blank = tmp_path / "blank.png"
    Image.new("L", (60, 60), 255).save(blank)
    good = image_files / "shape0.png"
    code = main(["predict", str(tmp_path / "notes.txt"), str(good), str(blank),
                 str(tmp_path / "missing.jpg"), "--checkpoint", str(small_checkpoint)])
    captured = capsys.readouterr()
    assert code == 1
    assert f"{good}: " in captured.out and "length" in captured.out
    errors = captured.err.strip().splitlines()
    assert len(errors) == 3 and all(e.startswith("capsnet: error: ") for e in errors)
    assert "notes.txt: not an image" in errors[0]
    assert "blank.png: no ink" in errors[1]
    assert "missing.jpg: no such file" in errors[2]


def test_cli_predict_show_and_save_dir(small_checkpoint, image_files, tmp_path, capsys):
    out_dir = tmp_path / "pictures"
    assert main(["predict", str(image_files / "shape1.png"), "--checkpoint", str(small_checkpoint),
                 "--show", "--save-dir", str(out_dir)]) == 0
    text = capsys.readouterr().out
    assert "input" in text and "reconstruction" in text
    art = [line for line in text.splitlines() if len(line) == 2 * 28 * 2 + 2]
    assert len(art) == 1 + 28 and any("@" in line for line in art)  # header + rows
    with Image.open(out_dir / "shape1.png") as picture:
        assert picture.format == "PNG" and picture.width > picture.height


def test_cli_predict_without_a_model_is_one_line(tmp_path, image_files, capsys):
    code = main(["predict", str(image_files / "shape1.png"), "--checkpoint",
                 str(tmp_path / "nothing.pt")])
    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith("capsnet: error: ") and "no such checkpoint" in err
    assert len(err.strip().splitlines()) == 1


# --- one image or a batch -------------------------------------------------------------------

def digit_arrays(count: int) -> np.ndarray:
    """(count, 28, 28) uint8 MNIST-like digits from the sketches."""
    return np.stack([prepare_image(sketch(k % 3)) for k in range(count)])


def test_a_batch_array_is_a_list_equal_to_one_image_at_a_time(model):
    batch = digit_arrays(3)  # (3, 28, 28)
    results = predict(batch, model=model)
    assert isinstance(results, list) and len(results) == 3
    for image, result in zip(batch, results, strict=True):
        alone = predict(image, model=model)  # (28, 28): one Prediction
        assert isinstance(alone, Prediction)
        assert alone.lengths == pytest.approx(result.lengths, abs=1e-6)
    channels_last = predict(batch[..., None], model=model)  # (3, 28, 28, 1)
    assert [r.lengths for r in channels_last] == [r.lengths for r in results]
    assert predict(batch[0][..., None], model=model).lengths == pytest.approx(
        results[0].lengths, abs=1e-6)


def test_tensors_are_model_input_as_they_are(model):
    x = to_model_input(torch.from_numpy(digit_arrays(2) // 2))  # (2, 1, 28, 28), not MNIST-like
    with torch.no_grad():
        out = model(x)
    results = predict(x, model=model)  # (B, C, H, W): a list
    assert len(results) == 2
    for i, result in enumerate(results):
        np.testing.assert_allclose(result.lengths, out.scores[i].numpy(), rtol=1e-5, atol=1e-6)
    one = predict(x[1], model=model)  # (C, H, W): one Prediction
    assert isinstance(one, Prediction)
    assert one.lengths == pytest.approx(results[1].lengths, abs=1e-6)
    levels = (x * 255).round().to(torch.uint8)  # the same image as uint8 levels
    assert predict(levels[1], model=model).lengths == one.lengths
    assert [r.lengths for r in predict([x[0], x[1]], model=model)] == [
        r.lengths for r in results]


@pytest.mark.parametrize("images, expected", [
    (torch.rand(1, 32, 32), r"expected a tensor \(C, H, W\) = \(1, 28, 28\) for this model, "
                            r"or a batch \(B, 1, 28, 28\); got shape \(1, 32, 32\)"),
    (torch.rand(4, 3, 28, 28), r"got shape \(3, 28, 28\)"),
    (torch.rand(28, 28), r"expected an image tensor \(C, H, W\) or a batch \(B, C, H, W\), got "
                         r"shape \(28, 28\)"),
    (np.zeros((2, 2, 28, 28, 1)), r"expected an image array \(H, W\) or \(H, W, C\) or a batch "
                                  r"\(B, H, W\) or \(B, H, W, C\), C in \(1, 3\); got shape"),
])
def test_a_wrong_shape_is_one_line_saying_what_is_expected(model, images, expected):
    with pytest.raises(PreprocessError, match=expected) as error:
        predict(images, model=model)
    assert "\n" not in str(error.value)


def test_the_top_level_names_are_these():
    import capsnet as top

    assert top.predict is predict and top.to_model_input is to_model_input
