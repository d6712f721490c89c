"""benchmarks/time_to_accuracy.py: the first epoch at a threshold by hand, and both recipes end
to end with --tiny on the fake MNIST, stopped by a time limit, resumed, then read back."""
from __future__ import annotations

import json

import pytest

from benchmarks import recipe_ablation
from benchmarks import time_to_accuracy as tta
from capsnet.checkpoint import load_checkpoint
from capsnet.training.metrics_log import read_metrics


def test_first_reaching_counts_epochs_and_their_seconds():
    rows = [{"epoch": 1, "epoch_seconds": 60.0, "val_accuracy": 0.98},
            {"epoch": 2, "epoch_seconds": 90.0, "val_accuracy": 0.991},
            {"epoch": 3, "epoch_seconds": 30.0, "val_accuracy": 0.989},
            {"epoch": 3, "epoch_seconds": 30.0, "val_accuracy": 0.996}]  # resumed: the last
    assert tta.first_reaching(rows, 0.99) == {"epoch": 2, "minutes": 2.5}
    assert tta.first_reaching(rows, 0.995) == {"epoch": 3, "minutes": 3.0}
    assert tta.first_reaching(rows, 0.999) is None
    assert tta.first_reaching([], 0.99) is None


def run(tiny_mnist_dir, out, *extra) -> int:
    return tta.main(["--tiny", "--device", "cpu", "--data-dir", str(tiny_mnist_dir),
                     "--no-download", "--out-dir", str(out), "--thresholds", "0.1,0.3,0.999",
                     *extra])


def test_tiny_benchmark_runs_both_recipes_resumes_and_reads_back(tiny_mnist_dir, tmp_path,
                                                                 capsys):
    out = tmp_path / "tta"
    assert run(tiny_mnist_dir, out, "--time-limit", "0.05") == 0  # paper: 1 epoch
    assert [r["epoch"] for r in read_metrics(out / "paper")] == [1]
    assert not (out / "fast").exists()  # no time left for the second recipe
    capsys.readouterr()
    assert run(tiny_mnist_dir, out) == 0  # resumes paper, trains fast
    text = capsys.readouterr().out
    assert "resuming" in text and "cpu:" in text and "flags:" in text
    report = json.loads((out / "time_to_accuracy.json").read_text())
    assert [r["recipe"] for r in report["runs"]] == ["paper", "fast"]
    for row in report["runs"]:
        assert row["complete"] and row["epochs"] == 2 and row["test_error"] is not None
        assert row["reached"]["0.999"] is None  # 99.9% on noise-level data: never
        assert set(row["reached"]) == {"0.100", "0.300", "0.999"}
    assert load_checkpoint(out / "fast" / "last.pt")["train_settings"]["recipe"] == "fast"
    assert "ema" in load_checkpoint(out / "fast" / "last.pt")
    for recipe in ("paper", "fast"):
        assert "val>=10.0%" in text and recipe in text

    written = {r: (out / r / "last.pt").stat().st_mtime_ns for r in ("paper", "fast")}
    assert run(tiny_mnist_dir, out) == 0  # again: both complete, nothing trained
    assert {r: (out / r / "last.pt").stat().st_mtime_ns for r in written} == written
    assert "not trained again" in capsys.readouterr().out


def test_unknown_recipes_are_refused(capsys):
    with pytest.raises(SystemExit):
        tta.parse_args(["--recipes", "paper,slow"])
    assert "slow" in capsys.readouterr().err


def test_tiny_recipe_ablation_trains_one_change_per_row_and_reads_back(tiny_mnist_dir, tmp_path,
                                                                       capsys):
    out = tmp_path / "ablation"
    args = ["--tiny", "--data-dir", str(tiny_mnist_dir), "--out-dir", str(out)]
    assert recipe_ablation.main([*args, "--rows", "2,3"]) == 0
    report = json.loads((out / "ablation.json").read_text())
    by_row = {r["row"]: r for r in report["rows"]}
    assert by_row["paper"]["epochs"] == 0  # not chosen: not trained
    fast, raw = by_row["fast"], by_row["fast without the weight average (same run)"]
    assert fast["epochs"] == raw["epochs"] == 2 and by_row["fast, peak 1e-3 (the paper's)"][
        "epochs"] == 2
    assert fast["best_val"] is not None and raw["best_val"] is not None
    settings = load_checkpoint(out / "fast-peak-1e-3-the-paper-s" / "last.pt")["train_settings"]
    assert settings["lr"] == 1e-3 and settings["recipe"] == "fast"
    assert settings["warmup_epochs"] == pytest.approx(2 / 15)  # the fast recipe's share
    capsys.readouterr()
    assert recipe_ablation.main([*args, "--report-only"]) == 0
    assert "| fast, no warm-up | 0 |" in capsys.readouterr().out
