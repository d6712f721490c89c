"""Dynamic routing between capsules (Sabour et al. 2017, Procedure 1)."""
from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import torch

from capsnet.routing.base import Routed, Router, fully_connected_only, uniform_couplings
from capsnet.squashing import full_precision, squash


class RoutingStep(NamedTuple):
    """One iteration's couplings, outputs and agreement (None after the last)."""

    c: torch.Tensor | None  # (B, J, I) couplings; None for the uniform first iteration (1/J)
    v: torch.Tensor  # (B, J, D) output capsules
    agreement: torch.Tensor | None  # (B, J, I) u_hat . v, added to the logits b


def couplings(b: torch.Tensor, none_of_the_above: bool = False) -> torch.Tensor:
    """c = softmax over the J outputs of b (B, J, I); ``none_of_the_above`` adds a zero-logit
    category (the paper's section 7), so c sums to less than 1."""
    if not none_of_the_above:
        return torch.softmax(b, dim=1)  # (B, J, I), sums to 1 over J
    leak = torch.zeros_like(b[:, :1])  # (B, 1, I)
    return torch.softmax(torch.cat([leak, b], dim=1), dim=1)[:, 1:]  # (B, J, I)


def uniform_share(outputs: int, none_of_the_above: bool = False) -> float:
    """The first iteration's coupling: 1/J (1/(J+1) with none-of-the-above)."""
    return 1.0 / (outputs + 1 if none_of_the_above else outputs)


def routing_steps(u_hat: torch.Tensor, iterations: int, full_graph: bool = False,
                  none_of_the_above: bool = False) -> Iterator[RoutingStep]:
    """Procedure 1, one :class:`RoutingStep` per iteration, for u_hat (B, J, I, D).

    b starts at zero per example (first couplings uniform, softmax skipped) and grows by
    u_hat . v. Unless ``full_graph``, gradients flow through the last iteration only.
    Runs in float32 (or float64) under autocast."""
    device_type = u_hat.device.type
    with torch.autocast(device_type=device_type, enabled=False):  # float32 under autocast too
        u_hat = full_precision(u_hat)
        J = u_hat.shape[1]
        uniform = uniform_share(J, none_of_the_above)
        u_hat_routing = u_hat if full_graph else u_hat.detach()
        b = None  # (B, J, I) routing logits; None stands for all zeros
        for r in range(iterations):
            last = r == iterations - 1
            u = u_hat if last else u_hat_routing
            if b is None:
                c = None
                s = u.sum(dim=2) * uniform  # (B, J, D): softmax of zeros is uniform
            else:
                c = couplings(b, none_of_the_above)  # (B, J, I)
                s = torch.matmul(c.unsqueeze(2), u).squeeze(2)  # (B,J,1,I) @ (B,J,I,D) -> (B,J,D)
            v = squash(s)  # (B, J, D)
            agreement = None
            if not last:
                agreement = torch.matmul(u, v.unsqueeze(-1)).squeeze(-1)  # (B, J, I)
                b = agreement if b is None else b + agreement
            yield RoutingStep(c, v, agreement)


class DynamicRouter(Router):
    """Procedure 1 as a Router: u_hat (B, J, I, D) -> poses v (B, J, D), activations |v|
    (B, J), each iteration's couplings (the first a stride-0 view). No parameters."""

    name = "dynamic"
    coupling_symbol = "c"
    coupling_meaning = ("c_ij, the coupling coefficients: a softmax over the classes of the "
                        "logits b_ij (iteration 1: uniform)")

    def __init__(self, iterations: int, full_graph: bool = False,
                 none_of_the_above: bool = False):
        super().__init__()
        if iterations < 1:
            raise ValueError("routing needs at least 1 iteration")
        self.iterations, self.full_graph = iterations, full_graph
        self.none_of_the_above = none_of_the_above

    @classmethod
    def from_config(cls, config, *, children: int, parents: int, pose_dim: int) -> DynamicRouter:
        return cls(config.routing_iterations, config.routing_full_graph,
                   config.none_of_the_above)

    def extra_repr(self) -> str:
        return (f"iterations={self.iterations}, full_graph={self.full_graph}, "
                f"none_of_the_above={self.none_of_the_above}")

    def steps(self, u_hat: torch.Tensor) -> Iterator[RoutingStep]:
        return routing_steps(u_hat, self.iterations, self.full_graph, self.none_of_the_above)

    def forward(self, u_hat: torch.Tensor, activations: torch.Tensor | None = None,
                children: torch.Tensor | None = None,
                num_children: int | None = None) -> Routed:
        fully_connected_only(self, children)
        c = []
        for step in self.steps(u_hat):
            c.append(step.c)  # (B, J, I); None in the first iteration
        v = step.v  # (B, J, D) float32
        c[0] = uniform_couplings(u_hat, uniform_share(u_hat.shape[1], self.none_of_the_above),
                                 v.dtype)  # (B, J, I) a view of 1/J
        return Routed(v, torch.linalg.vector_norm(v, dim=-1), tuple(c))  # (B,J,D), (B,J)

    def agreements(self, u_hat: torch.Tensor,
                   activations: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """u_hat . v of every iteration (B, J, I), the last one included."""
        u_hat = full_precision(u_hat)  # (B, J, I, D)
        out = []
        for step in self.steps(u_hat):
            agreement = step.agreement  # (B, J, I); None after the last iteration
            if agreement is None:
                agreement = torch.matmul(u_hat, step.v.unsqueeze(-1)).squeeze(-1)  # (B, J, I)
            out.append(agreement)
        return tuple(out)
