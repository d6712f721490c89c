"""Inverted dot-product attention routing (Tsai, Srivastava, Goh & Salakhutdinov, ICLR 2020),
the :class:`~capsnet.routing.Router` named ``inverted-attention``.

Procedure 1 for one layer: from the votes v_ij (``u_hat[b, j, i]``) and poses p_j (0 at
first), agreement a_ij = p_j . v_ij / sqrt(D) (the authors' code's scaling); coefficients
r_ij = softmax over the PARENTS j (hence "inverted"); p_j = LayerNorm(sum_i r_ij v_ij) with
learned gain and bias. One layer is routed, so Procedure 2's concurrent schedule is the
same computation. The class score, which the margin loss needs in [0, 1), is |squash(s_j)|
of the last iteration's s_j (a LayerNorm'd pose has length about sqrt(D) whatever the
evidence)."""
from __future__ import annotations

import torch
from torch import nn

from capsnet.routing.base import Routed, Router, fully_connected_only, uniform_couplings
from capsnet.squashing import full_precision, squash


class InvertedAttentionRouter(Router):
    """u_hat (B, J, I, D) -> poses (B, J, D) (LayerNorm'd), activations |squash(s_j)| (B, J)
    and each iteration's coefficients r (B, J, I). Runs in float32 under autocast."""

    name = "inverted-attention"
    coupling_symbol = "r"
    coupling_meaning = ("r_ij, the routing coefficients: a softmax over the classes of the "
                        "agreements with the previous iteration's poses (iteration 1: uniform)")

    def __init__(self, pose_dim: int, iterations: int):
        super().__init__()
        if iterations < 1:
            raise ValueError("routing needs at least 1 iteration")
        self.iterations = iterations
        self.scale = pose_dim ** -0.5  # 1/sqrt(D), as in the authors' code
        self.norm = nn.LayerNorm(pose_dim)  # line 6

    @classmethod
    def from_config(cls, config, *, children: int, parents: int,
                    pose_dim: int) -> InvertedAttentionRouter:
        return cls(pose_dim, config.routing_iterations)

    def extra_repr(self) -> str:
        return f"iterations={self.iterations}"

    @staticmethod
    def weighted_sum(r: torch.Tensor, u_hat: torch.Tensor) -> torch.Tensor:
        """Line 5: s_j = sum_i r_ij v_ij. r: (B, J, I), u_hat: (B, J, I, D) -> (B, J, D)."""
        return torch.matmul(r.unsqueeze(2), u_hat).squeeze(2)  # (B,J,1,I) @ (B,J,I,D)

    def agreement(self, p: torch.Tensor, u_hat: torch.Tensor) -> torch.Tensor:
        """Eq. 2, scaled: a_ij = p_j . v_ij / sqrt(D). p: (B, J, D) -> (B, J, I)."""
        return torch.matmul(u_hat, p.unsqueeze(-1)).squeeze(-1) * self.scale  # (B, J, I)

    def forward(self, u_hat: torch.Tensor, activations: torch.Tensor | None = None,
                children: torch.Tensor | None = None,
                num_children: int | None = None) -> Routed:
        fully_connected_only(self, children)
        with torch.autocast(device_type=u_hat.device.type, enabled=False):
            u_hat = full_precision(u_hat)  # (B, J, I, D)
            J = u_hat.shape[1]
            r = uniform_couplings(u_hat, 1.0 / J, u_hat.dtype)  # (B, J, I): p = 0 -> a = 0
            couplings = [r]
            s = self.weighted_sum(r, u_hat)  # (B, J, D)
            for _ in range(self.iterations - 1):
                r = torch.softmax(self.agreement(self.norm(s), u_hat), dim=1)  # (B, J, I)
                couplings.append(r)
                s = self.weighted_sum(r, u_hat)  # (B, J, D)
            p = self.norm(s)  # (B, J, D) line 6
            scores = torch.linalg.vector_norm(squash(s), dim=-1)  # (B, J) in [0, 1)
        return Routed(p, scores, tuple(couplings))

    @torch.no_grad()
    def agreements(self, u_hat: torch.Tensor,
                   activations: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """Eq. 2 (scaled) for every iteration's poses, (B, J, I) each."""
        with torch.autocast(device_type=u_hat.device.type, enabled=False):
            couplings = self(u_hat).couplings
            u_hat = full_precision(u_hat)  # (B, J, I, D)
            return tuple(self.agreement(self.norm(self.weighted_sum(r, u_hat)), u_hat)
                         for r in couplings)
