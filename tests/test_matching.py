"""Models compared at one validation accuracy: which checkpoint of each run stands for it,
in the library and through `capsnet robustness --matched`."""
from __future__ import annotations

import csv

import pytest

from capsnet.checkpoint import CheckpointError, save_checkpoint
from capsnet.cli.main import main
from capsnet.experiments.matching import kept_checkpoints, matched_checkpoints
from capsnet.models import build_model, make_config


def fake_run(run_dir, kept: dict[str, tuple[int, float]]):
    """A run directory holding {file name: (epoch, validation accuracy)} checkpoints of a
    small untrained CNN."""
    run_dir.mkdir()
    model = build_model(make_config("cnn", "small"))
    for name, (epoch, accuracy) in kept.items():
        save_checkpoint(run_dir / name, model, epoch=epoch,
                        metrics={"epoch": epoch, "val_accuracy": accuracy})
    return run_dir


@pytest.fixture
def two_runs(tmp_path):
    """Run a reached 0.97 at epoch 2 and went on to 0.99; run b's best is 0.975, at epoch 5."""
    a = fake_run(tmp_path / "a", {"epoch-001.pt": (1, 0.95), "epoch-002.pt": (2, 0.97),
                                  "epoch-003.pt": (3, 0.98), "best.pt": (4, 0.99),
                                  "last.pt": (4, 0.99)})
    b = fake_run(tmp_path / "b", {"epoch-004.pt": (4, 0.96), "best.pt": (5, 0.975),
                                  "last.pt": (6, 0.97)})
    return a, b


def test_kept_checkpoints_one_per_epoch_preferring_the_epoch_files(two_runs):
    a, b = two_runs
    assert [(k.path.name, k.epoch) for k in kept_checkpoints(a)] == [
        ("epoch-001.pt", 1), ("epoch-002.pt", 2), ("epoch-003.pt", 3), ("best.pt", 4)]
    assert [(k.path.name, k.epoch, k.val_accuracy) for k in kept_checkpoints(b)] == [
        ("epoch-004.pt", 4, 0.96), ("best.pt", 5, 0.975), ("last.pt", 6, 0.97)]


def test_each_run_is_taken_at_its_earliest_checkpoint_reaching_the_common_level(two_runs):
    a, b = two_runs
    level, chosen = matched_checkpoints([a, b])
    assert level == 0.975
    assert [(k.path.name, k.epoch) for k in chosen] == [("epoch-003.pt", 3), ("best.pt", 5)]
    level, chosen = matched_checkpoints([a, b], accuracy=0.96)
    assert [(k.path.name, k.epoch) for k in chosen] == [("epoch-002.pt", 2), ("epoch-004.pt", 4)]


def test_a_level_a_run_never_reached_names_the_run_and_its_best(two_runs):
    a, b = two_runs
    with pytest.raises(ValueError, match=r"b: no kept checkpoint reaches .*0\.9800.*0\.9750"):
        matched_checkpoints([a, b], accuracy=0.98)
    with pytest.raises(CheckpointError, match="not a run directory"):
        matched_checkpoints([a, a / "epoch-001.pt"])


def test_robustness_cli_compares_runs_at_a_matched_validation_accuracy(two_runs, tiny_mnist_dir,
                                                                       tmp_path, capsys):
    a, b = two_runs
    out = tmp_path / "robustness"
    assert main(["robustness", str(a), str(b), "--matched", "--limit", "20", "--step", "60",
                 "--data-dir", str(tiny_mnist_dir), "--no-download", "--out-dir", str(out)]) == 0
    err = capsys.readouterr().err
    assert "matched at validation accuracy >= 0.9750" in err
    assert "epoch-003.pt (epoch 3, validation 0.9800)" in err and "best.pt (epoch 5" in err
    with open(out / "robustness.csv", newline="") as f:
        assert {row["model"] for row in csv.DictReader(f)} == {"cnn (a)", "cnn (b)"}
    assert main(["robustness", str(a / "best.pt"), "--match-accuracy", "0.9"]) == 1
    assert "--match-accuracy needs --matched" in capsys.readouterr().err
