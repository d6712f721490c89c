"""Reusable capsule layers, bottom-up: squash -> PrimaryCaps -> routing -> DigitCaps -> Decoder;
EM routing and matrix capsules (Hinton et al. 2018) beside them.

Importing the package registers every router (capsnet.layers.router.ROUTERS)."""
from capsnet.layers.attention_routing import InvertedAttentionRouter
from capsnet.layers.decoder import Decoder
from capsnet.layers.digit_caps import DigitCaps
from capsnet.layers.em_routing import EMRouter
from capsnet.layers.gemm_conv import GemmConv2d
from capsnet.layers.input_norm import InputNorm
from capsnet.layers.primary_caps import PrimaryCaps
from capsnet.layers.router import ROUTERS, Routed, Router, capsnet_routers, router_class
from capsnet.layers.routing import DynamicRouter, dynamic_routing
from capsnet.layers.self_attention_routing import SelfAttentionRouter
from capsnet.layers.squash import full_precision, squash

__all__ = ["ROUTERS", "Decoder", "DigitCaps", "DynamicRouter", "EMRouter", "GemmConv2d",
           "InputNorm", "InvertedAttentionRouter", "PrimaryCaps", "Routed", "Router",
           "SelfAttentionRouter", "capsnet_routers", "dynamic_routing", "full_precision",
           "router_class", "squash"]
