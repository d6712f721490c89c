"""Self-attention routing (Mazzia, Salvetti & Chiaberge 2021): one non-iterative pass.

For parent j with U_j (I, D) the children's predictions:

    C_j = softmax over the parents of the row sums of U_j U_j^T / sqrt(D)
    s_j = sum_i (C_j[i] + B_j[i]) u_hat_j|i,  B the learned log priors (added after the softmax)
    v_j = squash(s_j)                           (Efficient-CapsNet's exp_squash)

as the authors' ``FCCaps.call``; the row sums are one product with the summed predictions,
O(I D) instead of O(I^2 D)."""
from __future__ import annotations

import math

import torch
from torch import nn

from capsnet.routing.base import Routed, Router, fully_connected_only
from capsnet.squashing import exp_squash, full_precision


def self_attention_couplings(u_hat: torch.Tensor) -> torch.Tensor:
    """u_hat (B, J, I, D) -> C (B, J, I), the softmax over parents of A_j's row sums."""
    D = u_hat.shape[-1]
    total = u_hat.sum(dim=2)  # (B, J, D): sum over k of u_hat_j|k
    logits = torch.einsum("bjid,bjd->bji", u_hat, total) / math.sqrt(D)  # (B, J, I)
    return torch.softmax(logits, dim=1)  # (B, J, I), sums to 1 over J


class SelfAttentionRouter(Router):
    """Efficient-CapsNet's router: one pass, log priors B (J, I) initialised to zero; fully
    connected layers only. u_hat (B, J, I, D) -> Routed(poses (B, J, D), activations |v_j|,
    couplings (C,)); float32 under autocast."""

    name = "self-attention"
    coupling_symbol = "C"
    coupling_meaning = ("C_ij, the self-attention couplings of the one pass: a softmax over the "
                        "classes, before the learned log priors B are added")

    def __init__(self, num_parents: int, num_children: int):
        super().__init__()
        self.b = nn.Parameter(torch.zeros(num_parents, num_children))  # (J, I) log priors

    @classmethod
    def from_config(cls, config, *, children: int, parents: int,
                    pose_dim: int) -> SelfAttentionRouter:
        """The router of a layer of ``children`` inputs and ``parents`` outputs."""
        return cls(parents, children)

    def forward(self, u_hat: torch.Tensor, activations: torch.Tensor | None = None,
                children: torch.Tensor | None = None,
                num_children: int | None = None) -> Routed:
        fully_connected_only(self, children)
        with torch.autocast(device_type=u_hat.device.type, enabled=False):
            u_hat = full_precision(u_hat)  # (B, J, I, D)
            c = self_attention_couplings(u_hat)  # (B, J, I)
            s = torch.einsum("bjid,bji->bjd", u_hat, c + self.b)  # (B, J, D)
            v = exp_squash(s)  # (B, J, D)
        return Routed(v, torch.linalg.vector_norm(v, dim=-1), (c,))
