"""Dynamic routing between capsules (Sabour et al. 2017, Procedure 1)."""
from __future__ import annotations

import torch

from capsnet.layers.squash import squash


def dynamic_routing(u_hat: torch.Tensor, iterations: int, full_graph: bool = False) -> torch.Tensor:
    """Route prediction vectors ``u_hat`` to output capsules by agreement.

    u_hat: (B, I, J, D) predictions of the I input capsules for the J outputs.
    Returns v: (B, J, D).

    The logits b start at zero for every example (never shared across the batch), the
    couplings c are a softmax over the J output capsules, and b grows by the agreement
    u_hat . v. Unless ``full_graph``, gradients flow through the last iteration only
    (the earlier iterations see a detached u_hat), as in most reference code.
    The routing runs in float32 even under autocast.
    """
    u_hat = u_hat.float()
    B, I, J, _ = u_hat.shape
    u_hat_routing = u_hat if full_graph else u_hat.detach()
    b = torch.zeros(B, I, J, device=u_hat.device, dtype=u_hat.dtype)  # (B, I, J)
    for r in range(iterations):
        last = r == iterations - 1
        u = u_hat if last else u_hat_routing
        c = torch.softmax(b, dim=2)  # (B, I, J), sums to 1 over J
        s = torch.einsum("bij,bijd->bjd", c, u)  # (B, J, D)
        v = squash(s)  # (B, J, D)
        if not last:
            b = b + torch.einsum("bijd,bjd->bij", u, v)  # (B, I, J)
    return v
