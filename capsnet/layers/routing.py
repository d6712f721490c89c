"""Dynamic routing between capsules (Sabour et al. 2017, Procedure 1)."""
from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import torch

from capsnet.layers.squash import full_precision, squash


class RoutingStep(NamedTuple):
    """One routing iteration: the couplings it used, the outputs it made and the agreement
    those outputs earned (None after the last iteration, which updates nothing)."""

    c: torch.Tensor | None  # (B, J, I) couplings; None for the uniform first iteration (1/J)
    v: torch.Tensor  # (B, J, D) output capsules
    agreement: torch.Tensor | None  # (B, J, I) u_hat . v, added to the logits b


def routing_steps(u_hat: torch.Tensor, iterations: int,
                  full_graph: bool = False) -> Iterator[RoutingStep]:
    """Procedure 1, one :class:`RoutingStep` per iteration. See :func:`dynamic_routing`."""
    device_type = u_hat.device.type
    with torch.autocast(device_type=device_type, enabled=False):  # float32 under autocast too
        u_hat = full_precision(u_hat)
        J = u_hat.shape[1]
        u_hat_routing = u_hat if full_graph else u_hat.detach()
        b = None  # (B, J, I) routing logits; None stands for all zeros
        for r in range(iterations):
            last = r == iterations - 1
            u = u_hat if last else u_hat_routing
            if b is None:
                c = None
                s = u.sum(dim=2) / J  # (B, J, D): softmax of zeros is 1/J
            else:
                c = torch.softmax(b, dim=1)  # (B, J, I), sums to 1 over J
                s = torch.matmul(c.unsqueeze(2), u).squeeze(2)  # (B,J,1,I) @ (B,J,I,D) -> (B,J,D)
            v = squash(s)  # (B, J, D)
            agreement = None
            if not last:
                agreement = torch.matmul(u, v.unsqueeze(-1)).squeeze(-1)  # (B, J, I)
                b = agreement if b is None else b + agreement
            yield RoutingStep(c, v, agreement)


def dynamic_routing(u_hat: torch.Tensor, iterations: int, full_graph: bool = False) -> torch.Tensor:
    """Route prediction vectors ``u_hat`` to output capsules by agreement.

    u_hat: (B, J, I, D), the predictions of the I input capsules for the J output capsules,
    laid out output-major so that both contractions over I and D are plain batched
    matrix products over (B, J). Returns v: (B, J, D).

    The logits b start at zero for every example (never shared across the batch), so the
    first couplings are uniform, c = 1/J, and that softmax is skipped; later couplings are
    a softmax over the J output capsules; b grows by the agreement u_hat . v. Unless
    ``full_graph``, gradients flow through the last iteration only (the earlier iterations
    see a detached u_hat), as in most reference code. Runs in float32 (or float64) even
    under autocast.
    """
    for step in routing_steps(u_hat, iterations, full_graph):
        v = step.v
    return v
