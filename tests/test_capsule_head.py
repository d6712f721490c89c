"""Capsule heads on a backbone (capshead, its linear baseline stemcnn), the size check before
allocation, and the model and batch size own data gets."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import capsnet
from capsnet.config import ConfigError
from capsnet.data.model_view import batch_size_for, model_for_data
from capsnet.losses import model_loss
from capsnet.models import build_model, count_parameters, make_config
from capsnet.models.capsule_head import (
    CapsuleHeadConfig,
    CapsuleHeadNet,
    calibrate_lengths,
    feature_shape,
)
from capsnet.models.sizing import check_fits, parameter_count, traced_peak_bytes
from capsnet.routing import ROUTERS

SIDE = 32


def images(batch: int = 4, channels: int = 3, side: int = SIDE) -> torch.Tensor:
    return torch.rand(batch, channels, side, side)


def assert_trains_a_step(model: nn.Module, x: torch.Tensor, classes: int) -> None:
    """Forward, backward: the right shapes, no NaN, every parameter gets a gradient."""
    labels = torch.arange(len(x)) % classes
    out = model(x, labels)
    loss = model_loss(out, x, labels)
    loss.backward()
    assert torch.isfinite(loss)
    assert out.scores.shape == (len(x), classes)
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, missing


@pytest.mark.parametrize("name", ["capshead", "capshead-small", "capshead-deep", "capshead-conv",
                                  "stemcnn", "stemcnn-small"])
def test_every_new_model_trains_a_step(name):
    torch.manual_seed(0)
    side = 40 if name == "capshead-conv" else SIDE
    model = capsnet.create_model(name, image_size=side, in_channels=3, num_classes=5)
    assert_trains_a_step(model, images(side=side), 5)


@pytest.mark.parametrize("routing", sorted(ROUTERS))
def test_every_router_routes_a_deep_head(routing):
    torch.manual_seed(1)
    model = capsnet.create_model("capshead-deep", image_size=SIDE, in_channels=3, num_classes=4,
                                 routing=routing, routing_iterations=2, stem_width=8,
                                 conv_caps=(4, 4), primary_types=4)
    assert len(model.head.conv_caps) == 2  # three routed layers with the classes
    assert_trains_a_step(model, images(), 4)


def test_any_module_is_a_backbone_and_a_wrong_one_is_one_line():
    config = CapsuleHeadConfig(image_size=SIDE, in_channels=3, num_classes=3)
    backbone = nn.Sequential(nn.Conv2d(3, 12, 5, stride=4), nn.ReLU())
    model = CapsuleHeadNet(config, backbone=backbone)
    assert feature_shape(backbone, 3, SIDE) == (12, 7, 7)
    assert_trains_a_step(model, images(), 3)
    pooled = nn.Sequential(nn.Conv2d(3, 12, 5), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    with pytest.raises(ValueError, match=r"needs a backbone that returns feature maps .* got "
                                         r"\(1, 12\): cut off its pooling"):
        CapsuleHeadNet(config, backbone=pooled)


def test_backbone_weights_load_from_a_file(tmp_path):
    first = capsnet.create_model("capshead-small", image_size=SIDE, in_channels=3, num_classes=3)
    path = tmp_path / "stem.pt"
    torch.save(first.backbone.state_dict(), path)
    second = capsnet.create_model("capshead-small", image_size=SIDE, in_channels=3,
                                  num_classes=3, backbone_weights=str(path))
    for a, b in zip(first.backbone.state_dict().values(), second.backbone.state_dict().values(),
                    strict=True):
        torch.testing.assert_close(a, b)


def test_the_224_pixel_1000_class_model_is_small_and_its_memory_estimated():
    config = make_config("capshead", image_size=224, in_channels=3, num_classes=1000)
    parameters = parameter_count(config)  # on the meta device: nothing allocated
    assert parameters < 5_000_000
    with torch.device("meta"):
        model = capsnet.create_model("capshead", image_size=224, in_channels=3, num_classes=1000)
    assert count_parameters(model) == parameters
    assert model.head.class_caps.W.shape == (16, 1000, 16, 8)  # per type, not per position
    training, evaluation = traced_peak_bytes(build_model(config), 16, 16)  # shapes only
    assert 0 < evaluation < training < 16 * 2 ** 30


def test_an_impossible_size_is_one_clear_line():
    with pytest.raises(ConfigError, match=r"^capsnet for 224x224x3 images with 1000 classes "
                                          r"needs 44,470,716,160 parameters \(165\.7 GiB of "
                                          r"weights.*use 'capshead'") as error:
        capsnet.create_model("capsnet", image_size=224, in_channels=3, num_classes=1000)
    assert "\n" not in str(error.value)


def test_a_wasteful_size_warns():
    config = make_config("capsnet", image_size=128, in_channels=3, num_classes=20)
    with pytest.warns(UserWarning, match=r"has 313,342,720 parameters; 'capshead'"):
        check_fits(config, "capsnet")  # counted on the meta device: nothing allocated


def test_own_data_picks_a_model_that_scales():
    assert model_for_data(28, 10) == "capsnet" and model_for_data(48, 99) == "capsnet"
    assert model_for_data(64, 10) == "capshead" and model_for_data(32, 100) == "capshead"
    large = capsnet.create_model("auto", image_size=128, in_channels=3, num_classes=20)
    assert isinstance(large, CapsuleHeadNet) and count_parameters(large) < 2_000_000
    assert type(capsnet.create_model("auto")).__name__ == "CapsNet"
    # as capsnet train: own data's Conv1 stride follows the image size
    assert capsnet.create_model("capsnet-small", image_size=48, dataset="folder",
                                in_channels=3).config.conv1_stride == 2


def test_a_small_folder_gets_enough_steps():
    assert batch_size_for(450, 128) == 16  # 28 steps an epoch instead of 4
    assert batch_size_for(60_000, 128) == 128
    assert batch_size_for(50, 128) == 8 and batch_size_for(50, 4) == 4


def test_calibration_starts_every_routed_layer_at_half_length():
    torch.manual_seed(2)
    model = capsnet.create_model("capshead-deep", image_size=SIDE, in_channels=3, num_classes=4,
                                 stem_width=8, conv_caps=(4, 4), primary_types=4)
    x = images(32)
    calibrate_lengths(model, x)
    with torch.no_grad():
        outputs = model.head.layer_outputs(model.features(x))
    for _, lengths in outputs[1:]:
        assert 0.3 < lengths.mean() < 0.7


def test_capsnet_train_takes_the_head_by_name_and_its_checkpoint_rebuilds(tmp_path):
    from capsnet.checkpoint import load_model
    from capsnet.cli.main import main
    from tests.test_own_data import RGB_CLASSES, make_folder, train_folder
    data = make_folder(tmp_path / "rgb", RGB_CLASSES[:3], per_class=6, size=(40, 40))
    out = tmp_path / "run"
    assert main(train_folder(data, out, "--model", "capshead")) == 0
    model = load_model(out / "best.pt")
    assert isinstance(model, CapsuleHeadNet) and model.config.class_names == tuple(RGB_CLASSES[:3])
    assert model(images(2, side=40)).scores.shape == (2, 3)


def test_the_head_takes_a_bf16_backbone():
    """Training's bf16 autocast: the backbone in bf16, the capsules in float32."""
    model = capsnet.create_model("capshead-conv", image_size=40, in_channels=3, num_classes=3)
    model.compute_dtype = torch.bfloat16
    out = model(images(side=40))
    assert out.scores.dtype == torch.float32 and torch.isfinite(out.scores).all()


def test_training_an_impossible_size_is_one_line_before_anything_is_allocated():
    from capsnet.config import ConfigError
    from capsnet.training.optimisation import build_training
    from capsnet.training.settings import TrainSettings

    settings = TrainSettings(model="capsnet", progress=False)
    too_big = {"image_size": 224, "in_channels": 3, "num_classes": 1000}
    with pytest.raises(ConfigError, match="use 'capshead'"):
        build_training(settings, too_big, torch.device("cpu"))
