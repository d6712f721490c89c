"""Dynamic routing (Sabour et al. 2017, Procedure 1) against the slow loop reference
(tests/helpers_routing.py): outputs, couplings and gradients, both gradient options and the
none-of-the-above category."""
from __future__ import annotations

import pytest
import torch

from capsnet.routing import DynamicRouter
from capsnet.routing.dynamic import couplings, uniform_share
from tests.helpers_routing import assert_routed_close, dynamic_reference

B, J, I, D = 2, 3, 5, 4  # tiny: examples, output capsules, input capsules, capsule dimension


def make_u_hat(seed: int = 0, scale: float = 2.0, dtype=torch.float64) -> torch.Tensor:
    """Predictions (B, J, I, D) large enough that routing moves the couplings a lot."""
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(B, J, I, D, generator=g, dtype=dtype)


def routed(u_hat: torch.Tensor, iterations: int, full_graph: bool = False,
           none_of_the_above: bool = False) -> torch.Tensor:
    """The library's output capsules v (B, J, D)."""
    return DynamicRouter(iterations, full_graph, none_of_the_above)(u_hat).poses


@pytest.mark.parametrize("none_of_the_above", [False, True])
@pytest.mark.parametrize("iterations", [1, 2, 3])
def test_routing_matches_procedure_1_loop_by_loop(iterations, none_of_the_above):
    u_hat = make_u_hat()
    router = DynamicRouter(iterations, none_of_the_above=none_of_the_above)
    with torch.no_grad():
        got = router(u_hat)
    assert got.poses.shape == (B, J, D) and got.activations.shape == (B, J)
    assert_routed_close(got, dynamic_reference(u_hat, iterations,
                                               none_of_the_above=none_of_the_above))


def test_routing_iterations_change_the_result():
    """Guards the reference test's power: on this input, routing really moves the couplings."""
    u_hat = make_u_hat()
    one, three = dynamic_reference(u_hat, 1), dynamic_reference(u_hat, 3)
    assert (one.poses - three.poses).abs().max() > 0.05
    assert (three.couplings[-1] - 1 / J).abs().max() > 0.1


def test_one_iteration_uses_uniform_couplings_over_output_capsules():
    # b = 0 -> c_ij = 1/J (softmax over the J outputs; over the I inputs it would be 1/I).
    u_hat = make_u_hat(seed=1)
    v = routed(u_hat, iterations=1)
    s = u_hat.sum(dim=2) / J  # (B, J, D)
    n2 = s.pow(2).sum(-1, keepdim=True)
    torch.testing.assert_close(v, n2 / (1 + n2) * s / n2.sqrt())


def test_couplings_are_per_example():
    """b starts at zero for every example and is never shared or averaged across the batch."""
    u_hat = torch.cat([make_u_hat(seed=2), 10 * make_u_hat(seed=3)])  # (2B, J, I, D)
    together = routed(u_hat, iterations=3)
    alone = torch.cat([routed(u_hat[n:n + 1], iterations=3) for n in range(len(u_hat))])
    torch.testing.assert_close(together, alone)
    flipped = routed(u_hat.flip(0), iterations=3)
    torch.testing.assert_close(flipped, together.flip(0))


def test_routing_zero_predictions_are_finite():
    u_hat = torch.zeros(B, J, I, D, requires_grad=True)
    v = routed(u_hat, iterations=3, full_graph=True)
    assert torch.equal(v, torch.zeros(B, J, D))
    v.sum().backward()
    assert torch.isfinite(u_hat.grad).all()


def test_routing_runs_in_float32_for_low_precision_inputs():
    u_hat = make_u_hat(seed=4, dtype=torch.float32).bfloat16()
    v = routed(u_hat, iterations=3)
    assert v.dtype == torch.float32
    torch.testing.assert_close(v, routed(u_hat.float(), iterations=3))


# --- gradients ----------------------------------------------------------------------------

def u_hat_gradient(fn, u_hat: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    x = u_hat.clone().requires_grad_(True)
    (fn(x) * weights).sum().backward()
    return x.grad


@pytest.mark.parametrize("iterations", [2, 3])
def test_gradient_flows_through_last_iteration_only_by_default(iterations):
    u_hat, weights = make_u_hat(seed=5, scale=1.0), torch.randn(B, J, D, dtype=torch.float64)
    got = u_hat_gradient(lambda x: routed(x, iterations), u_hat, weights)
    detached = u_hat_gradient(lambda x: dynamic_reference(x, iterations).poses, u_hat, weights)
    full = u_hat_gradient(lambda x: dynamic_reference(x, iterations, True).poses, u_hat,
                          weights)
    torch.testing.assert_close(got, detached)
    assert (got - full).abs().max() > 1e-3  # the two options really differ here


@pytest.mark.parametrize("iterations", [2, 3])
def test_full_graph_backpropagates_through_every_iteration(iterations):
    u_hat, weights = make_u_hat(seed=6, scale=1.0), torch.randn(B, J, D, dtype=torch.float64)
    got = u_hat_gradient(lambda x: routed(x, iterations, full_graph=True), u_hat, weights)
    full = u_hat_gradient(lambda x: dynamic_reference(x, iterations, True).poses, u_hat,
                          weights)
    default = u_hat_gradient(lambda x: routed(x, iterations), u_hat, weights)
    torch.testing.assert_close(got, full)
    assert (got - default).abs().max() > 1e-3


def test_one_iteration_gradient_is_the_same_either_way():
    u_hat, weights = make_u_hat(seed=7), torch.randn(B, J, D, dtype=torch.float64)
    a = u_hat_gradient(lambda x: routed(x, 1), u_hat, weights)
    b = u_hat_gradient(lambda x: routed(x, 1, full_graph=True), u_hat, weights)
    torch.testing.assert_close(a, b)


# --- the none-of-the-above category (section 7, CIFAR-10) ----------------------------------

def test_none_of_the_above_couplings_leak_a_share_to_a_zero_logit():
    """c = softmax([0, b]) over J + 1 categories, the extra one dropped: every input capsule's
    couplings sum to less than 1, and to 1 with the extra category's share added back."""
    b = torch.randn(B, J, I, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    c = couplings(b, none_of_the_above=True)  # (B, J, I)
    with_zero = torch.cat([torch.zeros(B, 1, I, dtype=b.dtype), b], dim=1)  # (B, J+1, I)
    torch.testing.assert_close(c, torch.softmax(with_zero, dim=1)[:, 1:])
    leak = 1 / (1 + b.exp().sum(dim=1))  # (B, I): the zero logit's share, exp(0) / total
    assert (c.sum(dim=1) < 1).all()
    torch.testing.assert_close(c.sum(dim=1) + leak, torch.ones(B, I, dtype=b.dtype))
    torch.testing.assert_close(couplings(b), torch.softmax(b, dim=1))  # off: plain softmax


def test_none_of_the_above_first_iteration_is_one_share_in_j_plus_one():
    u_hat = make_u_hat(seed=9)  # (B, J, I, D)
    assert uniform_share(J, none_of_the_above=True) == pytest.approx(1 / (J + 1))
    v = routed(u_hat, 1, none_of_the_above=True)  # (B, J, D)
    s = u_hat.sum(dim=2) / (J + 1)  # (B, J, D)
    n2 = s.pow(2).sum(-1, keepdim=True)
    torch.testing.assert_close(v, n2 / (1 + n2) * s / n2.sqrt())
    three = routed(u_hat, 3, none_of_the_above=True)
    assert (three - routed(u_hat, 3)).abs().max() > 1e-3  # the category changes the routing
