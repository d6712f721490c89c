"""A routed capsule layer of any shape: capsules (..., I, d_in) -> (..., J, d_out), one
transformation matrix per (input, output) pair, routed by any :mod:`capsnet.routing` router.

Leading dimensions are free (a batch, a batch of grid cells, a batch of sequences): they are
routed independently. Layers stack: one layer's poses and activations are the next one's
input. The paper's DigitCaps is this layer with I = 1152, d_in = 8, J = 10, d_out = 16 and
dynamic routing (:class:`capsnet.layers.DigitCaps`)."""
from __future__ import annotations

import math

import torch
from torch import nn

from capsnet.routing import Routed, Router
from capsnet.squashing import full_precision

# Standard deviation of the initial transformation matrices (the paper's reference code).
W_INIT_STD = 0.01
CAPSULE_DIMS = 2  # (I, d) at the end of every capsule tensor


def balanced_init_std(in_caps: int, out_caps: int, out_dim: int) -> float:
    """The W scale at which a first routing iteration's s_j = (1/J) sum_i W_ij u_i has length
    about 1 when the I inputs agree (unit length, the votes adding up): J / (I sqrt(d_out)).
    Stacks and heads start with it, so that no layer starts saturated (length 1 everywhere,
    no gradient) or near zero (the paper's 0.01 suits its one routed layer of 1,152 inputs)."""
    return out_caps / (in_caps * math.sqrt(out_dim))


class Predictions(torch.autograd.Function):
    """u_hat_j|i = W_ij u_i for W (I, J, D, K) and u (N, I, K): (N, J, I, D), a view of one
    batched matrix product over i (I, N, K) @ (I, K, J*D), as einsum('ijdk,bik->bjid') runs
    it (the same product, so the same numbers); its gradient two products (a gradient in
    u_hat's own layout is read as it is, with no copy)."""

    @staticmethod
    def forward(W: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        I, J, D, K = W.shape
        N = u.shape[0]
        product = torch.bmm(u.transpose(0, 1), W.view(I, J * D, K).transpose(1, 2))  # (I,N,JD)
        return product.view(I, N, J, D).permute(1, 2, 0, 3)  # (N, J, I, D)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        W, u = ctx.saved_tensors
        I, J, D, K = W.shape
        N = u.shape[0]
        g = g.permute(2, 0, 1, 3).reshape(I, N, J * D)  # (I, N, J*D), free in u_hat's layout
        # (I, K, N) @ (I, N, J*D), then transposed: MKL runs this order 2-4x faster than the
        # (I, J*D, N) @ (I, N, K) one, and it is the product einsum's backward runs
        g_W = torch.bmm(u.permute(1, 2, 0), g).transpose(1, 2).reshape(I, J, D, K)
        g_u = torch.bmm(g, W.view(I, J * D, K)).transpose(0, 1)  # (N, I, K)
        return g_W, g_u


class CapsuleLayer(nn.Module):
    """u (..., I, d_in) and optional activations (..., I) -> the ``router``'s Routed: poses
    (..., J, d_out), activations (..., J) and couplings (N, J, I) per iteration, N the product
    of the leading dimensions. A router that needs child activations (EM) and gets none
    takes the input capsules' lengths. u_hat = W u is one einsum (W never copied per example);
    float32 under autocast."""

    def __init__(self, in_caps: int, in_dim: int, out_caps: int, out_dim: int, router: Router,
                 init_std: float = W_INIT_STD):
        super().__init__()
        self.W = nn.Parameter(init_std * torch.randn(in_caps, out_caps, out_dim, in_dim))
        self.router = router

    def check_input(self, u: torch.Tensor) -> None:
        """ValueError in one line unless u is (..., I, in_dim) as W was made for."""
        in_caps, _, _, in_dim = self.W.shape
        if u.dim() <= CAPSULE_DIMS or tuple(u.shape[-CAPSULE_DIMS:]) != (in_caps, in_dim):
            raise ValueError(f"{type(self).__name__} expects input capsules (..., {in_caps}, "
                             f"{in_dim}), got {tuple(u.shape)}")

    def predictions(self, u: torch.Tensor) -> torch.Tensor:
        """u: (N, I, in_dim) -> u_hat: (N, J, I, out_dim), output-major for the routing; a
        view of the (I, N, J, out_dim) product, read by the routers without a copy."""
        return Predictions.apply(self.W, u)  # (B, 10, 1152, 16)

    def route(self, u: torch.Tensor,
              activations: torch.Tensor | None = None) -> tuple[torch.Tensor, Routed]:
        """u: (..., I, in_dim) -> the votes u_hat (N, J, I, out_dim) and their routing, the
        routed poses and activations back in u's leading dimensions."""
        self.check_input(u)
        lead = u.shape[:-CAPSULE_DIMS]
        with torch.autocast(device_type=u.device.type, enabled=False):
            u = full_precision(u).reshape(-1, *u.shape[-CAPSULE_DIMS:])  # (N, I, in_dim)
            if activations is not None:
                activations = full_precision(activations).reshape(u.shape[0], -1)  # (N, I)
            elif self.router.needs_activations:
                activations = torch.linalg.vector_norm(u, dim=-1).clamp(0, 1)  # (N, I)
            u_hat = self.predictions(u)  # (N, J, I, D)
            routed = self.router(u_hat, activations)  # (N, J, D), (N, J), couplings
        if len(lead) != 1:
            routed = routed._replace(poses=routed.poses.reshape(*lead, *routed.poses.shape[1:]),
                                     activations=routed.activations.reshape(*lead, -1))
        return u_hat, routed

    def forward(self, u: torch.Tensor, activations: torch.Tensor | None = None) -> Routed:
        return self.route(u, activations)[1]
