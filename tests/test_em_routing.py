"""EM routing (Hinton et al. 2018, Procedure 1) against the slow loop-by-loop reference
(tests/helpers_routing.py), and one test per known pitfall of reimplementations
(docs/models-em.md lists them)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from capsnet.layers.matrix_caps import window_children
from capsnet.routing import ROUTERS, router_class
from capsnet.routing.em import (
    VARIANCE_EPS,
    EMRouter,
    MStep,
    e_step,
    initial_assignments,
    inverse_temperatures,
    m_step,
    normalise_over_parents,
    parents_per_child,
)
from tests import ibm_em_routing as ibm
from tests.helpers_routing import em_reference

B, D = 2, 16  # examples, pose entries (4x4)


def make_router(types: int, seed: int = 0, iterations: int = 3, final_lambda: float = 0.01,
                scale: float = 1.0) -> EMRouter:
    """A router with random (not zero) betas, so that they are tested too."""
    router = EMRouter(types, iterations, final_lambda).double()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        router.beta_u.copy_(scale * torch.randn(types, generator=g))
        router.beta_a.copy_(scale * torch.randn(types, generator=g))
    return router


def conv_layer(grid: int, kernel: int, stride: int, in_types: int, out_types: int):
    """The children index of a convolutional capsule layer: (J, K) and num_children."""
    windows = window_children(grid, kernel, stride, in_types)  # (P, K)
    P, K = windows.shape
    children = windows[:, None, :].expand(P, out_types, K).reshape(P * out_types, K)
    return children, grid * grid * in_types


def random_inputs(J: int, K: int, N: int, seed: int = 0, scale: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    votes = scale * torch.randn(B, J, K, D, generator=g, dtype=torch.float64)
    activations = torch.rand(B, N, generator=g, dtype=torch.float64)
    return votes, activations


# ----------------------------------------------------------------------------------------
# Against the reference
# ----------------------------------------------------------------------------------------

# large final_lambda: the activations (and so the E-step) depend strongly on the costs
@pytest.mark.parametrize("final_lambda", [0.01, 1.0])
def test_fully_connected_layer_matches_the_loop_reference(final_lambda):
    J, I = 3, 5
    router = make_router(J, final_lambda=final_lambda)
    votes, activations = random_inputs(J, I, I)
    out = router(votes, activations)
    mu, a, R = em_reference(router, votes, activations, None)
    torch.testing.assert_close(out.poses, mu, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(out.activations, a, rtol=1e-9, atol=1e-9)
    assert len(out.couplings) == router.iterations
    for ours, theirs in zip(out.couplings, R, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("grid, kernel, stride", [(5, 3, 1), (5, 3, 2), (6, 3, 2)])
def test_convolutional_layer_matches_the_loop_reference(grid, kernel, stride):
    """Overlapping windows (stride 1 and 2), children at borders with fewer parents, and
    (6, 3, 2) a last row and column no window reaches (children without parents)."""
    in_types, out_types = 2, 3
    children, N = conv_layer(grid, kernel, stride, in_types, out_types)
    J, K = children.shape
    router = make_router(out_types, final_lambda=1.0)
    votes, activations = random_inputs(J, K, N, seed=1)
    out = router(votes, activations, children, N)
    mu, a, R = em_reference(router, votes, activations, children)
    torch.testing.assert_close(out.poses, mu, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(out.activations, a, rtol=1e-9, atol=1e-9)
    for ours, theirs in zip(out.couplings, R, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-9)


def test_float32_matches_float64():
    children, N = conv_layer(5, 3, 1, 2, 3)
    router = make_router(3, final_lambda=1.0)
    votes, activations = random_inputs(*children.shape, N)
    expected = router(votes, activations, children, N)
    out = router.float()(votes.float(), activations.float(), children, N)
    assert out.poses.dtype == out.activations.dtype == torch.float32
    torch.testing.assert_close(out.poses.double(), expected.poses, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.activations.double(), expected.activations, rtol=1e-4,
                               atol=1e-5)


def test_registered_as_em_and_shapes():
    assert ROUTERS["em"] is EMRouter and router_class("em") is EMRouter
    J, K = 6, 7
    router = EMRouter(2, iterations=4)
    out = router(torch.randn(B, J, K, D), torch.rand(B, K))
    assert out.poses.shape == (B, J, D) and out.activations.shape == (B, J)
    assert len(out.couplings) == 4 and all(c.shape == (B, J, K) for c in out.couplings)
    assert ((out.activations > 0) & (out.activations < 1)).all()
    with pytest.raises(ValueError, match="activations"):
        router(torch.randn(B, J, K, D))
    with pytest.raises(ValueError, match="whole number"):
        EMRouter(4)(torch.randn(B, J, K, D), torch.rand(B, K))  # 6 parents, 4 types


# ----------------------------------------------------------------------------------------
# Pitfall (1): parents at different positions compete for the same child
# ----------------------------------------------------------------------------------------

def test_pitfall_1_assignments_sum_to_one_over_all_parents_of_each_child():
    children, N = conv_layer(5, 3, 1, 2, 3)
    router = make_router(3, final_lambda=1.0)
    votes, activations = random_inputs(*children.shape, N)
    out = router(votes, activations, children, N)
    for R in out.couplings:
        per_child = torch.zeros(B, N, dtype=R.dtype).index_add(1, children.reshape(-1),
                                                               R.reshape(B, -1))  # (B, N)
        torch.testing.assert_close(per_child, torch.ones_like(per_child))


def test_pitfall_1_normalising_within_one_window_is_not_the_same():
    """Public code that takes a softmax over the parent types of one window gives every
    child a total assignment of (number of windows it is in), not 1."""
    children, N = conv_layer(5, 3, 1, 2, 3)
    J, K = children.shape
    g = torch.Generator().manual_seed(0)
    log_w = torch.randn(B, J, K, generator=g, dtype=torch.float64)
    ours = normalise_over_parents(log_w, children, N)
    per_window = torch.softmax(log_w.view(B, J // 3, 3, K), dim=2).view(B, J, K)
    totals = torch.zeros(B, N, dtype=torch.float64).index_add(1, children.reshape(-1),
                                                               per_window.reshape(B, -1))
    centre = (2 * 5 + 2) * 2  # child (2, 2), type 0: in all 9 windows
    assert totals[0, centre].item() == pytest.approx(9.0)
    assert not torch.allclose(ours, per_window)


def test_normalisation_without_children_is_a_softmax_over_parents():
    J, K = 4, 5
    log_w = torch.randn(B, J, K, dtype=torch.float64)
    every = torch.arange(K).expand(J, K)
    torch.testing.assert_close(normalise_over_parents(log_w, every, K),
                               normalise_over_parents(log_w, None, None))


# ----------------------------------------------------------------------------------------
# Pitfall (2): a parent with one child (or inactive children) collapses its variance
# ----------------------------------------------------------------------------------------

def test_pitfall_2_a_parent_with_one_child_gives_finite_outputs_and_gradients():
    router = EMRouter(3, final_lambda=1.0)
    votes = torch.randn(B, 3, 1, D, requires_grad=True)  # every parent sees one child
    activations = torch.rand(B, 1, requires_grad=True)
    out = router(votes, activations)
    torch.testing.assert_close(out.poses, votes.detach()[:, :, 0])  # mu = the one vote
    assert torch.isfinite(out.activations).all()
    (out.poses.sum() + out.activations.sum()).backward()
    for t in (votes.grad, activations.grad, router.beta_u.grad, router.beta_a.grad):
        assert torch.isfinite(t).all()


def test_pitfall_2_identical_votes_and_inactive_children_are_finite():
    router = EMRouter(2)
    votes = torch.ones(B, 2, 5, D, requires_grad=True)  # perfect agreement: variance 0 + eps
    activations = torch.zeros(B, 5, requires_grad=True)  # and no data at all
    out = router(votes, activations)
    assert torch.isfinite(out.poses).all() and torch.isfinite(out.activations).all()
    # no data: cost 0, a_j = logistic(lambda beta_a) = 1/2 with beta_a = 0
    torch.testing.assert_close(out.activations, torch.full((B, 2), 0.5))
    (out.poses.sum() + out.activations.sum()).backward()
    assert torch.isfinite(votes.grad).all() and torch.isfinite(activations.grad).all()


# ----------------------------------------------------------------------------------------
# Pitfall (3): the data of each parent are R_ij a_i normalised over i within the parent
# ----------------------------------------------------------------------------------------

def test_pitfall_3_mu_is_the_r_weighted_mean_within_each_parent():
    J, I = 3, 6
    router = make_router(J, iterations=1)  # one M-step: R = 1/J
    votes, activations = random_inputs(J, I, I)
    out = router(votes, activations)
    weights = activations / activations.sum(dim=1, keepdim=True)  # r_ij / sum_i r_ij
    torch.testing.assert_close(out.poses, torch.einsum("bi,bjid->bjd", weights, votes))


def test_pitfall_3_child_activations_weigh_the_votes():
    """Public code that divides R_ij a_i by its sum over the parents j cancels a_i (it does
    not depend on j): there, an inactive child's vote moves the parents as much as an
    active one's. Here it does not move them at all."""
    J, I = 3, 6
    router = make_router(J, final_lambda=1.0)
    votes, activations = random_inputs(J, I, I)
    activations[:, 0] = 0.0
    moved = votes.clone()
    moved[:, :, 0] += 100.0  # the inactive child votes somewhere else entirely
    torch.testing.assert_close(router(moved, activations).poses, router(votes, activations).poses)
    activations[:, 0] = 1.0
    assert not torch.allclose(router(moved, activations).poses, router(votes, activations).poses)


