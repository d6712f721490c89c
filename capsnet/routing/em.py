"""EM routing between matrix capsules (Hinton, Sabour & Frosst 2018, Procedure 1), router "em".

Each parent j is a Gaussian over the 16 pose entries, fitted to its children's votes V_ij
weighted by r_ij = R_ij a_i. Per iteration t, with lambda_t = final_lambda (1 - 0.95^(t+1)):

    M-step:  mu_j = sum_i r_ij V_ij / sum_i r_ij,  (s_j)^2 = weighted variance + eps,
             cost_j^h = (beta_u + log s_j^h) sum_i r_ij,
             a_j = logistic(lambda_t (beta_a - sum_h cost_j^h))
    E-step:  R_ij = a_j p_ij / sum_{j' parent of i} a_j' p_ij'   (in log space)

The first R_ij is 1 / (number of parents of i); the last iteration ends after its M-step;
gradients flow through every iteration. In a convolutional layer ``children`` (J, K) names
the global child in each parent slot, and both normalisations run over all of a child's
parents across positions. docs/models-em.md lists the pitfalls and their tests."""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from capsnet.routing.base import Routed, Router
from capsnet.squashing import full_precision

FINAL_LAMBDA = 0.01  # the authors' final inverse temperature (OpenReview)
LAMBDA_GROWTH = 0.95  # lambda_t = FINAL_LAMBDA (1 - LAMBDA_GROWTH^(t + 1))
# Added to every variance: a parent fitted to one vote (or to identical votes) has a
# standard deviation of at least 1e-3 pose units, not zero (log 0, division by zero).
VARIANCE_EPS = 1e-6
# sum_i r_ij below this counts as this: a parent whose children are all inactive gets
# mu = 0 and cost 0 (its activation logistic(lambda beta_a)) instead of 0 / 0.
ASSIGNED_FLOOR = 1e-9
LOG_2PI = math.log(2 * math.pi)


def inverse_temperatures(iterations: int, final_lambda: float = FINAL_LAMBDA) -> list[float]:
    """lambda_t = final_lambda (1 - 0.95^(t + 1)) for t = 0 .. iterations - 1 (increasing)."""
    return [final_lambda * (1 - LAMBDA_GROWTH ** (t + 1)) for t in range(iterations)]


def parents_per_child(children: torch.Tensor, num_children: int) -> torch.Tensor:
    """(N,) how many parent slots (J, K) hold each child; a scatter-add, exportable to ONNX."""
    index = children.reshape(-1)  # (J*K,)
    return torch.zeros(num_children, dtype=torch.long, device=children.device).scatter_add(
        0, index, torch.ones_like(index))  # (N,)


