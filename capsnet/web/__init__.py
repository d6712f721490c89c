"""The local web demo: draw or upload a digit, see its capsules, move their poses.
Needs Flask (``pip install "capsnet[web]"``), else MissingExtraError."""
from capsnet.extras import require_extra

require_extra("web")
from capsnet.web.app import create_app, make_server  # noqa: E402  (after the check)

__all__ = ["create_app", "make_server"]
