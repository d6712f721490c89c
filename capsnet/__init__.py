"""capsnet: Capsule Networks (Sabour, Frosst & Hinton 2017) in PyTorch.

The library, bottom-up: ``config`` -> ``layers`` -> ``models`` -> ``tuning`` (speed by
measurement) -> ``data`` -> ``loading`` -> ``training`` (the one epoch driver) ->
``experiments``; using a model: ``inference``, ``preprocess``, ``routing_trace``, ``figures``,
``export``. The applications ``cli`` and ``web`` sit on top. See docs/architecture.md.
"""
__version__ = "0.1.0"

from capsnet.inference import predict  # noqa: E402
from capsnet.models import (  # noqa: E402
    CapsNet,
    CapsNetConfig,
    CNNBaseline,
    CNNConfig,
    build_model,
    make_config,
)

__all__ = ["CapsNet", "CapsNetConfig", "CNNBaseline", "CNNConfig", "build_model", "make_config",
           "predict", "__version__"]
