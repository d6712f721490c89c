"""Reusable capsule layers, bottom-up: squash -> PrimaryCaps -> routing -> DigitCaps -> Decoder;
EM routing and matrix capsules (Hinton et al. 2018) beside them."""
from capsnet.layers.decoder import Decoder
from capsnet.layers.digit_caps import DigitCaps
from capsnet.layers.em_routing import EMRouter
from capsnet.layers.gemm_conv import GemmConv2d
from capsnet.layers.input_norm import InputNorm
from capsnet.layers.primary_caps import PrimaryCaps
from capsnet.layers.routing import dynamic_routing
from capsnet.layers.squash import full_precision, squash

__all__ = ["Decoder", "DigitCaps", "EMRouter", "GemmConv2d", "InputNorm", "PrimaryCaps",
           "dynamic_routing", "full_precision", "squash"]
