"""Dynamic routing between capsules (Sabour et al. 2017, Procedure 1)."""
from __future__ import annotations

import torch
from torch import nn

from capsnet.routing.base import Routed, Router, fully_connected_only, uniform_couplings
from capsnet.squashing import (
    full_precision,
    squash,
    squash_grad,
    squash_parts,
    squash_with_parts,
)


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


def weighted_sum(c: torch.Tensor | None, u: torch.Tensor, uniform: float) -> torch.Tensor:
    """s_j = sum_i c_ij u_hat_j|i (B, J, D) for u_hat (B, J, I, D) and c (B, J, I), or for
    c = ``uniform`` everywhere when ``c`` is None (the first iteration: softmax of zeros)."""
    B, J, I, D = u.shape
    if c is None:
        return u.sum(dim=2) * uniform  # (B, J, D)
    return torch.bmm(c.reshape(B * J, 1, I), u.reshape(B * J, I, D)).view(B, J, D)


def procedure_1(u_hat: torch.Tensor, iterations: int, none_of_the_above: bool = False,
                bias: torch.Tensor | None = None, full_graph: bool = True,
                last_agreement: bool = False) -> tuple:
    """Procedure 1 for u_hat (B, J, I, D): v (B, J, D), each iteration's couplings (B, J, I)
    (the first None: uniform), the agreements u_hat . v (B, J, I) (the last one only if
    asked) and the parts (u, k, f) of the last squash. b starts at zero per example and grows
    by the agreement; unless ``full_graph``, the iterations before the last see u_hat
    detached. ``bias`` (J, D) is added to s before every squash."""
    B, J, I, D = u_hat.shape
    uniform = uniform_share(J, none_of_the_above)
    u_hat_routing = u_hat if full_graph else u_hat.detach()
    b = None  # (B, J, I) routing logits; None stands for all zeros
    c_all, agreements = [], []
    for r in range(iterations):
        last = r == iterations - 1
        u = u_hat if last else u_hat_routing  # (B, J, I, D)
        c = None if b is None else couplings(b, none_of_the_above)  # (B, J, I)
        s = weighted_sum(c, u, uniform)  # (B, J, D)
        if bias is not None:
            s = s + bias  # (B, J, D)
        if last:  # the parts the gradient reuses
            v, *parts = squash_with_parts(s)  # (B, J, D)
        else:
            v = squash(s)  # (B, J, D)
        c_all.append(c)
        if not last or last_agreement:
            agreement = torch.bmm(u.reshape(B * J, I, D), v.view(B * J, D, 1)).view(B, J, I)
            agreements.append(agreement)
            b = agreement if b is None else b + agreement
    return v, c_all, agreements, parts


class LastIterationRouting(torch.autograd.Function):
    """Procedure 1 on u_hat (B, J, I, D) -> v (B, J, D), its lengths |v| (B, J) and the
    couplings of iterations 2 on (B, J, I), with the gradient of the last iteration only
    (``full_graph`` off: the couplings are constants to it): grad u_hat_j|i = c_ij
    squash'(s_j) (grad v_j + grad |v_j| u_j). The forward is :func:`procedure_1`'s; the
    backward a handful of kernels instead of autograd's graph through the loop. Its backward
    is itself differentiable (the last s is rebuilt from u_hat under autograd when a graph of
    the gradient is asked for)."""

    @staticmethod
    def forward(u_hat: torch.Tensor, iterations: int, none_of_the_above: bool) -> tuple:
        v, c_all, _, parts = procedure_1(u_hat, iterations, none_of_the_above)
        lengths = torch.linalg.vector_norm(v, dim=-1)  # (B, J), as the full-graph path's
        return v, lengths, *c_all[1:], *parts  # parts last: apply's callers drop them

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        u_hat, iterations, none_of_the_above = inputs
        ctx.mark_non_differentiable(*output[2:])
        ctx.set_materialize_grads(False)
        c_last = output[-4] if iterations > 1 else None  # (B, J, I)
        ctx.save_for_backward(u_hat, c_last, *output[-3:])
        ctx.uniform = uniform_share(u_hat.shape[1], none_of_the_above)

    @staticmethod
    def backward(ctx, g: torch.Tensor | None, g_lengths: torch.Tensor | None, *_) -> tuple:
        if g is None and g_lengths is None:
            return None, None, None
        u_hat, c, u, k, f = ctx.saved_tensors
        if torch.is_grad_enabled():  # a graph of the gradient: the last s with its graph
            _, u, k, f = squash_parts(weighted_sum(c, u_hat, ctx.uniform))
        if g_lengths is not None:  # the gradient of |v| is u's: it joins v's
            g_lengths = g_lengths.unsqueeze(-1)  # (B, J, 1)
            g = u * g_lengths if g is None else torch.addcmul(g, u, g_lengths)  # (B, J, D)
        g_s = squash_grad(g, u, k, f)  # (B, J, D)
        if c is None:
            return (g_s * ctx.uniform).unsqueeze(2).expand(u_hat.shape), None, None
        if torch.is_grad_enabled():
            return c.unsqueeze(-1) * g_s.unsqueeze(2), None, None  # (B, J, I, D)
        g_u_hat = torch.empty_like(u_hat)  # (B, J, I, D) in u_hat's layout: W u's gradient
        return torch.mul(c.unsqueeze(-1), g_s.unsqueeze(2), out=g_u_hat), None, None


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
        (the last one only if asked), by autograd through the loop (:func:`procedure_1`).
        Runs in float32 (or float64) under autocast."""
        with torch.autocast(device_type=u_hat.device.type, enabled=False):
            v, c_all, agreements, _ = procedure_1(
                full_precision(u_hat), self.iterations, self.none_of_the_above, self.bias,
                self.full_graph, last_agreement)
        return v, c_all, agreements

    def forward(self, u_hat: torch.Tensor, activations: torch.Tensor | None = None,
                children: torch.Tensor | None = None,
                num_children: int | None = None) -> Routed:
        fully_connected_only(self, children)
        if self.full_graph or self.bias is not None:
            v, c, _ = self.route(u_hat)  # (B, J, D) float32, c[0] None
            lengths = torch.linalg.vector_norm(v, dim=-1)  # (B, J)
        else:  # gradients through the last iteration only: its analytic gradient
            with torch.autocast(device_type=u_hat.device.type, enabled=False):
                v, lengths, *c = LastIterationRouting.apply(
                    full_precision(u_hat), self.iterations, self.none_of_the_above)
            c = [None, *c[:-3]]  # the squash's parts dropped
        c[0] = uniform_couplings(u_hat, uniform_share(u_hat.shape[1], self.none_of_the_above),
                                 v.dtype)  # (B, J, I) a view of 1/J
        return Routed(v, lengths, tuple(c))  # (B, J, D), (B, J)

    def agreements(self, u_hat: torch.Tensor,
                   activations: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """u_hat . v of every iteration (B, J, I), the last one included."""
        return tuple(self.route(u_hat, last_agreement=True)[2])
