"""Inverted dot-product attention routing (Tsai, Srivastava, Goh & Salakhutdinov, "Capsules
with Inverted Dot-Product Attention Routing", ICLR 2020), as a
:class:`~capsnet.routing.Router` named ``inverted-attention``.

The paper's Procedure 1, for one layer L -> L + 1 (children i, parents j), in its equations:

- vote (Eq. 1, line 2): v_ij = W_ij p_i, the prediction DigitCaps computes as
  ``u_hat[b, j, i]`` (the same tensor under Sabour et al.'s name); the router starts from it.
- agreement (Eq. 2, line 3): a_ij = p_j^T v_ij, with p_j the parent's pose from the previous
  iteration, "set to 0 initially".
- routing coefficient (Eq. 3, line 4): r_ij = exp(a_ij) / sum_j' exp(a_ij'), a softmax over
  the PARENTS j: the parents compete for each child's attention (ordinary attention would
  normalise over the children: hence "inverted").
- pose update and normalisation (lines 5 and 6): p_j = LayerNorm(sum_i r_ij v_ij).

Because every p_j starts at 0, the first iteration's agreements are 0 and its coefficients
the uniform 1/J; each later iteration uses the poses of the one before. As in the authors'
code (``CapsuleFC`` in github.com/apple/ml-capsules-inverted-attention-routing), the
agreement is scaled by 1/sqrt(D) (scaled dot-product attention; the paper's Eq. 2 omits the
factor), LayerNorm has a learned gain and bias, and gradients flow through every iteration.
Left out: the code's optional dropout on s_j (rate 0 here) and its renormalisation of r by
its sum + 1e-10 (a no-op in float32).

Concurrency. The paper's Procedure 2 iterates every capsule layer of a stack at once: in
iteration t each layer L + 1 is updated from layer L's poses of iteration t - 1 (not of
iteration t), so all layers refine in parallel instead of one after the other. capsnet
routes one layer (primary capsules -> class capsules) whose children are fixed by the
convolutions, so the concurrent and the sequential schedules are the same computation: what
is implemented is T iterations of Procedure 1 on this one layer.

Class score. The paper reads each class capsule's final pose with one linear layer shared
by every class (logit_j = w . p_j + b, then a softmax and cross-entropy). capsnet trains
with the margin loss, which needs a score in [0, 1) per class, and a LayerNorm'd pose has a
length of about sqrt(D) whatever the evidence. The score is therefore the length of the
squashed pose before normalisation, a_j = |squash(s_j)| with s_j = sum_i r_ij v_ij of the
last iteration: dynamic routing's |v_j| (Sabour et al., Eq. 1), computed with the inverted
attention's coefficients, large when many children send agreeing votes to j. It adds no
parameter. (The paper's shared read-out through a logistic, sigmoid(w . p_j + b), also fits
the margin loss, but in a tiny trial (small preset, 500 MNIST images, 3 epochs) it stayed
at chance, 11% validation accuracy, where the length reached 64%, as dynamic routing's 60%.)
"""
from __future__ import annotations

import torch
from torch import nn

from capsnet.routing.base import Routed, Router, fully_connected_only, uniform_couplings
from capsnet.squashing import full_precision, squash


class InvertedAttentionRouter(Router):
    """u_hat (B, J, I, D) -> poses p (B, J, D) (LayerNorm'd), activations |squash(s_j)|
    (B, J) and the routing coefficients r (B, J, I) of every iteration (the first the
    uniform 1/J). Children's activations are not used (the algorithm has none). Runs in
    float32 under autocast; its parameters are the LayerNorm's gain and bias."""

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
        """Eq. 2 (scaled) for the poses of every iteration, (B, J, I) each: the softmax over
        j of iteration t's is iteration t + 1's coefficients."""
        with torch.autocast(device_type=u_hat.device.type, enabled=False):
            couplings = self(u_hat).couplings
            u_hat = full_precision(u_hat)  # (B, J, I, D)
            return tuple(self.agreement(self.norm(self.weighted_sum(r, u_hat)), u_hat)
                         for r in couplings)