def test_pitfall_3_scaling_every_activation_keeps_the_means():
    J, I = 3, 6
    router = make_router(J, iterations=1)
    votes, activations = random_inputs(J, I, I)
    torch.testing.assert_close(router(votes, 0.1 * activations).poses,
                               router(votes, activations).poses)


# ----------------------------------------------------------------------------------------
# Pitfall (4): log-space E-step, no exp of large numbers
# ----------------------------------------------------------------------------------------

def test_pitfall_4_far_votes_and_tight_clusters_still_give_assignments_that_sum_to_one():
    """Every density p_ij underflows to 0 in float32 (votes 1e3 apart, variances near the
    floor): a_j p_ij / sum_j a_j p_ij would be 0/0. In log space it is exact."""
    children, N = conv_layer(5, 3, 1, 2, 3)
    J, K = children.shape
    g = torch.Generator().manual_seed(0)
    votes = 1e3 * torch.randn(B, J, K, D, generator=g)
    votes[:, :, 1:] = votes[:, :, :1] + 1e-4 * torch.randn(B, J, K - 1, D, generator=g)
    out = EMRouter(3, final_lambda=1.0)(votes, torch.rand(B, N, generator=g), children, N)
    for R in out.couplings:
        assert torch.isfinite(R).all()
        per_child = torch.zeros(B, N).index_add(1, children.reshape(-1), R.reshape(B, -1))
        torch.testing.assert_close(per_child, torch.ones_like(per_child))
    assert torch.isfinite(out.poses).all() and torch.isfinite(out.activations).all()


