"""The local web demo: draw or upload a digit, see its capsules, move their poses."""
from capsnet.web.app import create_app, make_server

__all__ = ["create_app", "make_server"]
