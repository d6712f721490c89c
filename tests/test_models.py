"""Model assemblies: configs and derived sizes, shapes through every layer, parameter counts,
gradient flow, extreme inputs, decoder masking."""
from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from capsnet.config import ConfigError, config_to_dict
from capsnet.losses import model_loss
from capsnet.models import (
    CapsNet,
    CapsNetConfig,
    CNNBaseline,
    CNNConfig,
    ModelOutput,
    build_model,
    class_scores,
    config_from_dict,
    count_parameters,
    make_config,
    model_name_of,
)


@pytest.fixture(scope="module")
def paper_capsnet() -> CapsNet:
    torch.manual_seed(0)
    return CapsNet(make_config("capsnet", "paper"))


def small_model(name: str, **overrides):
    torch.manual_seed(0)
    return build_model(make_config(name, "small", **overrides))


# --- configs ------------------------------------------------------------------------------

@pytest.mark.parametrize("image_size, conv1_grid, primary_grid, num_primary", [
    (28, 20, 6, 1152),  # MNIST: 32 x 6 x 6
    (36, 28, 10, 3200),  # MultiMNIST: 32 x 10 x 10
    (40, 32, 12, 4608),  # affNIST: (32 - 9) // 2 + 1 = 12, so 32 x 12 x 12
])
def test_num_primary_caps_is_derived(image_size, conv1_grid, primary_grid, num_primary):
    config = make_config("capsnet", image_size=image_size)
    assert (config.conv1_grid, config.primary_grid, config.num_primary_caps) == (
        conv1_grid, primary_grid, num_primary)
    assert config.num_pixels == image_size**2


def test_num_primary_caps_agrees_with_the_convolutions():
    config = make_config("capsnet", "small", image_size=36)
    model = CapsNet(config)
    u = model.primary_caps(torch.relu(model.conv1(torch.rand(1, 1, 36, 36))))  # (1, 800, 8)
    assert u.shape == (1, config.num_primary_caps, config.primary_dim)
    assert config.num_primary_caps == config.primary_types * 10 * 10


def test_make_config_presets_and_errors():
    assert make_config("capsnet") == CapsNetConfig()
    assert make_config("cnn") == CNNConfig()
    small = make_config("capsnet", "small", routing_iterations=1)
    assert small.conv1_channels < CapsNetConfig().conv1_channels and small.routing_iterations == 1
    with pytest.raises(ValueError, match="unknown model 'resnet'; choose from capsnet, cnn"):
        make_config("resnet")
    with pytest.raises(ValueError, match="unknown preset 'huge' for capsnet; choose from paper"):
        make_config("capsnet", "huge")
    with pytest.raises(ValueError, match="unknown preset 'half' for em; choose from paper, small"):
        make_config("em", "half")
    with pytest.raises(ValueError, match="too small"):
        make_config("capsnet", image_size=12)
    with pytest.raises(ValueError, match="routing_iterations"):
        make_config("capsnet", routing_iterations=0)


@pytest.mark.parametrize("model, options, match", [
    ("capsnet", {"num_clases": 5},
     "unknown option 'num_clases' for capsnet; choose from image_size, in_channels, num_classes"),
    ("efficient", {"routing": "inverted-attention"}, "unknown option 'routing' for efficient"),
    ("em", {"routing": "dynamic"}, "unknown option 'routing' for em"),
    ("cnn", {"routing": "dynamic"}, "unknown option 'routing' for cnn"),
    ("capsnet", {"routing": "em"}, "unknown routing 'em' for capsnet; choose from dynamic, "),
    ("capsnet", {"routing": "self-attention", "routing_iterations": 2},
     "self-attention routing takes no routing_iterations; it is an option of dynamic, "
     "inverted-attention routing"),
    ("capsnet", {"routing": "inverted-attention", "none_of_the_above": True},
     "inverted-attention routing takes no none_of_the_above; it is an option of dynamic"),
])
def test_an_option_the_model_cannot_honour_is_one_error_naming_the_choices(model, options,
                                                                            match):
    with pytest.raises(ConfigError, match=re.escape(match)) as caught:
        make_config(model, **options)
    assert "\n" not in str(caught.value)


def test_a_preset_value_is_no_option_given():
    """The cifar10 preset's none-of-the-above category is the preset's, not the caller's:
    another router drops it without complaint only because the caller did not ask for it."""
    config = make_config("capsnet", "cifar10", routing="inverted-attention")
    assert config.routing == "inverted-attention" and config.none_of_the_above