def initial_assignments(J: int, K: int, children: torch.Tensor | None, num_children: int | None,
                        dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """R_ij before the first M-step: 1 / (number of parents of child i), (J, K)."""
    if children is None:
        return torch.full((J, K), 1.0 / J, dtype=dtype, device=device)  # (J, K)
    parents = parents_per_child(children, num_children)  # (N,)
    return 1.0 / parents[children].to(dtype)  # (J, K)


def normalise_over_parents(log_w: torch.Tensor, children: torch.Tensor | None,
                           num_children: int | None) -> torch.Tensor:
    """exp(log_w_ij) / sum over every parent slot j' holding child i of exp(log_w_j'i).

    log_w: (B, J, K). Without ``children`` a softmax over J; with ``children`` (J, K) a
    logsumexp by scatter over global child ids, each child's peak subtracted first."""
    if children is None:
        return torch.softmax(log_w, dim=1)  # (B, J, K)
    B, J, K = log_w.shape
    flat = log_w.reshape(B, J * K)  # (B, J*K)
    index = children.reshape(-1)  # (J*K,) global child of each slot
    index = index.expand(B, -1)  # (B, J*K)
    with torch.no_grad():
        peak = flat.new_full((B, num_children), -math.inf)  # (B, N)
        peak.scatter_reduce_(1, index, flat, "amax")  # each child's largest log weight
    shifted = (flat - peak.gather(1, index)).exp()  # (B, J*K) in [0, 1], 1 at each peak
    total = flat.new_zeros(B, num_children).scatter_add(1, index, shifted)  # (B, N) >= 1
    return (shifted / total.gather(1, index)).view(B, J, K)  # (B, J, K)


def per_parent(beta: torch.Tensor, J: int) -> torch.Tensor:
    """A per-type parameter (T,) for J parents laid out (position, type), type fastest: (J,)."""
    T = beta.shape[0]
    if J % T:
        raise ValueError(f"{J} parents are not a whole number of positions of {T} types")
    return beta.repeat(J // T)  # (J,)


class MStep(NamedTuple):
    """The parents' Gaussians and activations, and the votes' squared deviations."""

    mu: torch.Tensor  # (B, J, D) the parents' poses
    var: torch.Tensor  # (B, J, D) (sigma_j^h)^2, variance_eps included
    logits: torch.Tensor  # (B, J) lambda (beta_a - sum_h cost_h): a_j = logistic(logits)
    sq: torch.Tensor  # (B, J, K, D) (V_ij^h - mu_j^h)^2


def m_step(R: torch.Tensor, a_i: torch.Tensor, V: torch.Tensor, beta_u: torch.Tensor,
           beta_a: torch.Tensor, inverse_temperature: float,
           variance_eps: float = VARIANCE_EPS) -> MStep:
    """Procedure 1's M-step. R: (B or 1, J, K); a_i: (B, J or 1, K); V: (B, J, K, D);
    beta_u, beta_a: (J,). The variance is the weighted mean of squared deviations."""
    r = R * a_i  # (B, J, K) r_ij = R_ij a_i
    r_sum = r.sum(dim=2)  # (B, J) sum_i r_ij: the data assigned to j
    w = r / r_sum.clamp_min(ASSIGNED_FLOOR).unsqueeze(-1)  # (B, J, K), sums to 1 over i
    mu = torch.einsum("bjk,bjkd->bjd", w, V)  # (B, J, D)
    # (V - mu)^2 in one fused pass over the votes (mse_loss without reduction), half the
    # memory traffic of a subtraction then a square, forward and backward
    sq = F.mse_loss(V, mu.unsqueeze(2).expand_as(V), reduction="none")  # (B, J, K, D)
    var = torch.einsum("bjk,bjkd->bjd", w, sq) + variance_eps  # (B, J, D)
    cost = (beta_u.unsqueeze(-1) + 0.5 * var.log()) * r_sum.unsqueeze(-1)  # (B, J, D) cost_h
    logits = inverse_temperature * (beta_a - cost.sum(dim=-1))  # (B, J)
    return MStep(mu, var, logits, sq)


def log_gaussian(sq: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
    """log p_ij (B, J, K) from squared deviations sq (B, J, K, D) and variances var (B, J, D)."""
    D = var.shape[-1]
    mahalanobis = torch.einsum("bjkd,bjd->bjk", sq, var.reciprocal())  # (B, J, K)
    log_norm = var.log().sum(dim=-1) + D * LOG_2PI  # (B, J)
    return -0.5 * (mahalanobis + log_norm.unsqueeze(-1))  # (B, J, K)


def e_step(fit: MStep, children: torch.Tensor | None, num_children: int | None) -> torch.Tensor:
    """Procedure 1's E-step, in log space: R_ij = a_j p_ij / sum_j' a_j' p_ij' over i's parents."""
    log_ap = F.logsigmoid(fit.logits).unsqueeze(-1) + log_gaussian(fit.sq, fit.var)  # (B,J,K)
    return normalise_over_parents(log_ap, children, num_children)  # (B, J, K)


class EMRouter(Router):
    """EM routing for parents of ``parent_types`` types, each with its own beta_u and beta_a;
    parents laid out (position, type), type fastest.

    forward(u_hat (B, J, K, D), activations (B, I)) -> Routed(poses (B, J, D), activations
    (B, J), couplings: each iteration's R (B, J, K)). Without ``children`` K = I. Runs in
    float32 (float64 for float64 votes) even under autocast."""

    name = "em"
    needs_activations = True
    coupling_symbol = "R"
    coupling_meaning = ("R_ij, the assignments each M-step weighs the votes by (times the "
                        "child's activation a_i): normalised over the classes (iteration 1: "
                        "uniform)")

    def __init__(self, parent_types: int, iterations: int = 3, final_lambda: float = FINAL_LAMBDA,
                 variance_eps: float = VARIANCE_EPS):
        super().__init__()
        if iterations < 1:
            raise ValueError("EM routing needs at least one iteration")
        self.iterations, self.final_lambda = iterations, final_lambda
        self.variance_eps = variance_eps
        self.beta_u = nn.Parameter(torch.zeros(parent_types))  # per type: cost offset
        self.beta_a = nn.Parameter(torch.zeros(parent_types))  # per type: activation offset

    def forward(self, u_hat: torch.Tensor, activations: torch.Tensor | None = None,
                children: torch.Tensor | None = None,
                num_children: int | None = None) -> Routed:
        if activations is None:
            raise ValueError("EM routing needs the children's activations")
        with torch.autocast(device_type=u_hat.device.type, enabled=False):
            V, a = full_precision(u_hat), full_precision(activations)  # (B, J, K, D), (B, I)
            B, J, K, D = V.shape
            a_i = a.unsqueeze(1) if children is None else a[:, children]  # (B, 1 or J, K)
            beta_u = per_parent(self.beta_u, J).to(V.dtype)  # (J,)
            beta_a = per_parent(self.beta_a, J).to(V.dtype)  # (J,)
            R = initial_assignments(J, K, children, num_children, V.dtype, V.device)  # (J, K)
            R = R.unsqueeze(0)  # (1, J, K)
            couplings = []
            lambdas = inverse_temperatures(self.iterations, self.final_lambda)
            for t, inverse_temperature in enumerate(lambdas):
                couplings.append(R.expand(B, J, K))
                fit = m_step(R, a_i, V, beta_u, beta_a, inverse_temperature, self.variance_eps)
                if t < self.iterations - 1:
                    R = e_step(fit, children, num_children)  # (B, J, K)
            return Routed(fit.mu, torch.sigmoid(fit.logits), tuple(couplings))

    def extra_repr(self) -> str:
        return (f"types={self.beta_u.shape[0]}, iterations={self.iterations}, "
                f"final_lambda={self.final_lambda}")
