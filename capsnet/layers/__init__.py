"""Reusable capsule layers, bottom-up: squash -> PrimaryCaps -> DigitCaps (routed by a
:mod:`capsnet.routing` router) -> Decoder; matrix capsules (Hinton et al. 2018) beside them."""
from capsnet.layers.conv_caps import ConvCapsules, SharedClassCapsules
from capsnet.layers.decoder import Decoder
from capsnet.layers.digit_caps import DigitCaps, LazyDigitCaps
from capsnet.layers.gemm_conv import GemmConv2d
from capsnet.layers.primary_caps import DepthwisePrimaryCaps, InputNorm, PrimaryCaps
from capsnet.layers.routed_caps import CapsuleLayer
from capsnet.layers.stem import ResidualStem
from capsnet.squashing import full_precision, squash

__all__ = ["CapsuleLayer", "ConvCapsules", "Decoder", "DepthwisePrimaryCaps", "DigitCaps",
           "GemmConv2d", "InputNorm", "LazyDigitCaps", "PrimaryCaps", "ResidualStem",
           "SharedClassCapsules", "full_precision", "squash"]