@pytest.mark.parametrize("name", ["capsnet", "cnn"])
def test_config_dict_round_trip(name):
    config = make_config(name, "small", image_size=32, num_classes=5)
    values = config_to_dict(config)
    assert config_from_dict(name, values) == config
    with pytest.raises(ValueError, match="unknown"):
        config_from_dict(name, {**values, "bogus": 1})


# --- shapes -------------------------------------------------------------------------------

@pytest.mark.parametrize("B", [1, 2])
def test_shapes_through_every_layer_of_the_paper_capsnet(paper_capsnet, B):
    model = paper_capsnet
    x = torch.rand(B, 1, 28, 28)
    with torch.no_grad():
        h = torch.relu(model.conv1(x))
        assert h.shape == (B, 256, 20, 20)
        u = model.primary_caps(h)
        assert u.shape == (B, 1152, 8)
        u_hat = model.digit_caps.predictions(u)
        assert u_hat.shape == (B, 10, 1152, 16)  # output-major for the routing
        v = model.digit_caps(u).poses
        assert v.shape == (B, 10, 16)
        recon = model.decoder(v, torch.zeros(B, dtype=torch.long))
        assert recon.shape == (B, 1, 28, 28)
        out = model(x)
    assert isinstance(out, ModelOutput) and out.loss == "margin"
    assert out.scores.shape == (B, 10) and out.poses.shape == (B, 10, 16)
    assert out.reconstructions.shape == (B, 1, 28, 28)
    torch.testing.assert_close(out.poses, v)
    torch.testing.assert_close(out.scores, v.norm(dim=-1))
    assert ((out.scores >= 0) & (out.scores < 1)).all()


@pytest.mark.parametrize("B", [1, 3])
def test_small_models_at_other_sizes(B):
    capsnet = small_model("capsnet", image_size=36, num_classes=4)
    out = capsnet(torch.rand(B, 1, 36, 36), torch.zeros(B, dtype=torch.long))
    assert out.scores.shape == (B, 4) and out.reconstructions.shape == (B, 1, 36, 36)
    cnn = small_model("cnn", image_size=36, num_classes=4)
    out = cnn(torch.rand(B, 1, 36, 36))
    assert out.logits.shape == (B, 4) and out.loss == "cross_entropy"
    torch.testing.assert_close(out.scores, torch.softmax(out.logits, dim=-1))


def test_capsnet_without_decoder():
    model = small_model("capsnet", use_decoder=False)
    assert model.decoder is None
    out = model(torch.rand(2, 1, 28, 28))
    assert out.reconstructions is None and out.scores.shape == (2, 10)


def test_class_scores():
    lengths = torch.rand(2, 10)
    assert class_scores(ModelOutput(lengths, torch.zeros(2, 10, 16))) is lengths


def test_build_model_and_names():
    assert isinstance(build_model(make_config("capsnet", "small")), CapsNet)
    assert isinstance(build_model(make_config("cnn", "small")), CNNBaseline)
    assert model_name_of(CNNConfig()) == "cnn"
    with pytest.raises(TypeError):
        model_name_of(dataclasses.make_dataclass("Other", [])())


# --- parameter counts ---------------------------------------------------------------------

def test_paper_capsnet_parameter_count(paper_capsnet):
    # Conv1 20,992 + PrimaryCaps 5,308,672 + DigitCaps W 1152*10*16*8 = 1,474,560: 6,804,224;
    # decoder 160*512+512 + 512*1024+1024 + 1024*784+784 = 1,411,344.
    assert count_parameters(paper_capsnet) == 8_215_568
    assert count_parameters(paper_capsnet) - count_parameters(paper_capsnet.decoder) == 6_804_224
    assert paper_capsnet.digit_caps.W.numel() == 1152 * 10 * 16 * 8
    no_decoder = CapsNet(make_config("capsnet", use_decoder=False))
    assert count_parameters(no_decoder) == 6_804_224


def test_paper_cnn_parameter_count():
    with torch.device("meta"):  # sizes only, no 35M-parameter initialisation
        cnn = CNNBaseline(make_config("cnn"))
    assert count_parameters(cnn) == 35_445_522  # "35.4M" in the paper


def test_half_cnn_on_the_affnist_canvas_has_about_the_paper_cnn_parameter_count():
    with torch.device("meta"):
        full = CNNBaseline(make_config("cnn", image_size=40))
        half = CNNBaseline(make_config("cnn", "half", image_size=40))
    # Convs 1*128*25+128 + 128*128*25+128 + 128*64*25+64 = 617,920; FC 64*40*40*328+328 =
    # 33,587,528; 328*192+192 = 63,168; 192*10+10 = 1,930.
    assert count_parameters(half) == 34_270_546
    assert count_parameters(full) == 69_704_466  # FC 128*40*40*328+328 = 67,174,728 of it


