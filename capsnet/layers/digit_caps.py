"""DigitCaps: one transformation matrix per (input capsule, output capsule) pair, then routing."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin
from torch.nn.parameter import UninitializedParameter

from capsnet.routing import Routed, Router
from capsnet.squashing import full_precision

# Standard deviation of the initial transformation matrices (as in the reference code).
W_INIT_STD = 0.01
CAPSULES_NDIM = 3  # (B, I, in_dim)


class DigitCaps(nn.Module):
    """u (B, I, in_dim) -> the ``router``'s Routed: poses (B, J, out_dim), activations (B, J)
    and couplings. u_hat = W u is one einsum (W never copied per example); float32 under
    autocast. :class:`LazyDigitCaps` reads I from the first input."""

    def __init__(self, in_caps: int, in_dim: int, out_caps: int, out_dim: int, router: Router):
        super().__init__()
        self.W = nn.Parameter(W_INIT_STD * torch.randn(in_caps, out_caps, out_dim, in_dim))
        self.router = router

    def check_input(self, u: torch.Tensor) -> None:
        """ValueError in one line unless u is (B, I, in_dim) as W was made for."""
        in_caps, _, _, in_dim = self.W.shape
        if u.dim() != CAPSULES_NDIM or tuple(u.shape[1:]) != (in_caps, in_dim):
            raise ValueError(f"DigitCaps expects input capsules (B, {in_caps}, {in_dim}), got "
                             f"{tuple(u.shape)}: give it in_caps=PrimaryCaps.num_capsules(H, W) "
                             f"of its input maps, or use LazyDigitCaps")

    def predictions(self, u: torch.Tensor) -> torch.Tensor:
        """u: (B, I, in_dim) -> u_hat: (B, J, I, out_dim), output-major for the routing."""
        # contiguous: the routing reads it six times (a permuted view would be copied each time)
        return torch.einsum("ijdk,bik->bjid", self.W, u).contiguous()  # (B, 10, 1152, 16)

    def route(self, u: torch.Tensor) -> tuple[torch.Tensor, Routed]:
        """u: (B, I, in_dim) -> the votes u_hat (B, J, I, out_dim) and their routing."""
        self.check_input(u)
        with torch.autocast(device_type=u.device.type, enabled=False):
            u_hat = self.predictions(full_precision(u))  # (B, J, I, D)
            return u_hat, self.router(u_hat)  # poses (B, J, D), activations (B, J), couplings

    def forward(self, u: torch.Tensor) -> Routed:
        return self.route(u)[1]


class LazyDigitCaps(LazyModuleMixin, DigitCaps):
    """A :class:`DigitCaps` whose I is read from the first input, as ``nn.LazyLinear``."""

    cls_to_become = DigitCaps
    W: UninitializedParameter

    def __init__(self, in_dim: int, out_caps: int, out_dim: int, router: Router):
        super().__init__(0, in_dim, out_caps, out_dim, router)
        self.in_dim, self.out_caps, self.out_dim = in_dim, out_caps, out_dim
        self.W = UninitializedParameter()

    def initialize_parameters(self, u: torch.Tensor) -> None:
        if not self.has_uninitialized_params():
            return
        if u.dim() != CAPSULES_NDIM or u.shape[-1] != self.in_dim:
            raise ValueError(f"DigitCaps expects input capsules (B, I, {self.in_dim}), got "
                             f"{tuple(u.shape)}")
        with torch.no_grad():
            self.W.materialize((u.shape[1], self.out_caps, self.out_dim, self.in_dim),
                               device=u.device)
            self.W.normal_(0.0, W_INIT_STD)  # (I, J, out_dim, in_dim)
