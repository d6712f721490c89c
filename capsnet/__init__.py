"""capsnet: Capsule Networks (Sabour, Frosst & Hinton 2017) in PyTorch.

The library, bottom-up: ``config`` -> ``layers`` -> ``models`` -> ``tuning`` (precision and
convolution path by a rule, memory measured) -> ``data`` -> ``loading`` -> ``training`` (the
one epoch driver) -> ``experiments``; using a model: ``inference``, ``preprocess``,
``routing_trace``, ``figures``, ``export``. The applications ``cli`` and ``web`` sit on top.
See docs/architecture.md.
"""
__version__ = "0.1.0"

from capsnet.config import CapsNetConfig, CNNConfig, make_config  # noqa: E402
from capsnet.inference import predict  # noqa: E402
from capsnet.models import CapsNet, CNNBaseline, build_model  # noqa: E402

__all__ = ["CapsNet", "CapsNetConfig", "CNNBaseline", "CNNConfig", "build_model", "make_config",
           "predict", "__version__"]
