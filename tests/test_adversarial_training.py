"""Adversarial training as a setting (`capsnet train --adversarial`): its checks, the batches
the loop trains on, and a short run from the command line."""
from __future__ import annotations

import json

import pytest
import torch

from capsnet.cli.main import main
from capsnet.models import build_model, make_config
from capsnet.training.loop import classification_batch
from capsnet.training.settings import TrainSettings

EPS = 0.1
SEED = 0


@pytest.mark.parametrize("values, message", [
    ({"adversarial": "fgsm"}, "choose from fgsm-rs, pgd"),
    ({"adversarial": "pgd"}, "positive eps"),
    ({"adversarial": "pgd", "adversarial_eps": 0.1, "adversarial_steps": 0}, "at least 1 step"),
    ({"adversarial_eps": 0.1}, "needs adversarial"),
    ({"adversarial": "pgd", "adversarial_eps": 0.1, "task": "affnist"}, "classification runs"),
])
def test_an_adversarial_training_that_cannot_run_is_one_line_naming_the_setting(values, message):
    with pytest.raises(ValueError, match=message):
        TrainSettings(model="cnn", **values)


@pytest.mark.parametrize("kind", ["fgsm-rs", "pgd"])
def test_the_loop_trains_on_attacked_images_within_eps_of_the_augmented_ones(kind):
    torch.manual_seed(SEED)
    model = build_model(make_config("cnn", "tiny"))
    images = torch.randint(0, 256, (8, 28, 28), dtype=torch.uint8)
    labels = torch.arange(8) % 10
    idx = torch.arange(8)

    def batch(**adversarial):
        generator = torch.Generator().manual_seed(SEED)  # the same shifts for both
        return classification_batch(model, images, labels, generator, max_shift=2,
                                    **adversarial)(idx)

    (clean, y), (attacked, y_attacked) = batch(), batch(adversarial=kind, adversarial_eps=EPS,
                                                       adversarial_steps=3)
    distance = (attacked - clean).abs().amax()
    assert torch.equal(y, y_attacked)
    assert 0 < distance <= EPS + 1e-6
    assert attacked.min() >= 0 and attacked.max() <= 1


def test_capsnet_train_adversarial_runs_and_records_the_setting(tiny_mnist_dir, tmp_path):
    run = tmp_path / "adv"
    assert main(["train", "--model", "cnn", "--preset", "tiny", "--data-dir", str(tiny_mnist_dir),
                 "--no-download", "--epochs", "1", "--val-size", "100", "--batch-size", "50",
                 "--out-dir",
                 str(run), "--no-progress", "--adversarial", "fgsm-rs", "--adversarial-eps",
                 "0.3"]) == 0
    settings = json.loads((run / "config.json").read_text())["settings"]
    assert (settings["adversarial"], settings["adversarial_eps"]) == ("fgsm-rs", 0.3)
    assert json.loads((run / "results.json").read_text())["complete"]
