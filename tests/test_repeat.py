"""`capsnet repeat`: mean ± std over seeds and the ensemble row."""
import json
import math

import numpy as np
import pytest
import torch

from capsnet.cli.main import main
from capsnet.models import ModelOutput
from capsnet.training.fit import save_test_scores
from capsnet.training.repeat import (
    ensemble_from_runs,
    ensemble_of_checkpoints,
    ensemble_scores,
    error_of,
    load_test_scores,
    mean_std,
)
from capsnet.training.settings import TrainSettings
from tests.conftest import last_error_line


def test_mean_std_matches_hand_computation():
    # errors 0.2%, 0.3%, 0.4%: mean 0.3%, sample variance ((0.1)^2 + 0 + (0.1)^2) / 2 = 0.01
    mean, std = mean_std([0.002, 0.003, 0.004])
    assert mean == pytest.approx(0.003)
    assert std == pytest.approx(0.001)
    assert mean_std([0.5]) == (0.5, 0.0)
    with pytest.raises(ValueError):
        mean_std([])


class _Fixed(torch.nn.Module):
    """A 'model' whose softmax scores are fixed logits, whatever the image."""

    def __init__(self, logits):
        super().__init__()
        self.logits = torch.tensor(logits)

    def forward(self, x, labels=None):
        return ModelOutput.from_logits(self.logits.expand(len(x), -1))


def test_ensemble_averages_scores():
    a, b = _Fixed([2.0, 0.0]), _Fixed([0.0, 4.0])
    images = torch.zeros(3, 4, 4, dtype=torch.uint8)
    expected = (torch.softmax(a.logits, 0) + torch.softmax(b.logits, 0)) / 2
    assert torch.allclose(ensemble_scores([a, b], images), expected.expand(3, -1))


def test_repeat_cli_writes_summary(tmp_path, tiny_mnist_dir, capsys):
    out = tmp_path / "rep"
    code = main(["repeat", "--seeds", "1,2", "--preset", "small", "--data-dir", str(tiny_mnist_dir),
                 "--no-download", "--epochs", "1", "--val-size", "100", "--out-dir", str(out),
                 "--no-progress"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seeds"] == [1, 2]
    per_seed = [json.loads((out / f"seed-{s}" / "results.json").read_text())["best"]["error"]
                for s in (1, 2)]
    assert summary["test_errors"] == per_seed
    mean = sum(per_seed) / 2
    assert summary["test_error_mean"] == pytest.approx(mean)
    assert summary["test_error_std"] == pytest.approx(
        math.sqrt(sum((e - mean) ** 2 for e in per_seed)))
    assert 0.0 <= summary["ensemble_test_error"] <= 1.0
    assert "validation-selected" in summary["protocol"]
    assert "±" in capsys.readouterr().out


def save_run(run_dir, scores, labels):
    run_dir.mkdir(parents=True)
    save_test_scores(run_dir, torch.tensor(scores), torch.tensor(labels))


def test_the_ensemble_is_recomputed_from_saved_scores_by_hand(tmp_path):
    labels = [0, 1, 1]
    # run a: right on images 0 and 1; run b: right on 1 and 2; averaged: right on all three
    save_run(tmp_path / "a", [[0.9, 0.1], [0.4, 0.6], [0.8, 0.7]], labels)
    save_run(tmp_path / "b", [[0.45, 0.55], [0.2, 0.9], [0.3, 0.9]], labels)
    ensemble = ensemble_from_runs([tmp_path / "a", tmp_path / "b"])
    assert ensemble["member_test_errors"] == pytest.approx([1 / 3, 1 / 3])
    assert ensemble["ensemble_test_error"] == 0.0 and ensemble["ensemble_size"] == 2
    save_run(tmp_path / "c", [[0.9, 0.1], [0.4, 0.6], [0.8, 0.7]], [0, 1, 0])
    with pytest.raises(ValueError, match="not the same test set"):
        ensemble_from_runs([tmp_path / "a", tmp_path / "c"])


def test_repeat_saves_test_scores_and_continues_where_it_stopped(tmp_path, tiny_mnist_dir,
                                                                 capsys):
    out = tmp_path / "rep"
    command = ["repeat", "--seeds", "1,2", "--recipe", "fast", "--preset", "small",
               "--data-dir", str(tiny_mnist_dir), "--no-download", "--epochs", "1",
               "--subset", "100", "--batch-size", "20", "--val-size", "100", "--out-dir",
               str(out), "--no-progress", "--precision", "fp32"]
    assert main(command) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ensemble_from"] == "saved test scores"
    for seed, error in zip((1, 2), summary["test_errors"], strict=True):
        scores, labels = load_test_scores(out / f"seed-{seed}")
        assert scores.shape == (200, 10) and scores.dtype == np.float32  # the test set's
        assert error_of(scores, labels) == pytest.approx(error)  # the tested model's scores
    settings = TrainSettings.from_dict(
        json.loads((out / "seed-1" / "config.json").read_text())["settings"])
    from_weights = ensemble_of_checkpoints(settings, [out / f"seed-{s}" / "best.pt"
                                                      for s in (1, 2)])
    assert summary["ensemble_test_error"] == pytest.approx(from_weights["ensemble_test_error"])
    assert "ensemble of 2" in capsys.readouterr().out

    written = (out / "seed-2" / "best.pt").stat().st_mtime_ns
    assert main(command) == 0  # again: both seeds read back, nothing trained
    assert (out / "seed-2" / "best.pt").stat().st_mtime_ns == written
    assert json.loads((out / "summary.json").read_text()) == summary
    assert "not trained again" in capsys.readouterr().out
    assert main([*command, "--epochs", "2", "--seeds", "2"]) == 0  # more epochs: resumed
    assert json.loads((out / "seed-2" / "results.json").read_text())["epochs"] == 2
    capsys.readouterr()
    assert main([*command, "--batch-size", "50"]) == 1  # not the runs' recipe
    assert "other settings (batch_size 20, not 50)" in last_error_line(capsys)


def test_only_rank_zero_builds_the_ensemble_and_writes_the_summary(tmp_path, monkeypatch):
    """Under torchrun every rank trains each seed; ranks other than 0 neither load the
    models for the ensemble nor race rank 0 to summary.json."""
    import capsnet.training.repeat as repeat
    from capsnet.training.settings import TrainSettings

    monkeypatch.setattr(repeat, "run_seed", lambda run, argv=None, log=print:
                        {"final": {"error": 0.1}})
    monkeypatch.setattr(repeat, "summarise", lambda *a: pytest.fail("rank 1 summarised"))
    monkeypatch.setattr(repeat, "env_ranks", lambda: (1, 2, 1))
    assert repeat.repeat_recipe(TrainSettings(), [1, 2], tmp_path) is None
    assert not (tmp_path / "summary.json").exists()
