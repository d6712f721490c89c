"""Self-attention routing (Mazzia, Salvetti & Chiaberge 2021, Methods, "Self-attention
routing"): one non-iterative pass from the predictions to the parent capsules.

For each parent capsule j, with U_j (I, D) the predictions u_hat_j|i of the I children for it:

    A_j = U_j U_j^T / sqrt(D)                    the self-attention matrix (I, I)
    C_j = softmax_j( sum_k A_j[:, k] )           the coupling coefficients, a softmax over
                                                 the J parents for each child i
    s_j = sum_i (C_j[i] + B_j[i]) u_hat_j|i      B: the log priors, learned with W
    v_j = squash(s_j)                            Efficient-CapsNet's squash (exp_squash)

A child whose prediction agrees with the other children's for parent j (large row sums of
A_j) sends more of itself to j. The public code (EscVM/Efficient-CapsNet, utils/layers.py,
``FCCaps.call``) computes exactly this: the row sums by ``einsum('...ij,...kj->...i', u,
u)``, the scale 1/sqrt(D) with D the parents' dimension, ``softmax(c, axis=1)`` over the
parents, and the bias ``b`` (zero-initialised, shape (J, I, 1)) added *after* the softmax.

Because sum_k u_i . u_k = u_i . (sum_k u_k), the row sums are one product with the summed
predictions: O(I D) per parent instead of the O(I^2 D) of forming A (the test checks this against
a loop that forms A).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from capsnet.routing.base import Routed, Router
from capsnet.squashing import exp_squash, full_precision


def self_attention_couplings(u_hat: torch.Tensor) -> torch.Tensor:
    """u_hat (B, J, I, D) -> C (B, J, I): softmax over the J parents of the row sums of
    A_j = U_j U_j^T / sqrt(D)."""
    D = u_hat.shape[-1]
    total = u_hat.sum(dim=2)  # (B, J, D): sum over k of u_hat_j|k
    logits = torch.einsum("bjid,bjd->bji", u_hat, total) / math.sqrt(D)  # (B, J, I)
    return torch.softmax(logits, dim=1)  # (B, J, I), sums to 1 over J


class SelfAttentionRouter(Router):
    """The :class:`Router` of Efficient-CapsNet: one pass, no iterations. Holds the log
    priors B (J, I), initialised to zero as in the public code, so it is fixed to one pair
    of capsule counts. Child activations are not used (a capsule's length is its
    activation, inside its vote); only fully connected layers (``children`` None).

    u_hat (B, J, I, D) -> Routed(poses (B, J, D), activations (B, J) = |v_j|,
    couplings (C,) with C (B, J, I) the softmax couplings, before B is added). Runs in
    float32, also under autocast.
    """

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
        """The router of a layer of ``children`` inputs and ``parents`` outputs (on the
        paper's CapsNet: ``--routing self-attention``, its DigitCaps routed in one pass)."""
        return cls(parents, children)

    def forward(self, u_hat: torch.Tensor, activations: torch.Tensor | None = None,
                children: torch.Tensor | None = None,
                num_children: int | None = None) -> Routed:
        if children is not None:
            raise ValueError("self-attention routing connects every child to every parent; "
                             "it has no convolutional (windowed) form")
        with torch.autocast(device_type=u_hat.device.type, enabled=False):
            u_hat = full_precision(u_hat)  # (B, J, I, D)
            c = self_attention_couplings(u_hat)  # (B, J, I)
            s = torch.einsum("bjid,bji->bjd", u_hat, c + self.b)  # (B, J, D)
            v = exp_squash(s)  # (B, J, D)
        return Routed(v, torch.linalg.vector_norm(v, dim=-1), (c,))