@pytest.mark.parametrize("scale", [1e-6, 1.0, 1e6])
def test_pitfall_4_no_nan_at_extreme_scales_with_gradients(scale):
    children, N = conv_layer(5, 3, 2, 2, 3)
    J, K = children.shape
    g = torch.Generator().manual_seed(0)
    votes = (scale * torch.randn(B, J, K, D, generator=g)).requires_grad_()
    activations = torch.rand(B, N, generator=g)
    activations[0] = 0.0  # one example with no active child at all
    activations = activations.requires_grad_()
    router = EMRouter(3, final_lambda=1.0)
    out = router(votes, activations, children, N)
    assert torch.isfinite(out.poses).all() and torch.isfinite(out.activations).all()
    (out.poses.sum() / scale + out.activations.sum()).backward()
    for t in (votes.grad, activations.grad, router.beta_u.grad, router.beta_a.grad):
        assert torch.isfinite(t).all()


# ----------------------------------------------------------------------------------------
# Pitfall (5): the first assignment is 1 / (number of parents of the child)
# ----------------------------------------------------------------------------------------

def test_pitfall_5_border_children_start_with_larger_shares():
    out_types = 3
    children, N = conv_layer(5, 3, 1, 2, out_types)
    J, K = children.shape
    parents = parents_per_child(children, N).view(5, 5, 2)  # (rows, columns, types)
    assert parents[0, 0, 0] == out_types  # a corner: one window
    assert parents[0, 2, 0] == 3 * out_types  # an edge's middle: three windows
    assert parents[2, 2, 0] == 9 * out_types  # the centre: all nine
    R0 = initial_assignments(J, K, children, N, torch.float64, torch.device("cpu"))
    torch.testing.assert_close(R0, 1.0 / parents.view(-1)[children].double())
    out = EMRouter(out_types)(torch.randn(B, J, K, D), torch.rand(B, N), children, N)
    torch.testing.assert_close(out.couplings[0][0], R0.float())
    corner_slot = (children == 0).nonzero()[0]  # child 0 in parent 0's first slot
    assert out.couplings[0][0, corner_slot[0], corner_slot[1]].item() == pytest.approx(1 / 3)


