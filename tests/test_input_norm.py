"""Own data learns from the first epochs: per-image standardisation of the input, chosen by
the data (MNIST keeps the paper's raw pixels), the tiny CNN to compare with, the automatic
validation size of small sets."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from capsnet.data.model_view import conv1_stride_for, input_norm_for
from capsnet.layers.primary_caps import InputNorm, standardise_images
from capsnet.models import CapsNetConfig, build_model, make_config
from capsnet.training import TrainSettings, fit
from capsnet.training.settings import DEFAULT_VAL_SIZE, validation_size

SHAPES = ("box", "cross", "hbar", "vbar")
SIDE = 20  # the small preset's 9x9 kernels need 17 pixels at least


def test_standardise_images_by_hand():
    # one image, 2 channels of 2 pixels: channel means 2 and 10 are removed, then the image
    # is divided by its standard deviation over all 4 values (centred: -1, 1, -3, 3 -> sqrt 5)
    x = torch.tensor([[[[1.0, 3.0]], [[7.0, 13.0]]]])  # (1, 2, 1, 2)
    expected = torch.tensor([[[[-1.0, 1.0]], [[-3.0, 3.0]]]]) / math.sqrt(5.0)
    torch.testing.assert_close(standardise_images(x), expected)


def test_standardise_images_is_per_image_and_finite_for_flat_images():
    x = torch.rand(3, 3, 8, 8)
    x[1] = 0.7  # a flat image: its spread is floored, the result is zero, not NaN
    out = standardise_images(x)
    assert torch.isfinite(out).all() and out[1].abs().max() < 1e-5
    torch.testing.assert_close(out[0], standardise_images(x[:1])[0])  # no batch statistics
    torch.testing.assert_close(out[2].mean(dim=(1, 2)), torch.zeros(3), atol=1e-6, rtol=0)
    assert out[2].std(unbiased=False).item() == pytest.approx(1.0, abs=1e-5)
    # a colour cast or a brighter ground changes nothing
    torch.testing.assert_close(standardise_images(0.5 * x[2:] + 0.2), out[2:], atol=1e-5,
                               rtol=1e-5)


def test_input_norm_none_is_the_identity_and_bad_modes_are_refused():
    x = torch.rand(2, 1, 28, 28)
    assert InputNorm("none")(x) is x
    with pytest.raises(ValueError, match="input_norm"):
        InputNorm("batch")
    with pytest.raises(ValueError, match="input_norm"):
        CapsNetConfig(input_norm="dataset")


def test_the_data_chooses_the_input_norm():
    assert input_norm_for("mnist") == "none"  # the paper's model on the paper's data
    for dataset in ("folder", "fashion-mnist", "cifar10", "svhn"):
        assert input_norm_for(dataset) == "image"
    assert input_norm_for("folder", "none") == "none"
    assert input_norm_for("mnist", "image") == "image"
    with pytest.raises(ValueError, match="normalisation"):
        input_norm_for("folder", "per-pixel")


@pytest.mark.parametrize("side, stride, grid", [(28, 1, 6), (32, 1, 8), (48, 2, 6),
                                                (64, 3, 6), (96, 4, 7)])
def test_larger_images_of_other_data_take_a_larger_conv1_stride(side, stride, grid):
    """At most twice the paper's 6x6 primary cells (72): the smallest stride that gets there."""
    config = make_config("capsnet", image_size=side, in_channels=3)
    assert conv1_stride_for(config, "folder") == stride
    assert make_config("capsnet", image_size=side, conv1_stride=stride).primary_grid == grid
    if stride > 1:  # one less would leave more than twice the paper's cells
        assert make_config("capsnet", image_size=side,
                           conv1_stride=stride - 1).primary_grid ** 2 > 2 * 6 ** 2
    assert conv1_stride_for(config, "mnist") == 1  # digits keep the paper's Conv1 (affNIST 40)
    assert conv1_stride_for(config, "folder", 5) == 5  # what the user names wins
    with pytest.raises(ValueError, match="at least 1"):
        conv1_stride_for(config, "folder", 0)


