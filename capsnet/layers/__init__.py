"""Reusable capsule layers, bottom-up: squash -> PrimaryCaps -> DigitCaps (routed by a
:mod:`capsnet.routing` router) -> Decoder; matrix capsules (Hinton et al. 2018) beside them."""
from capsnet.layers.decoder import Decoder
from capsnet.layers.digit_caps import DigitCaps
from capsnet.layers.gemm_conv import GemmConv2d
from capsnet.layers.input_norm import InputNorm
from capsnet.layers.primary_caps import PrimaryCaps
from capsnet.squashing import full_precision, squash

__all__ = ["Decoder", "DigitCaps", "GemmConv2d", "InputNorm", "PrimaryCaps", "full_precision",
           "squash"]