# --- gradients and extreme inputs ---------------------------------------------------------

def assert_every_parameter_has_a_gradient(model: torch.nn.Module) -> None:
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name} received no gradient"
        assert torch.isfinite(p.grad).all(), f"{name} has a non-finite gradient"
        assert p.grad.abs().sum() > 0, f"{name} has an all-zero gradient"


@pytest.mark.parametrize("preset", ["small", "paper"])
def test_every_capsnet_parameter_gets_a_gradient(preset):
    torch.manual_seed(0)
    model = CapsNet(make_config("capsnet", preset))
    x, y = torch.rand(2, 1, 28, 28), torch.tensor([3, 7])
    model_loss(model(x, y), x, y).backward()
    assert_every_parameter_has_a_gradient(model)


def test_every_cnn_parameter_gets_a_gradient():
    model = small_model("cnn").train()
    x, y = torch.rand(4, 1, 28, 28), torch.tensor([0, 1, 2, 3])
    model_loss(model(x, y), x, y).backward()
    assert_every_parameter_has_a_gradient(model)


@pytest.mark.parametrize("name", ["capsnet", "cnn"])
@pytest.mark.parametrize("fill", [0.0, 1e6, -1e6])
def test_extreme_inputs_give_finite_outputs_and_gradients(name, fill):
    model = small_model(name)
    x, y = torch.full((2, 1, 28, 28), fill), torch.tensor([1, 2])
    out = model(x, y)
    scores = class_scores(out)
    assert torch.isfinite(scores).all()
    loss = model_loss(out, x, y)
    assert torch.isfinite(loss)
    loss.backward()
    for param_name, p in model.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), param_name


def test_random_huge_inputs_in_the_paper_capsnet(paper_capsnet):
    x = torch.randn(1, 1, 28, 28) * 1e6
    with torch.no_grad():
        out = paper_capsnet(x)
    assert torch.isfinite(out.scores).all() and torch.isfinite(out.reconstructions).all()
    assert (out.scores <= 1).all()


# --- decoder masking in the model ---------------------------------------------------------

def test_reconstruction_uses_the_label_when_given_else_the_longest_capsule():
    model = small_model("capsnet").eval()
    x = torch.rand(3, 1, 28, 28)
    with torch.no_grad():
        model.digit_caps.W.mul_(30)  # lengths ~0.5 instead of ~1e-4 at initialisation
        free = model(x)
        predicted = free.scores.argmax(-1)  # (3,)
        other = (predicted + 1) % 10
        guided = model(x, other)
        torch.testing.assert_close(free.reconstructions, model.decoder(free.poses, predicted))
        torch.testing.assert_close(guided.reconstructions, model.decoder(guided.poses, other))
        torch.testing.assert_close(guided.poses, free.poses)  # labels only steer the decoder
        assert not torch.allclose(guided.reconstructions, free.reconstructions)
        # Capsules other than the selected one do not reach the decoder.
        poses = free.poses.clone()
        poses[torch.arange(3), other] += 0.5
        torch.testing.assert_close(model.decoder(poses, predicted), free.reconstructions,
                                   rtol=0, atol=0)


def test_run_settings_check_the_options_they_name_not_the_sizes_the_data_decides():
    """A stride too large for the preset's 28x28 default may suit the run's images: the
    settings check which options the model takes; the sizes are checked at the data's size."""
    from capsnet.training.settings import TrainSettings

    assert TrainSettings(conv1_stride=3).model_options() == {"conv1_stride": 3}
    assert TrainSettings(model="em").model_options() == {}  # the defaults name nothing
    with pytest.raises(ConfigError, match="unknown option 'conv1_stride' for cnn"):
        TrainSettings(model="cnn", conv1_stride=3)
    with pytest.raises(ConfigError, match="self-attention routing takes no routing_iterations"):
        TrainSettings(routing="self-attention", routing_iterations=2)


def test_the_old_output_names_still_work_for_one_release_and_say_so():
    out = small_model("em")(torch.rand(2, 1, 28, 28))
    with pytest.warns(DeprecationWarning, match="use .scores"):
        assert out.activations is out.scores
    with pytest.warns(DeprecationWarning, match="use .scores"):
        assert out.lengths is out.scores
    with pytest.warns(DeprecationWarning, match="every model returns ModelOutput"):
        from capsnet.models import CapsuleOutput
    assert CapsuleOutput is ModelOutput