# ----------------------------------------------------------------------------------------
# Pitfall (6): the inverse temperature schedule
# ----------------------------------------------------------------------------------------

def test_pitfall_6_inverse_temperature_schedule_is_the_authors():
    """lambda = final_lambda (1 - 0.95^(i + 1)), final_lambda = 0.01 (OpenReview)."""
    assert inverse_temperatures(3) == pytest.approx([0.01 * 0.05, 0.01 * 0.0975,
                                                     0.01 * 0.142625])
    schedule = inverse_temperatures(5, final_lambda=2.0)
    assert all(a < b for a, b in zip(schedule, schedule[1:], strict=False))
    assert schedule[-1] < 2.0  # approached, never reached


def test_pitfall_6_the_last_activation_uses_the_last_temperature():
    """One iteration: a_j = logistic(lambda_0 (beta_a - sum_h cost_h)) by hand."""
    J, I = 2, 4
    router = make_router(J, iterations=1, final_lambda=3.0)
    votes, activations = random_inputs(J, I, I)
    r = activations[:, None, :] / J  # (B, J, I)
    w = r / r.sum(-1, keepdim=True)
    mu = torch.einsum("bji,bjid->bjd", w, votes)
    var = torch.einsum("bji,bjid->bjd", w, (votes - mu[:, :, None]) ** 2) + VARIANCE_EPS
    cost = ((router.beta_u[:, None] + 0.5 * var.log()) * r.sum(-1, keepdim=True)).sum(-1)
    expected = torch.sigmoid(inverse_temperatures(1, 3.0)[0] * (router.beta_a - cost))
    torch.testing.assert_close(router(votes, activations).activations, expected.detach())


# ----------------------------------------------------------------------------------------
# Gradients and precision
# ----------------------------------------------------------------------------------------

