"""DigitCaps: one transformation matrix per (input capsule, output capsule) pair, then routing."""
from __future__ import annotations

import torch
from torch import nn

from capsnet.layers.router import Routed, Router
from capsnet.layers.squash import full_precision

# Standard deviation of the initial transformation matrices (as in the reference code).
W_INIT_STD = 0.01


class DigitCaps(nn.Module):
    """Input u: (B, I, in_dim). Output: the ``router``'s :class:`Routed` — poses v
    (B, J, out_dim), activations (B, J) (the class scores) and the couplings per iteration.

    u_hat = W u is one einsum over named dimensions: W is never copied per example. Which
    algorithm routes u_hat to the J capsules is the ``router``'s business (any
    :class:`~capsnet.layers.router.Router`; :class:`capsnet.models.CapsNet` builds the one
    its config names). Prediction vectors and routing run in float32, also under autocast.
    """

    def __init__(self, in_caps: int, in_dim: int, out_caps: int, out_dim: int, router: Router):
        super().__init__()
        self.W = nn.Parameter(W_INIT_STD * torch.randn(in_caps, out_caps, out_dim, in_dim))
        self.router = router

    def predictions(self, u: torch.Tensor) -> torch.Tensor:
        """u: (B, I, in_dim) -> u_hat: (B, J, I, out_dim), output-major for the routing."""
        # contiguous: the routing reads it six times (a permuted view would be copied each time)
        return torch.einsum("ijdk,bik->bjid", self.W, u).contiguous()  # (B, 10, 1152, 16)

    def route(self, u: torch.Tensor) -> tuple[torch.Tensor, Routed]:
        """u: (B, I, in_dim) -> the votes u_hat (B, J, I, out_dim) and their routing."""
        with torch.autocast(device_type=u.device.type, enabled=False):
            u_hat = self.predictions(full_precision(u))  # (B, J, I, D)
            return u_hat, self.router(u_hat)  # poses (B, J, D), activations (B, J), couplings

    def forward(self, u: torch.Tensor) -> Routed:
        return self.route(u)[1]
