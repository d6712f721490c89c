"""`capsnet robustness` and `capsnet affnist` end to end on small checkpoints and tiny data,
and the library functions under them."""
from __future__ import annotations

import csv
import json

import pytest
import torch

from capsnet.checkpoint import model_from_checkpoint, save_checkpoint
from capsnet.cli.main import main
from capsnet.experiments.affnist import compare, evaluation_sets
from capsnet.experiments.robustness import (
    NamedModel,
    accuracy_grid,
    affine_rows,
    format_table,
    markdown_table,
    rotation_rows,
)
from capsnet.models import build_model, make_config
from capsnet.training import TrainSettings, fit
from capsnet.training.loop import evaluate


@pytest.fixture(scope="module")
def cnn_checkpoint(tmp_path_factory, tiny_mnist_dir):
    """The small CNN trained one epoch on the fake digits."""
    out = tmp_path_factory.mktemp("cnn_run")
    fit(TrainSettings(model="cnn", preset="small", data_dir=str(tiny_mnist_dir), download=False,
                      epochs=1, val_size=100, out_dir=str(out), progress=False),
        log=lambda _: None)
    return out / "best.pt"


@pytest.fixture(scope="module")
def test_digits(tiny_mnist_dir):
    from capsnet.data.datasets import load_split

    test = load_split("mnist", "test", tiny_mnist_dir, download=False)
    return test.images[:40], test.labels[:40]


def data_args(tiny_mnist_dir) -> list[str]:
    return ["--data-dir", str(tiny_mnist_dir), "--no-download"]


def test_robustness_cli_end_to_end(small_checkpoint, cnn_checkpoint, tiny_mnist_dir, tmp_path,
                                   capsys):
    out = tmp_path / "robustness"
    code = main(["robustness", str(small_checkpoint), str(cnn_checkpoint), "--labels", "caps",
                 "cnn", "--limit", "40", "--max-angle", "60", "--step", "60",
                 *data_args(tiny_mnist_dir), "--out-dir", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    for line in ("rotated -60 deg", "rotated +0 deg", "rotated +60 deg", "affine (seed 0)"):
        assert line in printed
    with open(out / "robustness.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * (3 + 1)  # two models x (three angles + the affine set)
    assert {r["model"] for r in rows} == {"caps", "cnn"}
    assert all(0 <= float(r["accuracy"]) <= 1 and r["images"] == "40" for r in rows)
    assert [r["angle_deg"] for r in rows if r["transform"] == "affine"] == ["", ""]
    for name in ("robustness.png", "examples.png", "table.md"):
        assert (out / name).stat().st_size > 0
    assert (out / "table.md").read_text().startswith("| test set | caps | cnn |")


def test_unrotated_row_equals_plain_evaluation(small_checkpoint, test_digits):
    images, labels = test_digits
    model = model_from_checkpoint(small_checkpoint)
    rows = rotation_rows([NamedModel("caps", model)], images, labels, [0.0, 90.0])
    plain = evaluate(model, images, labels).accuracy
    assert rows[0]["accuracy"] == pytest.approx(plain)
    turned = evaluate(model, torch.rot90(images, 1, (-2, -1)), labels).accuracy
    assert rows[1]["accuracy"] == pytest.approx(turned)


def test_every_model_sees_the_same_affine_set(small_checkpoint, test_digits):
    images, labels = test_digits
    model = model_from_checkpoint(small_checkpoint)
    rows = affine_rows([NamedModel("a", model), NamedModel("b", model)], images, labels, seed=4)
    again = affine_rows([NamedModel("a", model)], images, labels, seed=4)
    assert rows[0]["accuracy"] == rows[1]["accuracy"] == again[0]["accuracy"]


def test_tables_put_a_model_per_column():
    rows = [{"model": m, "transform": "rotation", "angle_deg": a, "accuracy": acc}
            for m, a, acc in [("x", -30.0, 0.5), ("y", -30.0, 0.25), ("x", 0.0, 1.0),
                              ("y", 0.0, 0.75)]]
    rows.append({"model": "x", "transform": "affine", "angle_deg": None, "accuracy": 0.125})
    labels, lines = accuracy_grid(rows)
    assert labels == ["x", "y"]
    assert lines == [("rotated -30 deg", [0.5, 0.25]), ("rotated +0 deg", [1.0, 0.75]),
                     ("affine", [0.125, None])]
    assert "| affine | 12.50% | - |" in markdown_table(rows)
    assert format_table(rows).splitlines()[1].split() == ["rotated", "-30", "deg", "50.00",
                                                         "25.00"]


def test_robustness_cli_reports_a_missing_checkpoint(tmp_path, capsys):
    assert main(["robustness", str(tmp_path / "nope.pt")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("capsnet: error:") and "nope.pt" in err and len(err.splitlines()) == 1


def test_affnist_cli_train_and_evaluate(tiny_mnist_dir, small_checkpoint, tmp_path, capsys):
    run = tmp_path / "affnist-cnn"
    assert main(["affnist", "train", "--model", "cnn", "--preset", "small", "--epochs", "3",
                 "--subset", "100", "--val-size", "50", "--test-limit", "40",
                 "--target-accuracy", "0", *data_args(tiny_mnist_dir),
                 "--out-dir", str(run)]) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["reached_target"] and results["epochs"] == 1  # stopped at the target
    assert results["test"]["canvas"] == 40 and results["test"]["images"] == 40
    model = model_from_checkpoint(run / "best.pt")
    assert model.config.image_size == 40
    capsys.readouterr()
    assert main(["affnist", "evaluate", str(run / "best.pt"), "--limit", "40", "--json",
                 *data_args(tiny_mnist_dir)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["mnist_accuracy"] == pytest.approx(results["test"]["mnist_accuracy"])
    assert rows[0]["affine_accuracy"] == pytest.approx(results["test"]["affine_accuracy"])
    # A 28x28 model cannot take the 40x40 test digits: one clear line.
    assert main(["affnist", "evaluate", str(small_checkpoint), "--limit", "10",
                 *data_args(tiny_mnist_dir)]) == 1
    assert "affnist train" in capsys.readouterr().err


def test_affnist_test_sets_and_comparison(test_digits):
    images, labels = test_digits
    sets = evaluation_sets(images, canvas=40, seed=1)
    assert sets["mnist"].shape == sets["affine"].shape == (40, 40, 40)
    assert torch.equal(sets["mnist"].sum((1, 2)), images.sum((1, 2)))  # only moved
    assert torch.equal(sets["affine"], evaluation_sets(images, canvas=40, seed=1)["affine"])
    torch.manual_seed(0)
    cnn = build_model(make_config("cnn", "small", image_size=40)).eval()
    rows = compare([NamedModel("cnn", cnn)], images, labels, seed=1)
    assert set(rows[0]) >= {"mnist_accuracy", "affine_accuracy", "parameters"}
    small = build_model(make_config("cnn", "small")).eval()
    with pytest.raises(ValueError, match="different input sizes"):
        compare([NamedModel("a", cnn), NamedModel("b", small)], images, labels)


def test_saved_40px_capsnet_has_the_derived_capsule_count(tmp_path):
    model = build_model(make_config("capsnet", "small", image_size=40))
    save_checkpoint(tmp_path / "m.pt", model)
    loaded = model_from_checkpoint(tmp_path / "m.pt")
    assert loaded.config.num_primary_caps == 8 * 12 * 12  # conv1 40 -> 32, (32 - 9) // 2 + 1 = 12
    assert loaded(torch.rand(2, 1, 40, 40)).scores.shape == (2, 10)
