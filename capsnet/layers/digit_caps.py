"""DigitCaps: the paper's class capsules, a :class:`CapsuleLayer` over (B, I, in_dim) inputs."""
from __future__ import annotations

import torch
from torch.nn.modules.lazy import LazyModuleMixin
from torch.nn.parameter import UninitializedParameter

from capsnet.layers.routed_caps import W_INIT_STD, CapsuleLayer
from capsnet.routing import Router

CAPSULES_NDIM = 3  # (B, I, in_dim)


class DigitCaps(CapsuleLayer):
    """u (B, I, in_dim) -> the ``router``'s Routed: poses (B, J, out_dim), activations (B, J)
    and couplings; W (I, J, out_dim, in_dim) at the paper's scale (0.01).
    :class:`LazyDigitCaps` reads I from the first input."""

    def __init__(self, in_caps: int, in_dim: int, out_caps: int, out_dim: int, router: Router,
                 **options):
        super().__init__(in_caps, in_dim, out_caps, out_dim, router, **options)

    def check_input(self, u: torch.Tensor) -> None:
        """ValueError in one line unless u is (B, I, in_dim) as W was made for."""
        in_caps, _, _, in_dim = self.W.shape
        if u.dim() != CAPSULES_NDIM or tuple(u.shape[1:]) != (in_caps, in_dim):
            raise ValueError(f"DigitCaps expects input capsules (B, {in_caps}, {in_dim}), got "
                             f"{tuple(u.shape)}: give it in_caps=PrimaryCaps.num_capsules(H, W) "
                             f"of its input maps, or use LazyDigitCaps")


class LazyDigitCaps(LazyModuleMixin, DigitCaps):
    """A :class:`DigitCaps` whose I is read from the first input, as ``nn.LazyLinear``."""

    cls_to_become = DigitCaps
    W: UninitializedParameter

    def __init__(self, in_dim: int, out_caps: int, out_dim: int, router: Router):
        super().__init__(0, in_dim, out_caps, out_dim, router)
        self.in_dim, self.out_caps, self.out_dim = in_dim, out_caps, out_dim
        self.W = UninitializedParameter()

    def initialize_parameters(self, u: torch.Tensor, *args) -> None:
        if not self.has_uninitialized_params():
            return
        if u.dim() != CAPSULES_NDIM or u.shape[-1] != self.in_dim:
            raise ValueError(f"DigitCaps expects input capsules (B, I, {self.in_dim}), got "
                             f"{tuple(u.shape)}")
        with torch.no_grad():
            self.W.materialize((u.shape[1], self.out_caps, self.out_dim, self.in_dim),
                               device=u.device)
            self.W.normal_(0.0, W_INIT_STD)  # (I, J, out_dim, in_dim)