def test_a_small_image_keeps_a_primary_grid():
    config = make_config("capsnet", "small", image_size=18)  # 1x1 at stride 1, none at 2
    assert conv1_stride_for(config, "folder") == 1
    assert CapsNetConfig(image_size=48, conv1_stride=2).smallest_image_size == 9 + 8 * 2
    with pytest.raises(ValueError, match="strides 3 and 2"):
        CapsNetConfig(image_size=30, conv1_stride=3)


def test_the_paper_model_is_unchanged():
    model = build_model(make_config("capsnet"))
    assert model.config.input_norm == "none"
    assert sum(p.numel() for p in model.parameters()) == 8_215_568
    assert not any("input_norm" in key for key in model.state_dict())  # no new weights


def test_an_image_norm_model_sees_standardised_pixels():
    torch.manual_seed(0)
    model = build_model(make_config("capsnet", "small", image_size=SIDE, in_channels=3,
                                    input_norm="image")).eval()
    x = torch.rand(2, 3, SIDE, SIDE)
    with torch.no_grad():
        raw = model(x)
        model.input_norm.mode = "none"
        by_hand = model(standardise_images(x))
    torch.testing.assert_close(raw.scores, by_hand.scores)
    assert raw.reconstructions.min() >= 0 and raw.reconstructions.max() <= 1  # raw pixels


def test_tiny_cnn_sizes():
    def count(**sizes):
        model = build_model(make_config("cnn", "tiny", **sizes))
        return sum(p.numel() for p in model.parameters())
    # conv 1->16 (416) + 16->32 (12,832) + FC 32*7*7->64 (100,416) + 64->10 (650)
    assert count() == 114_314
    assert count(image_size=32, in_channels=3) == 145_834
    with pytest.raises(ValueError, match="too small"):
        make_config("cnn", "tiny", image_size=3)


def test_validation_size_follows_the_pool():
    assert validation_size(None, 60_000) == DEFAULT_VAL_SIZE
    assert validation_size(None, 3_000) == 300
    assert validation_size(0, 3_000) == 0 and validation_size(123, 3_000) == 123


def write_shapes(root, per_class: int = 50, seed: int = 0) -> None:
    """Four outline shapes, each image's shape in one random colour on a ground of another
    (colour says nothing about the class): dense non-zero input, like photos."""
    rng = np.random.default_rng(seed)
    for name in SHAPES:
        (root / "train" / name).mkdir(parents=True)
        for i in range(per_class):
            alpha = np.zeros((SIDE, SIDE, 1), np.float32)
            r, c = rng.integers(3, 6, 2)
            if name == "hbar":
                alpha[r + 4:r + 7, c:c + 10] = 1
            elif name == "vbar":
                alpha[r:r + 10, c + 4:c + 7] = 1
            elif name == "box":
                alpha[r:r + 10, c:c + 10] = 1
                alpha[r + 2:r + 8, c + 2:c + 8] = 0
            else:
                alpha[r + 4:r + 6, c:c + 10] = 1
                alpha[r:r + 10, c + 4:c + 6] = 1
            ink, ground = rng.integers(0, 256, (2, 3))
            pixels = (alpha * ink + (1 - alpha) * ground).astype(np.uint8)  # (H, W, 3)
            Image.fromarray(pixels).save(root / "train" / name / f"{i}.png")


@pytest.mark.slow
def test_a_colour_folder_leaves_chance_with_the_defaults(tmp_path):
    # With the paper's raw pixels (--input-norm none) this run stays at 25% (chance): every
    # class capsule as long as the others. With the defaults it learns the shapes.
    write_shapes(tmp_path / "data")
    results = fit(TrainSettings(dataset="folder", data_dir=str(tmp_path / "data"),
                                preset="small", epochs=10, batch_size=16, val_size=40,
                                out_dir=str(tmp_path / "run"), progress=False,
                                precision="fp32"), log=lambda _: None)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["model_config"]["input_norm"] == "image"
    assert config["model_config"]["conv1_stride"] == 1  # 20x20: the paper's Conv1
    test_images = 20
    right = round(results["best"]["accuracy"] * test_images)  # accuracy is a float32
    assert right >= 9  # chance is 5 of 20; 9 or more by chance: about 4%
