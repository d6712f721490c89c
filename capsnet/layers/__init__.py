"""Reusable capsule layers, bottom-up: squash -> PrimaryCaps -> routing -> DigitCaps -> Decoder.

Importing the package registers every router (capsnet.layers.router.ROUTERS)."""
from capsnet.layers.attention_routing import InvertedAttentionRouter
from capsnet.layers.decoder import Decoder
from capsnet.layers.digit_caps import DigitCaps
from capsnet.layers.gemm_conv import GemmConv2d
from capsnet.layers.input_norm import InputNorm
from capsnet.layers.primary_caps import PrimaryCaps
from capsnet.layers.router import ROUTERS, Routed, Router, router_class
from capsnet.layers.routing import DynamicRouter, dynamic_routing
from capsnet.layers.squash import full_precision, squash

__all__ = ["ROUTERS", "Decoder", "DigitCaps", "DynamicRouter", "GemmConv2d", "InputNorm",
           "InvertedAttentionRouter", "PrimaryCaps", "Routed", "Router", "dynamic_routing",
           "full_precision", "router_class", "squash"]
