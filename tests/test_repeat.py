"""`capsnet repeat`: mean ± std over seeds and the ensemble row."""
import json
import math

import pytest
import torch

from capsnet.cli.main import main
from capsnet.training.repeat import ensemble_scores, mean_std


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
        return self.logits.expand(len(x), -1)


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


def test_only_rank_zero_builds_the_ensemble_and_writes_the_summary(tmp_path, monkeypatch):
    """Under torchrun every rank trains each seed; ranks other than 0 neither load the
    models for the ensemble nor race rank 0 to summary.json."""
    import capsnet.training.repeat as repeat
    from capsnet.training.settings import TrainSettings

    monkeypatch.setattr(repeat, "fit", lambda run, argv=None: {"final": {"error": 0.1}})
    monkeypatch.setattr(repeat, "summarise", lambda *a: pytest.fail("rank 1 summarised"))
    monkeypatch.setattr(repeat, "env_ranks", lambda: (1, 2, 1))
    assert repeat.repeat_recipe(TrainSettings(), [1, 2], tmp_path) is None
    assert not (tmp_path / "summary.json").exists()
