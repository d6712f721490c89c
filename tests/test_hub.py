"""Models by one name: list_models and create_model read the registry (and the trained
weights for pretrained=True)."""
from __future__ import annotations

import pytest
import torch

from capsnet.config import ConfigError
from capsnet.models import CapsNet, CNNBaseline, EMCapsNet, make_config
from capsnet.pretrained import create_model, list_models


def test_list_models_names_every_preset_of_every_model():
    names = list_models()
    assert {"capsnet", "cnn", "efficient", "em", "capsnet-small", "em-small", "cnn-half",
            "cnn-tiny", "capsnet-cifar10", "capsnet-svhn"} <= set(names)
    assert "capsnet-paper" not in names and "em-half" not in names
    assert names == sorted(names) and len(names) == len(set(names))


def test_create_model_builds_the_preset_with_checked_overrides():
    model = create_model("em-small", routing_iterations=2)
    assert isinstance(model, EMCapsNet)
    assert model.config == make_config("em", "small", routing_iterations=2)
    assert isinstance(create_model("cnn-tiny"), CNNBaseline)
    with pytest.raises(ConfigError, match="unknown option 'num_clases' for capsnet"):
        create_model("capsnet-small", num_clases=5)
    with pytest.raises(ConfigError,
                       match="unknown model name 'em-half'; choose from capshead, .*capsnet, "):
        create_model("em-half")


def test_pretrained_capsnet_is_the_shipped_model():
    assert "capsnet" in list_models(pretrained=True)
    model = create_model("capsnet", pretrained=True)
    assert isinstance(model, CapsNet) and not model.training
    assert model.conv1.weight.dtype == torch.float32
    with pytest.raises(ConfigError, match="takes no config overrides"):
        create_model("capsnet", pretrained=True, routing="dynamic")
    with pytest.raises(ValueError, match="no pretrained weights named 'cnn-tiny'"):
        create_model("cnn-tiny", pretrained=True)
