"""PNG figures (Figures 3 and 4 of the paper, training curves) and their commands."""
from __future__ import annotations

import csv

import numpy as np
import pytest
from PIL import Image, ImageDraw

from capsnet.checkpoint import save_checkpoint
from capsnet.cli.main import main
from capsnet.figures import (
    curve_series,
    manipulation_figure,
    mosaic,
    prediction_figure,
    reconstruction_figure,
    training_curves_figure,
)
from capsnet.models import build_model, make_config

METRICS = [
    {"epoch": 1, "lr": 0.001, "train_loss": 0.5, "train_accuracy": 0.80, "val_loss": 0.3,
     "val_accuracy": 0.90, "test_accuracy_monitoring": None},
    {"epoch": 2, "lr": 0.00096, "train_loss": 0.2, "train_accuracy": 0.95, "val_loss": 0.1,
     "val_accuracy": 0.99, "test_accuracy_monitoring": 0.98},
]


def png_size(path) -> tuple[int, int]:
    with Image.open(path) as image:
        assert image.format == "PNG"
        image.load()
        return image.size


def test_mosaic_places_tiles_with_separators():
    tiles = np.arange(2 * 3 * 4 * 5, dtype=np.uint8).reshape(2, 3, 4, 5)  # (R, C, H, W)
    out = mosaic(tiles, pad=1, pad_value=7)
    assert out.shape == (2 * 5 - 1, 3 * 6 - 1)
    np.testing.assert_array_equal(out[5:9, 12:17], tiles[1, 2])
    assert (out[4] == 7).all() and (out[:, 5] == 7).all()


def test_curve_series_turns_accuracy_into_error_and_skips_empty_cells():
    series = curve_series(METRICS)
    assert series["train_loss"] == ([1, 2], [0.5, 0.2])
    epochs, errors = series["val_accuracy"]
    assert epochs == [1, 2] and errors == pytest.approx([10.0, 1.0])
    assert series["test_accuracy_monitoring"][0] == [2]
    assert "lr" not in series


@pytest.mark.slow
def test_figure_functions_write_pngs(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (7, 28, 28), dtype=np.uint8)
    labels, predictions = [1] * 7, [1, 1, 1, 1, 1, 2, 3]
    w2, h2 = png_size(reconstruction_figure(images, images[::-1], labels, predictions,
                                            tmp_path / "r2.png", columns=4))
    w3, h3 = png_size(reconstruction_figure(images, images[::-1], labels, predictions,
                                            tmp_path / "r3.png", columns=4,
                                            label_reconstructions=images))
    assert w3 == w2 and h3 > h2  # a third row for the reconstructions from the label
    grid = rng.integers(0, 256, (4, 3, 28, 28), dtype=np.uint8)  # (D, S, H, W)
    w4, h4 = png_size(manipulation_figure([grid, grid], [3, 5], [-0.1, 0.0, 0.1],
                                          tmp_path / "sub" / "m.png"))
    assert w4 > h4  # two 4x3 grids side by side
    assert png_size(training_curves_figure(METRICS, tmp_path / "c.png", title="run"))[0] > 0
    assert png_size(prediction_figure(images[0], images[1], [0.1] * 9 + [0.9], "p",
                                      tmp_path / "p.png"))[0] > 0
    no_decoder = prediction_figure(images[0], None, [0.5] * 10, "cnn", tmp_path / "q.png")
    assert png_size(no_decoder)[0] > 0


def test_training_curves_need_some_values(tmp_path):
    with pytest.raises(ValueError, match="no loss or accuracy"):
        training_curves_figure([{"epoch": 1, "lr": 0.1}], tmp_path / "c.png")


# ---- commands ------------------------------------------------------------------------------

def test_cli_reconstruct(small_checkpoint, tiny_mnist_dir, tmp_path, capsys):
    out = tmp_path / "reconstructions.png"
    assert main(["reconstruct", "--checkpoint", str(small_checkpoint), "--data-dir",
                 str(tiny_mnist_dir), "--no-download", "--count", "6", "--misclassified", "3",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"wrote {out}" in text and "mis-classified" in text
    assert png_size(out)[0] > 0


def test_cli_manipulate_test_digits_and_own_image(small_checkpoint, tiny_mnist_dir, tmp_path,
                                                   capsys):
    out = tmp_path / "manipulation.png"
    assert main(["manipulate", "--checkpoint", str(small_checkpoint), "--data-dir",
                 str(tiny_mnist_dir), "--no-download", "--digits", "2", "6",
                 "--out", str(out)]) == 0
    assert "16 dimensions x 11 perturbations from -0.25 to +0.25" in capsys.readouterr().out
    assert png_size(out)[0] > 0
    own = tmp_path / "own.png"
    image = Image.new("L", (100, 100), 255)
    ImageDraw.Draw(image).line([(50, 10), (50, 90)], fill=0, width=8)
    image.save(own)
    assert main(["manipulate", "--checkpoint", str(small_checkpoint), "--image", str(own),
                 "--range", "0.1", "--step", "0.05", "--out", str(out)]) == 0
    assert "5 perturbations from -0.10 to +0.10" in capsys.readouterr().out


def test_cli_manipulate_rejects_a_bad_digit(small_checkpoint, tiny_mnist_dir, capsys):
    assert main(["manipulate", "--checkpoint", str(small_checkpoint), "--data-dir",
                 str(tiny_mnist_dir), "--no-download", "--digits", "12"]) == 1
    assert "--digits/--classes: no class '12': the model's classes are 0..9" in \
        capsys.readouterr().err


def test_cli_reconstruct_needs_a_decoder(tmp_path, tiny_mnist_dir, capsys):
    cnn = tmp_path / "cnn.pt"
    save_checkpoint(cnn, build_model(make_config("cnn", "small")))
    assert main(["reconstruct", "--checkpoint", str(cnn), "--data-dir", str(tiny_mnist_dir),
                 "--no-download"]) == 1
    assert "no reconstruction decoder" in capsys.readouterr().err


def test_cli_plot(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with open(run_dir / "metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, list(METRICS[0]))
        writer.writeheader()
        writer.writerows([{k: ("" if v is None else v) for k, v in row.items()} for row in METRICS])
    assert main(["plot", str(run_dir)]) == 0
    assert "2 epochs" in capsys.readouterr().out
    assert png_size(run_dir / "curves.png")[0] > 0


def test_cli_plot_of_a_real_run(small_checkpoint, tmp_path, capsys):
    out = tmp_path / "curves.png"
    assert main(["plot", str(small_checkpoint.parent), "--out", str(out)]) == 0
    assert png_size(out)[0] > 0


def test_cli_plot_without_metrics_is_one_line(tmp_path, capsys):
    assert main(["plot", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("capsnet: error: ") and "no metrics.csv" in err
