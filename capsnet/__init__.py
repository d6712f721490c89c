"""capsnet: Capsule Networks (Sabour, Frosst & Hinton 2017) in PyTorch.

    >>> import capsnet
    >>> model = capsnet.create_model("capsnet", pretrained=True)
    >>> out = model(images)  # images (B, 1, 28, 28) in [0, 1]
    >>> out.scores, out.reconstructions  # (B, 10) class scores, (B, 1, 28, 28)
    >>> capsnet.predict("my_digit.png").class_name
    '7'

``__all__`` is the public API (models and configs, models by name with trained weights,
layers and routers, losses, prediction, data and training), each name imported on first
use, so ``import capsnet`` imports neither torch nor the applications. See
docs/architecture.md and docs/usage.md."""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.2.0"

# public name -> the module that defines it, grouped as in the table above
_EXPORTS: dict[str, str] = {
    # models and configs
    **dict.fromkeys(("CapsNet", "CNNBaseline", "EfficientCapsNet", "EMCapsNet", "ModelOutput",
                     "build_model", "class_scores"), "capsnet.models"),
    **dict.fromkeys(("CapsNetConfig", "CNNConfig", "EfficientCapsNetConfig", "EMCapsNetConfig",
                     "make_config"), "capsnet.models"),
    # by name, with trained weights
    **dict.fromkeys(("create_model", "list_models", "load_pretrained", "pretrained_names"),
                    "capsnet.pretrained"),
    "load_model": "capsnet.checkpoint",
    # layers
    "squash": "capsnet.squashing",
    **dict.fromkeys(("PrimaryCaps", "DigitCaps", "LazyDigitCaps", "Decoder"), "capsnet.layers"),
    **dict.fromkeys(("Router", "Routed", "DynamicRouter", "EMRouter", "InvertedAttentionRouter",
                     "SelfAttentionRouter"), "capsnet.routing"),
    # losses
    **dict.fromkeys(("margin_loss", "reconstruction_loss", "capsule_loss", "spread_loss",
                     "model_loss"), "capsnet.losses"),
    # using a model
    **dict.fromkeys(("predict", "Prediction"), "capsnet.inference"),
    "to_model_input": "capsnet.data.image_dataset",
    "prepare_for_model": "capsnet.preprocess",
    "tune": "capsnet.tuning",
    # data and training
    "ImageDataset": "capsnet.data.image_dataset",
    "load_dataset": "capsnet.data.datasets",
    "fit": "capsnet.training.fit",
    "TrainSettings": "capsnet.training.settings",
}

__all__ = [*_EXPORTS, "__version__"]
# deprecated names (one release), not in __all__: every model returns ModelOutput
_DEPRECATED = dict.fromkeys(("CapsuleOutput", "MatrixCapsuleOutput"), "capsnet.models")


def __getattr__(name: str) -> Any:
    """Import a public name on first use (PEP 562); it is a plain attribute from then on."""
    if name in _DEPRECATED:  # warns on every use: not cached
        return getattr(importlib.import_module(_DEPRECATED[name]), name)
    if name not in _EXPORTS:
        raise AttributeError(f"module 'capsnet' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})

