"""The CNN baseline's two controls for the adversarial lab: per-image standardisation
(``input_norm``, raw pixels unless asked for) and the capsule head (squashed class vectors,
the margin loss), each against the plain CNN it must leave unchanged."""
from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import torch

from capsnet.cli.main import main
from capsnet.config import ConfigError
from capsnet.export import describe
from capsnet.layers.primary_caps import standardise_images
from capsnet.losses import margin_loss, model_loss
from capsnet.models import build_model, make_config
from capsnet.training.fit import data_overrides
from capsnet.training.settings import TrainSettings

B, CLASSES, CAPSULE_DIM = 4, 10, 16
SEED = 0
# The tiny CNN's parameters, as before either option existed (no new weights by default).
TINY_CNN_WEIGHTS = {"features.0.weight", "features.0.bias", "features.3.weight",
                    "features.3.bias", "classifier.0.weight", "classifier.0.bias",
                    "classifier.3.weight", "classifier.3.bias"}


def tiny_cnn(**options) -> torch.nn.Module:
    torch.manual_seed(SEED)
    return build_model(make_config("cnn", "tiny", **options)).eval()


def test_the_default_cnn_is_unchanged_raw_pixels_and_a_linear_head():
    config = make_config("cnn", "tiny")
    assert (config.input_norm, config.head) == ("none", "linear")
    model = tiny_cnn()
    assert set(model.state_dict()) == TINY_CNN_WEIGHTS
    x = torch.rand(B, 1, 28, 28)
    out, explicit = model(x), tiny_cnn(input_norm="none", head="linear")(x)
    assert torch.equal(out.logits, explicit.logits)
    assert out.loss == "cross_entropy" and out.poses is None


def test_an_image_norm_cnn_is_the_raw_cnn_on_standardised_images():
    x = torch.rand(B, 1, 28, 28)
    normed = tiny_cnn(input_norm="image")
    assert set(normed.state_dict()) == TINY_CNN_WEIGHTS  # the norm has no parameters
    expected = tiny_cnn()(standardise_images(x)).logits
    assert torch.allclose(normed(x).logits, expected)
    assert not torch.allclose(normed(x).logits, tiny_cnn()(x).logits)


@pytest.mark.parametrize("model, dataset, requested, expected", [
    ("cnn", "fashion-mnist", "auto", "none"),  # never standardised silently off MNIST
    ("cnn", "fashion-mnist", "image", "image"),
    ("cnn", "mnist", "auto", "none"),
    ("capsnet", "fashion-mnist", "auto", "image"),  # the CapsNet's data rule is kept
    ("capsnet", "fashion-mnist", "none", "none"),
])
def test_the_data_does_not_switch_the_cnn_to_standardised_pixels(model, dataset, requested,
                                                                  expected):
    settings = TrainSettings(model=model, dataset=dataset, input_norm=requested)
    train = SimpleNamespace(channels=1, classes=[str(k) for k in range(CLASSES)],
                            image_size=(28, 28))
    assert data_overrides(settings, train, image_size=28)["input_norm"] == expected


def test_the_capsule_head_gives_squashed_class_vectors_and_the_margin_loss():
    model = tiny_cnn(head="capsules").train()
    x, y = torch.rand(B, 1, 28, 28), torch.arange(B) % CLASSES
    out = model(x)
    assert out.poses.shape == (B, CLASSES, CAPSULE_DIM)
    assert out.scores.shape == (B, CLASSES) and out.logits is None
    assert torch.allclose(out.scores, out.poses.norm(dim=-1))
    assert (out.scores >= 0).all() and (out.scores < 1).all()
    assert out.loss == "margin"
    loss = model_loss(out, x, y)
    assert torch.allclose(loss, margin_loss(out.scores, y))
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_the_capsule_head_learns_a_fixed_batch():
    """A few Adam steps on one batch of bar images (class k: a bright bar at row 4 + 2k, on
    noise): the margin loss halves and the batch is classified."""
    model = tiny_cnn(head="capsules", dropout=0.0).train()
    generator = torch.Generator().manual_seed(SEED)
    y = torch.arange(2 * CLASSES) % CLASSES
    x = 0.2 * torch.rand(len(y), 1, 28, 28, generator=generator)
    for i, k in enumerate(y.tolist()):
        x[i, 0, 4 + 2 * k:6 + 2 * k, 4:24] = 1.0
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(30):
        optimiser.zero_grad()
        loss = model_loss(model(x), x, y)
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert (model.eval()(x).scores.argmax(dim=-1) == y).float().mean() > 0.5


def test_the_capsule_head_with_a_decoder_is_one_line_naming_the_fix():
    with pytest.raises(ConfigError, match=re.escape("the CNN's capsule head takes no decoder "
                                                    "(given: 'plain')")) as caught:
        make_config("cnn", "tiny", head="capsules", decoder="plain")
    assert "\n" not in str(caught.value)
    with pytest.raises(ValueError, match="unknown CNN head 'caps'; choose from linear, capsules"):
        make_config("cnn", "tiny", head="caps")


def test_capsnet_train_records_both_options_and_the_capsule_cnn_learns(tiny_mnist_dir,
                                                                        tmp_path):
    run = tmp_path / "caps-cnn"
    assert main(["train", "--model", "cnn", "--preset", "tiny", "--cnn-head", "capsules",
                 "--input-norm", "image", "--data-dir", str(tiny_mnist_dir), "--no-download",
                 "--epochs", "3", "--val-size", "100", "--batch-size", "50", "--lr", "0.003",
                 "--out-dir", str(run), "--no-progress"]) == 0
    saved = json.loads((run / "config.json").read_text())["model_config"]
    assert (saved["head"], saved["input_norm"]) == ("capsules", "image")
    accuracy = json.loads((run / "results.json").read_text())["final"]["accuracy"]
    assert accuracy > 0.3  # chance is 0.1 on the fake digits


def test_an_exported_capsule_head_names_its_scores_lengths():
    assert describe(tiny_cnn(head="capsules"))["outputs"] == ["lengths"]
    assert describe(tiny_cnn())["outputs"] == ["probabilities"]
