"""create_model / list_models: every listed name builds, overrides are checked, trained
weights come in eval mode."""
import pytest
import torch

from capsnet import CapsNet, CNNBaseline, EMCapsNet, create_model, list_models
from capsnet.config import PRESETS
from capsnet.pretrained import pretrained_names


def test_list_models_names_each_model_and_preset():
    names = list_models()
    for expected in ("capsnet", "cnn", "efficient", "em", "capsnet-small", "em-small",
                     "cnn-half", "cnn-tiny", "efficient-small"):
        assert expected in names
    assert "capsnet-paper" not in names  # the paper's sizes are the plain name
    assert len(names) == sum(len(sizes) for sizes in PRESETS.values())


def test_list_models_by_weights():
    assert list_models(pretrained=True) == sorted(pretrained_names())
    assert set(list_models(pretrained=False)) == set(list_models()) - set(pretrained_names())


@pytest.mark.parametrize("name, cls, expected", [
    ("capsnet-small", CapsNet, {"conv1_channels": 32, "primary_types": 8}),
    ("cnn-tiny", CNNBaseline, {"pool": 2, "conv_channels": (16, 32)}),
    ("em-small", EMCapsNet, {"caps1_types": 16}),
])
def test_create_model_builds_the_preset(name, cls, expected):
    model = create_model(name)
    assert type(model) is cls and model.training
    for field, value in expected.items():
        assert getattr(model.config, field) == value


def test_create_model_overrides_reach_the_config_and_the_forward():
    model = create_model("capsnet-small", num_classes=5, in_channels=3, image_size=32)
    out = model(torch.rand(2, 3, 32, 32))
    assert out.lengths.shape == (2, 5) and out.reconstructions.shape == (2, 3, 32, 32)


def test_an_unknown_override_names_the_valid_fields():
    with pytest.raises(ValueError, match=r"unknown capsnet config field\(s\) num_class; valid: "
                                         r"image_size, in_channels, num_classes"):
        create_model("capsnet", num_class=5)


def test_an_unknown_name_lists_the_models():
    with pytest.raises(ValueError, match=r"unknown model 'capsnet-huge'; choose from "
                                         r"capsnet, capsnet-cifar10"):
        create_model("capsnet-huge")


def test_pretrained_comes_in_eval_mode_and_takes_no_overrides():
    model = create_model("capsnet", pretrained=True)
    assert isinstance(model, CapsNet) and not model.training
    with pytest.raises(ValueError, match="takes no overrides, got num_classes"):
        create_model("capsnet", pretrained=True, num_classes=5)


def test_pretrained_without_weights_lists_those_that_have_them():
    name = list_models(pretrained=False)[0]
    with pytest.raises(ValueError, match=f"no pretrained weights named '{name}'; choose from"):
        create_model(name, pretrained=True)
