"""One slow, obviously-right reference per routing algorithm, written from its paper's
equations with plain loops over examples n, parents j and children i (vectors over the pose
entries d). Every router of capsnet.routing is tested against its reference here; the
references are differentiable where the tests need gradients.

Layout as the library's: u_hat (B, J, I, D), u_hat[n, j, i] the prediction of child i for
parent j (the vote V_ij for EM routing); each reference returns a :class:`Routed`.
"""
from __future__ import annotations

import math
from collections import defaultdict

import torch

from capsnet.routing import (
    DynamicRouter,
    EMRouter,
    InvertedAttentionRouter,
    Routed,
    Router,
    SelfAttentionRouter,
)
from capsnet.routing.em import ASSIGNED_FLOOR, inverse_temperatures

LN_EPS = 1e-5  # nn.LayerNorm's default, as in the authors' code of inverted attention


def softmax_list(logits: list[torch.Tensor]) -> list[torch.Tensor]:
    """exp(x_k) / sum_k' exp(x_k') over a list of scalars."""
    e = [x.exp() for x in logits]
    total = sum(e)
    return [x / total for x in e]


def squash_vector(s: torch.Tensor) -> torch.Tensor:
    """Sabour et al. Eq. 1 on one vector (D,): v = |s|^2 / (1 + |s|^2) s / |s|."""
    n2 = (s * s).sum()
    return n2 / (1 + n2) * s / n2.sqrt()


def exp_squash_vector(s: torch.Tensor) -> torch.Tensor:
    """Efficient-CapsNet's squash on one vector (D,): v = (1 - e^-|s|) s / |s|."""
    length = (s * s).sum().sqrt()
    return (1 - (-length).exp()) * s / length


