"""Dynamic routing between capsules (Sabour et al. 2017, Procedure 1)."""
from __future__ import annotations

import torch

from capsnet.layers.squash import squash


def dynamic_routing(u_hat: torch.Tensor, iterations: int, full_graph: bool = False) -> torch.Tensor:
    """Route prediction vectors ``u_hat`` to output capsules by agreement.

    u_hat: (B, J, I, D), the predictions of the I input capsules for the J output capsules,
    laid out output-major so that both contractions over I and D are plain batched
    matrix products over (B, J). Returns v: (B, J, D).

    The logits b start at zero for every example (never shared across the batch), so the
    first couplings are uniform, c = 1/J, and that softmax is skipped; later couplings are
    a softmax over the J output capsules; b grows by the agreement u_hat . v. Unless
    ``full_graph``, gradients flow through the last iteration only (the earlier iterations
    see a detached u_hat), as in most reference code. Runs in float32 (or float64) even under autocast.
    """
    if u_hat.dtype in (torch.float16, torch.bfloat16):
        u_hat = u_hat.float()
    B, J, I, D = u_hat.shape
    u_hat_routing = u_hat if full_graph else u_hat.detach()
    b = None  # (B, J, I) routing logits; None stands for all zeros
    for r in range(iterations):
        last = r == iterations - 1
        u = u_hat if last else u_hat_routing
        if b is None:
            s = u.sum(dim=2) / J  # (B, J, D): softmax of zeros is 1/J
        else:
            c = torch.softmax(b, dim=1)  # (B, J, I), sums to 1 over J
            s = torch.matmul(c.unsqueeze(2), u).squeeze(2)  # (B, J, 1, I) @ (B, J, I, D) -> (B, J, D)
        v = squash(s)  # (B, J, D)
        if not last:
            agreement = torch.matmul(u, v.unsqueeze(-1)).squeeze(-1)  # (B, J, I)
            b = agreement if b is None else b + agreement
    return v
