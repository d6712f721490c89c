"""Dynamic routing between capsules (Sabour et al. 2017, Procedure 1)."""
from __future__ import annotations

import torch
from torch import nn

from capsnet.routing.base import Routed, Router, fully_connected_only, uniform_couplings
from capsnet.squashing import full_precision, squash


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


# The released code's capsule-layer bias at the start of training (variables.bias_variable).
RELEASED_BIAS_INIT = 0.1


class DynamicRouter(Router):
    """Procedure 1 as a Router: u_hat (B, J, I, D) -> poses v (B, J, D), activations |v|
    (B, J), each iteration's couplings (the first a stride-0 view). No parameters, unless
    ``biases`` gives the (J, D) shape of a bias added to s before every squash (the
    released code's)."""

    name = "dynamic"
    coupling_symbol = "c"
    coupling_meaning = ("c_ij, the coupling coefficients: a softmax over the classes of the "
                        "logits b_ij (iteration 1: uniform)")

    def __init__(self, iterations: int, full_graph: bool = False,
                 none_of_the_above: bool = False, biases: tuple[int, int] | None = None):
        super().__init__()
        if iterations < 1:
            raise ValueError("routing needs at least 1 iteration")
        self.iterations, self.full_graph = iterations, full_graph
        self.none_of_the_above = none_of_the_above
        self.bias = (nn.Parameter(torch.full(biases, RELEASED_BIAS_INIT))
                     if biases is not None else None)  # (J, D)

    @classmethod
    def from_config(cls, config, *, children: int, parents: int, pose_dim: int) -> DynamicRouter:
        return cls(config.routing_iterations, config.routing_full_graph,
                   config.none_of_the_above,
                   (parents, pose_dim) if getattr(config, "routing_biases", False) else None)

    def extra_repr(self) -> str:
        return (f"iterations={self.iterations}, full_graph={self.full_graph}, "
                f"none_of_the_above={self.none_of_the_above}")

    def route(self, u_hat: torch.Tensor,
              last_agreement: bool = False) -> tuple[torch.Tensor, list, list]:
        """Procedure 1 for u_hat (B, J, I, D): v (B, J, D), each iteration's couplings c
        (B, J, I) (the first None: uniform, softmax skipped) and agreements u_hat . v (B, J, I)
        (the last one only if asked). b starts at zero per example and grows by the agreement;
        unless ``full_graph``, gradients flow through the last iteration only. Runs in
        float32 (or float64) under autocast."""
        with torch.autocast(device_type=u_hat.device.type, enabled=False):
            u_hat = full_precision(u_hat)
            uniform = uniform_share(u_hat.shape[1], self.none_of_the_above)
            u_hat_routing = u_hat if self.full_graph else u_hat.detach()
            b = None  # (B, J, I) routing logits; None stands for all zeros
            c_all, agreements = [], []
            for r in range(self.iterations):
                last = r == self.iterations - 1
                u = u_hat if last else u_hat_routing
                if b is None:
                    c = None
                    s = u.sum(dim=2) * uniform  # (B, J, D): softmax of zeros is uniform
                else:
                    c = couplings(b, self.none_of_the_above)  # (B, J, I)
                    s = torch.matmul(c.unsqueeze(2), u).squeeze(2)  # (B,J,1,I) @ (B,J,I,D)
                if self.bias is not None:
                    s = s + self.bias  # (B, J, D)
                v = squash(s)  # (B, J, D)
                c_all.append(c)
                if not last or last_agreement:
                    agreement = torch.matmul(u, v.unsqueeze(-1)).squeeze(-1)  # (B, J, I)
                    agreements.append(agreement)
                    b = agreement if b is None else b + agreement
        return v, c_all, agreements

    def forward(self, u_hat: torch.Tensor, activations: torch.Tensor | None = None,
                children: torch.Tensor | None = None,
                num_children: int | None = None) -> Routed:
        fully_connected_only(self, children)
        v, c, _ = self.route(u_hat)  # (B, J, D) float32, c[0] None
        c[0] = uniform_couplings(u_hat, uniform_share(u_hat.shape[1], self.none_of_the_above),
                                 v.dtype)  # (B, J, I) a view of 1/J
        return Routed(v, torch.linalg.vector_norm(v, dim=-1), tuple(c))  # (B,J,D), (B,J)

    def agreements(self, u_hat: torch.Tensor,
                   activations: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """u_hat . v of every iteration (B, J, I), the last one included."""
        return tuple(self.route(u_hat, last_agreement=True)[2])