def layer_norm_vector(s: torch.Tensor, gain: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """(s - mean) / sqrt(var + eps) * gain + bias on one vector (D,), biased variance."""
    mean = s.sum() / len(s)
    var = ((s - mean) ** 2).sum() / len(s)
    return (s - mean) / (var + LN_EPS).sqrt() * gain + bias


def as_routed(poses: list, activations: list, couplings: list) -> Routed:
    """Stack per-example lists: poses B x J x (D,), activations B x J scalars, couplings
    R x B x (J, I)."""
    return Routed(torch.stack([torch.stack(p) for p in poses]),
                  torch.stack([torch.stack(a) for a in activations]),
                  tuple(torch.stack(c) for c in couplings))


def by_parent(c: list[list[torch.Tensor]], J: int, I: int) -> torch.Tensor:
    """Couplings indexed [i][j] (as Procedure 1 writes c_ij) -> a (J, I) tensor."""
    return torch.stack([torch.stack([c[i][j] for i in range(I)]) for j in range(J)])


def dynamic_reference(u_hat: torch.Tensor, iterations: int, full_graph: bool = False,
                      none_of_the_above: bool = False) -> Routed:
    """Sabour et al. 2017, Procedure 1, for each example: b_ij <- 0; repeat: c_i =
    softmax_j(b_i); s_j = sum_i c_ij u_hat_j|i; v_j = squash(s_j); b_ij += u_hat_j|i . v_j.
    Returns poses v, activations |v_j| and the couplings of every iteration.

    ``none_of_the_above``: the softmax has one more category with a logit fixed at 0 (the
    paper's section 7), dropped afterwards. Unless ``full_graph`` the iterations before the
    last see u_hat detached (gradients reach u_hat through the last iteration only)."""
    B, J, I, _ = u_hat.shape
    zero = torch.zeros((), dtype=u_hat.dtype)
    poses, lengths, couplings = [], [], [[] for _ in range(iterations)]
    for n in range(B):
        b = [[zero] * J for _ in range(I)]  # b_ij, indexed [i][j]
        for r in range(iterations):
            u = u_hat[n] if full_graph or r == iterations - 1 else u_hat[n].detach()  # (J, I, D)
            if none_of_the_above:
                c = [softmax_list([zero, *b[i]])[1:] for i in range(I)]
            else:
                c = [softmax_list(b[i]) for i in range(I)]  # over the parents j
            couplings[r].append(by_parent(c, J, I))
            v = [squash_vector(sum(c[i][j] * u[j, i] for i in range(I))) for j in range(J)]
            b = [[b[i][j] + (u[j, i] * v[j]).sum() for j in range(J)] for i in range(I)]
        poses.append(v)
        lengths.append([(v[j] * v[j]).sum().sqrt() for j in range(J)])
    return as_routed(poses, lengths, couplings)


def inverted_attention_reference(u_hat: torch.Tensor, router: InvertedAttentionRouter) -> Routed:
    """Tsai et al. 2020, Procedure 1, for each example: p_j <- 0; repeat: a_ij = p_j . v_ij
    (Eq. 2, scaled by 1/sqrt(D) as in the authors' code); r_i = softmax_j(a_i) (Eq. 3, over
    the parents); s_j = sum_i r_ij v_ij, p_j = LayerNorm(s_j) (lines 5-6). Activations:
    |squash(s_j)| of the last iteration."""
    gain, bias = router.norm.weight, router.norm.bias
    B, J, I, D = u_hat.shape
    poses, scores, couplings = [], [], [[] for _ in range(router.iterations)]
    for n in range(B):
        p = [torch.zeros(D, dtype=u_hat.dtype)] * J  # "set to 0 initially"
        for t in range(router.iterations):
            a = [[(p[j] * u_hat[n, j, i]).sum() / math.sqrt(D) for j in range(J)]
                 for i in range(I)]
            r = [softmax_list(a[i]) for i in range(I)]  # [i][j]
            couplings[t].append(by_parent(r, J, I))
            s = [sum(r[i][j] * u_hat[n, j, i] for i in range(I)) for j in range(J)]
            p = [layer_norm_vector(s[j], gain, bias) for j in range(J)]
        poses.append(p)
        scores.append([squash_vector(s[j]).pow(2).sum().sqrt() for j in range(J)])
    return as_routed(poses, scores, couplings)


def self_attention_reference(u_hat: torch.Tensor, b: torch.Tensor) -> Routed:
    """Mazzia et al. 2021, self-attention routing, for each example and parent j: A_j =
    U_j U_j^T / sqrt(D) formed entry by entry; each child's logit is the sum of its row of
    A_j; C is the softmax of the logits over the parents; s_j = sum_i (C_ji + B_ji)
    u_hat_j|i; v_j = (1 - e^-|s_j|) s_j / |s_j|. Activations |v_j|; couplings (C,)."""
    B, J, I, D = u_hat.shape
    poses, lengths, couplings = [], [], [[]]
    for n in range(B):
        logits = [[None] * J for _ in range(I)]  # [i][j]
        for j in range(J):
            A = [[(u_hat[n, j, i] * u_hat[n, j, k]).sum() / math.sqrt(D) for k in range(I)]
                 for i in range(I)]
            for i in range(I):
                logits[i][j] = sum(A[i])
        c = [softmax_list(logits[i]) for i in range(I)]  # over the parents j
        couplings[0].append(by_parent(c, J, I))
        v = [exp_squash_vector(sum((c[i][j] + b[j, i]) * u_hat[n, j, i] for i in range(I)))
             for j in range(J)]
        poses.append(v)
        lengths.append([(v[j] * v[j]).sum().sqrt() for j in range(J)])
    return as_routed(poses, lengths, couplings)


def em_procedure_1(V: list, a: list, children: list, beta_u: list, beta_a: list,
                   lambdas: list[float], eps: float) -> tuple[list, list, list]:
    """Hinton et al. 2018, Procedure 1 literally, for ONE example, with Python loops over
    i, j, h and the Gaussian density itself (not its log): obviously right on small, tame
    inputs. V[j][k][h] votes, a[n] child activations, children[j][k] the child in parent
    j's slot k, beta_u[j], beta_a[j] per parent. Returns mu[j][h], a_out[j] and the R[j][k]
    of each iteration's M-step."""
    J, K = len(V), len(V[0])
    H = len(V[0][0])
    parents_of = defaultdict(list)  # child -> its parents' slots (j, k)
    for j in range(J):
        for k in range(K):
            parents_of[children[j][k]].append((j, k))
    # for all i, j: R_ij <- 1 / (number of parents of i)
    R = [[1.0 / len(parents_of[children[j][k]]) for k in range(K)] for j in range(J)]
    history = []
    for t, lam in enumerate(lambdas):
        history.append([row[:] for row in R])
        mu, var, a_out = [], [], []
        for j in range(J):  # M-step
            r = [R[j][k] * a[children[j][k]] for k in range(K)]  # R_ij <- R_ij a_i
            total = sum(r)
            norm = max(total, ASSIGNED_FLOOR)
            mu_j = [sum(r[k] * V[j][k][h] for k in range(K)) / norm for h in range(H)]
            var_j = [sum(r[k] * (V[j][k][h] - mu_j[h]) ** 2 for k in range(K)) / norm + eps
                     for h in range(H)]
            cost = sum((beta_u[j] + math.log(math.sqrt(var_j[h]))) * total for h in range(H))
            a_out.append(1.0 / (1.0 + math.exp(-lam * (beta_a[j] - cost))))
            mu.append(mu_j)
            var.append(var_j)
        if t == len(lambdas) - 1:
            return mu, a_out, history
        p = [[0.0] * K for _ in range(J)]  # E-step
        for j in range(J):
            for k in range(K):
                density = 1.0
                for h in range(H):
                    density *= math.exp(-(V[j][k][h] - mu[j][h]) ** 2 / (2 * var[j][h])) \
                        / math.sqrt(2 * math.pi * var[j][h])
                p[j][k] = density
        for slots in parents_of.values():  # R_ij <- a_j p_ij / sum over all parents of i
            z = sum(a_out[j] * p[j][k] for j, k in slots)
            for j, k in slots:
                R[j][k] = a_out[j] * p[j][k] / z
    raise AssertionError("no iterations")


def em_reference(router: EMRouter, u_hat: torch.Tensor, activations: torch.Tensor,
                 children: torch.Tensor | None) -> Routed:
    """:func:`em_procedure_1` on each example, float64: poses mu (B, J, D), activations a
    (B, J), couplings R per iteration (B, J, K)."""
    _, J, K, _ = u_hat.shape
    if children is None:
        children = torch.arange(K).expand(J, K)
    types = router.beta_u.shape[0]
    beta_u = [router.beta_u[j % types].item() for j in range(J)]
    beta_a = [router.beta_a[j % types].item() for j in range(J)]
    lambdas = inverse_temperatures(router.iterations, router.final_lambda)
    mus, acts, Rs = [], [], []
    for V, a in zip(u_hat.double().tolist(), activations.double().tolist(), strict=True):
        mu, a_out, history = em_procedure_1(V, a, children.tolist(), beta_u, beta_a, lambdas,
                                            router.variance_eps)
        mus.append(mu)
        acts.append(a_out)
        Rs.append(history)
    R = torch.tensor(Rs, dtype=torch.float64).transpose(0, 1)  # (iterations, B, J, K)
    return Routed(torch.tensor(mus, dtype=torch.float64),
                  torch.tensor(acts, dtype=torch.float64), tuple(R))


def reference_routing(router: Router, u_hat: torch.Tensor) -> Routed:
    """The reference of a CapsNet router (the ``--routing`` choices), with its options."""
    if isinstance(router, DynamicRouter):
        return dynamic_reference(u_hat, router.iterations, router.full_graph,
                                 router.none_of_the_above)
    if isinstance(router, InvertedAttentionRouter):
        return inverted_attention_reference(u_hat, router)
    if isinstance(router, SelfAttentionRouter):
        return self_attention_reference(u_hat, router.b)
    raise TypeError(f"no reference for {type(router).__name__}")


def assert_routed_close(got: Routed, want: Routed, **tolerance) -> None:
    torch.testing.assert_close(got.poses, want.poses, **tolerance)
    torch.testing.assert_close(got.activations, want.activations, **tolerance)
    assert len(got.couplings) == len(want.couplings)
    for c, ref in zip(got.couplings, want.couplings, strict=True):
        torch.testing.assert_close(c, ref, **tolerance)
