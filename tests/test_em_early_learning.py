"""benchmarks/em_early_learning.py end to end on the tiny fake MNIST: every variant trains,
is validated on images it never saw, and the pose scaling is what tells the variants apart."""
from __future__ import annotations

import json

import pytest

from benchmarks import em_early_learning


@pytest.mark.slow
def test_variants_train_and_report(tiny_mnist_dir, tmp_path, capsys):
    out = tmp_path / "early.json"
    assert em_early_learning.main([
        "--data-dir", str(tiny_mnist_dir), "--variants", "2,2-unscaled", "--steps", "3",
        "--batch-size", "8", "--init-images", "16", "--val-start", "500", "--val-size", "100",
        "--no-compile", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["iterations"], r["scaled_poses"]) for r in rows] == [(2, True), (2, False)]
    assert all(0.0 <= r["val_accuracy"] <= 1.0 and r["steps"] == 3 for r in rows)
    assert "| 2 | yes |" in capsys.readouterr().out


def test_validation_must_not_overlap_the_training_images(tiny_mnist_dir):
    with pytest.raises(SystemExit, match="must end before the validation"):
        em_early_learning.main(["--data-dir", str(tiny_mnist_dir), "--variants", "2",
                                "--steps", "10", "--batch-size", "64", "--val-start", "500",
                                "--no-compile"])