def test_gradients_flow_through_every_iteration():
    """No stop-gradient (the authors): the votes reach the output through the E-steps'
    assignments too, so the gradient differs from the last M-step's alone (its R fixed)."""
    children, N = conv_layer(5, 3, 1, 2, 3)
    router = make_router(3, final_lambda=1.0)
    votes, activations = random_inputs(*children.shape, N)
    votes.requires_grad_()
    activations.requires_grad_()
    out = router(votes, activations, children, N)
    (out.poses.square().sum() + out.activations.sum()).backward()
    for t in (votes.grad, activations.grad, router.beta_u.grad, router.beta_a.grad):
        assert torch.isfinite(t).all() and t.abs().sum() > 0
    J = children.shape[0]
    fixed = m_step(out.couplings[-1].detach(), activations[:, children], votes,
                   router.beta_u.repeat(J // 3), router.beta_a.repeat(J // 3),
                   inverse_temperatures(3, 1.0)[-1])
    torch.testing.assert_close(fixed.mu, out.poses)  # the same last M-step ...
    last_only, = torch.autograd.grad(fixed.mu.square().sum() + torch.sigmoid(fixed.logits).sum(),
                                     votes)
    assert not torch.allclose(last_only, votes.grad)  # ... but not the same gradient


def test_gradcheck_small_layer():
    children, N = conv_layer(4, 3, 1, 1, 2)
    router = make_router(2, final_lambda=1.0, iterations=2)
    votes, activations = random_inputs(*children.shape, N)
    votes = votes[:1, ..., :4].clone().requires_grad_()  # fewer pose entries: quicker
    activations = activations[:1].clone().requires_grad_()

    def routed(v, a):
        out = router(v, a, children, N)
        return out.poses, out.activations

    assert torch.autograd.gradcheck(routed, (votes, activations))


def test_float32_under_bf16_autocast():
    children, N = conv_layer(5, 3, 1, 2, 3)
    router = EMRouter(3, final_lambda=1.0)
    g = torch.Generator().manual_seed(0)
    votes = torch.randn(B, *children.shape, D, generator=g).bfloat16()
    activations = torch.rand(B, N, generator=g).bfloat16()
    expected = router(votes.float(), activations.float(), children, N)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = router(votes, activations, children, N)
    assert out.poses.dtype == out.activations.dtype == torch.float32
    assert all(R.dtype == torch.float32 for R in out.couplings)
    torch.testing.assert_close(out.poses, expected.poses)
    torch.testing.assert_close(out.activations, expected.activations)


# ----------------------------------------------------------------------------------------
# Parity with public code: IBM/matrix-capsules-with-em-routing, transcribed in
# tests/ibm_em_routing.py. Its cost carries layer_norm_factor f = 100 / (K / o): the
# logit lambda (beta_a - f sum cost) is ours with final_lambda f * 0.01 and beta_a / f.
# ----------------------------------------------------------------------------------------

def ibm_inputs(votes: torch.Tensor, activations: torch.Tensor, windows: torch.Tensor,
               out_types: int) -> tuple[np.ndarray, np.ndarray]:
    """Our votes (B, P*o, K, D) and activations (B, N) in IBM's layouts: votes
    (B*P, K, o, D), activations (B*P, K, 1) (each window's children)."""
    Bn, J, K, Dn = votes.shape
    P = J // out_types
    v = votes.view(Bn, P, out_types, K, Dn).permute(0, 1, 3, 2, 4).reshape(Bn * P, K,
                                                                          out_types, Dn)
    a = activations[:, windows].reshape(Bn * P, K, 1)
    return v.numpy(), a.numpy()


def parity_case(grid: int, kernel: int, stride: int, final_lambda: float,
                in_types: int = 2, out_types: int = 3, seed: int = 3) -> dict:
    """Our routing and IBM's on the same votes, activations and betas: 'ours' and 'ibm' as
    (poses (B, P, o, D), activations (B, P, o)), and our router, votes, activations and
    children (None for one window) for the loop reference."""
    windows = window_children(grid, kernel, stride, in_types)  # (P, K)
    P, K = windows.shape
    N = grid * grid * in_types
    children = windows[:, None, :].expand(P, out_types, K).reshape(P * out_types, K)
    if P == 1:  # one window over all children: a fully connected layer
        children = None
    votes, activations = random_inputs(P * out_types, K, N, seed=seed)
    g = torch.Generator().manual_seed(seed)
    beta_v = torch.randn(out_types, generator=g, dtype=torch.float64)
    beta_a = 10 * torch.randn(out_types, generator=g, dtype=torch.float64)
    factor = 100 / (K / out_types)  # IBM's layer_norm_factor
    router = EMRouter(out_types, 3, final_lambda=final_lambda * factor,
                      variance_eps=1e-9).double()
    with torch.no_grad():
        router.beta_u.copy_(beta_v)
        router.beta_a.copy_(beta_a / factor)
        ours = router(votes, activations, children, N)
    v, a = ibm_inputs(votes, activations, windows, out_types)
    poses, acts = ibm.em_routing(v, a, B, ibm.create_routing_map(grid, kernel, stride),
                                 beta_v.numpy().reshape(1, 1, 1, 1, -1, 1),
                                 beta_a.numpy().reshape(1, 1, 1, 1, -1, 1), 3, final_lambda)
    return {"ours": (ours.poses.view(B, P, out_types, D), ours.activations.view(B, P, out_types)),
            "ibm": (torch.from_numpy(poses).reshape(B, P, out_types, D),
                    torch.from_numpy(acts).reshape(B, P, out_types)),
            "inputs": (router, votes, activations, children)}


# (5, 3, 1), (5, 3, 2): convolutional capsules; (3, 3, 1): one window over all children,
# IBM's fully connected class capsules (routing map [[1]] there, the same routing).
# final_lambda: the authors' 0.01 (IBM's default; activations near 1/2) and 0.1 (far from it).
@pytest.mark.parametrize("final_lambda", [0.01, 0.1])
@pytest.mark.parametrize("grid, kernel, stride", [(5, 3, 1), (5, 3, 2), (3, 3, 1)])
def test_parity_with_ibm_em_routing(grid, kernel, stride, final_lambda):
    case = parity_case(grid, kernel, stride, final_lambda)
    (poses, acts), (ibm_poses, ibm_acts) = case["ours"], case["ibm"]
    if final_lambda == 0.1:
        assert acts.max() - acts.min() > 0.5  # spread out: the costs matter
    torch.testing.assert_close(poses, ibm_poses, rtol=0, atol=1e-6)  # measured: 3e-8
    torch.testing.assert_close(acts, ibm_acts, rtol=0, atol=1e-6)  # measured: 6e-9


def ibm_fc_e_step(votes: torch.Tensor, mu: torch.Tensor, var: torch.Tensor,
                  a: torch.Tensor) -> torch.Tensor:
    """IBM's E-step for a fully connected layer (its class capsules: routing map [[1]])
    on our layouts: votes (B, J, K, D), mu and var (B, J, D), a (B, J) -> R (B, J, K)."""
    Bn, J, K, Dn = votes.shape
    rr = ibm.e_step(votes.permute(0, 2, 1, 3).reshape(Bn, 1, 1, K, J, Dn).numpy(),
                    a.reshape(Bn, 1, 1, 1, J, 1).numpy(), mu.reshape(Bn, 1, 1, 1, J, Dn).numpy(),
                    var.reshape(Bn, 1, 1, 1, J, Dn).numpy(), ibm.create_routing_map(1, 1, 1))
    return torch.from_numpy(rr).reshape(Bn, K, J).transpose(1, 2)


def test_ibm_log_of_activation_plus_epsilon_keeps_dead_parents_competing():
    """By design IBM's E-step weighs parent j by log(a_j + 1e-9): a parent whose activation
    is below 1e-9 competes for children as if it had 1e-9. Procedure 1 weighs by a_j."""
    J, K = 3, 4
    g = torch.Generator().manual_seed(0)
    votes = torch.randn(B, J, K, D, generator=g, dtype=torch.float64)
    mu = torch.randn(B, J, D, generator=g, dtype=torch.float64)
    var = 1 + torch.rand(B, J, D, generator=g, dtype=torch.float64)
    sq = (votes - mu.unsqueeze(2)).square()
    alive = torch.tensor([0.0, 0.3, -0.2], dtype=torch.float64).expand(B, J)
    dead = torch.tensor([-34.5, 0.3, -0.2], dtype=torch.float64).expand(B, J)  # a_0 = 1e-15
    for logits in (alive, dead):
        ours = e_step(MStep(mu, var, logits, sq), None, None)
        theirs = ibm_fc_e_step(votes, mu, var, torch.sigmoid(logits))
        if logits is alive:  # the same where every a_j >> 1e-9
            torch.testing.assert_close(ours, theirs, rtol=1e-7, atol=1e-12)
    ratio = theirs[:, 0] / ours[:, 0]  # the dead parent's share: (1e-15 + 1e-9) / 1e-15
    assert ratio.min() > 1e5


def test_ibm_sparse_filler_leaks_assignments_to_non_parents():
    """By design IBM fills the log weights of the parent positions that do not see a child
    with min(min over the whole batch, -100) before its softmax over every parent position.
    A child whose log weights are all near that minimum (here a corner child voting far from
    every parent) then gives most of its assignment to positions that are not its parents:
    its assignments to its real parents sum to far less than 1. Ours sum to 1 (pitfall 4)."""
    grid, kernel, stride, in_types, out_types = 5, 3, 1, 2, 3
    windows = window_children(grid, kernel, stride, in_types)  # (9, 18)
    P, K = windows.shape
    g = torch.Generator().manual_seed(0)
    votes = torch.randn(B, P * out_types, K, D, generator=g, dtype=torch.float64)
    votes[:, :out_types, 0] = 1e3  # child 0 (the corner, only in window 0) votes far away
    activations = torch.rand(B, grid * grid * in_types, generator=g, dtype=torch.float64)
    v, a = ibm_inputs(votes, activations, windows, out_types)
    side = int(math.isqrt(P))
    shape = (B, side, side, 1, out_types, D)
    mean, var = np.zeros(shape), np.ones(shape)  # every parent alike: N(0, 1)
    act = np.full((B, side, side, 1, out_types, 1), 0.5)
    rr = ibm.e_step(v.reshape(B, side, side, K, out_types, D), act, mean, var,
                    ibm.create_routing_map(grid, kernel, stride))  # (B, 3, 3, K, o, 1)
    corner = torch.from_numpy(rr)[:, 0, 0, 0, :, 0].sum(dim=-1)  # (B,) over its 3 parents
    assert (corner < 0.2).all()  # 1/9: shared with 8 positions it has no parent in
    children = windows[:, None, :].expand(P, out_types, K).reshape(P * out_types, K)
    ours = e_step(MStep(torch.zeros(B, P * out_types, D, dtype=torch.float64),
                        torch.ones(B, P * out_types, D, dtype=torch.float64),
                        torch.zeros(B, P * out_types, dtype=torch.float64),
                        votes.square()), children, grid * grid * in_types)
    torch.testing.assert_close(ours[:, :out_types, 0].sum(-1), torch.ones(B, dtype=torch.float64))
