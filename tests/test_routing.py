"""Dynamic routing (Procedure 1) against a slow, obviously-right reference written with loops."""
from __future__ import annotations

import math

import pytest
import torch

from capsnet.layers import dynamic_routing
from capsnet.layers.routing import couplings, uniform_share

torch.set_num_threads(1)  # on shared, busy cores one thread is several times faster than two

B, I, J, D = 2, 5, 3, 4  # tiny: examples, input capsules, output capsules, capsule dimension


def routed(u_hat: torch.Tensor, iterations: int, full_graph: bool = False) -> torch.Tensor:
    """dynamic_routing on predictions given in the paper's indexing, u_hat[b, i, j] (B, I, J, D).
    The layer takes them output-major, (B, J, I, D): the layout is chosen here only."""
    return dynamic_routing(u_hat.transpose(1, 2), iterations, full_graph)


def make_u_hat(seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    """Predictions (B, I, J, D) large enough that routing moves the couplings a lot."""
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(B, I, J, D, generator=g)


def squash_list(s: list[float]) -> list[float]:
    """Eq. 1 on a plain list: v = |s|^2 / (1 + |s|^2) * s / |s|."""
    n2 = sum(x * x for x in s)
    if n2 == 0:
        return [0.0] * len(s)
    return [n2 / (1 + n2) * x / math.sqrt(n2) for x in s]


def procedure_1(u_hat: list, iterations: int) -> tuple[list, list]:
    """Procedure 1 of the paper, literally, for ONE example.
    u_hat[i][j][d] -> (v[j][d], the last couplings c[i][j])."""
    n_in, n_out, dim = len(u_hat), len(u_hat[0]), len(u_hat[0][0])
    b = [[0.0] * n_out for _ in range(n_in)]  # for all i, j: b_ij <- 0
    for _ in range(iterations):
        c = []
        for i in range(n_in):  # c_i <- softmax(b_i), over the capsules j of the layer above
            e = [math.exp(b[i][j]) for j in range(n_out)]
            c.append([x / sum(e) for x in e])
        v = []
        for j in range(n_out):  # s_j <- sum_i c_ij u_hat_j|i ; v_j <- squash(s_j)
            s = [sum(c[i][j] * u_hat[i][j][d] for i in range(n_in)) for d in range(dim)]
            v.append(squash_list(s))
        for i in range(n_in):  # b_ij <- b_ij + u_hat_j|i . v_j
            for j in range(n_out):
                b[i][j] += sum(u_hat[i][j][d] * v[j][d] for d in range(dim))
    return v, c


def reference_routing(u_hat: torch.Tensor, iterations: int) -> torch.Tensor:
    """procedure_1 applied to each example on its own: (B, I, J, D) -> (B, J, D) float64."""
    outputs = []
    for example in u_hat.double().tolist():
        v, c = procedure_1(example, iterations)
        for row in c:  # the couplings of each input capsule sum to 1 over the outputs
            assert math.isclose(sum(row), 1.0, rel_tol=1e-12)
        outputs.append(v)
    return torch.tensor(outputs, dtype=torch.float64)


@pytest.mark.parametrize("iterations", [1, 2, 3])
def test_routing_matches_procedure_1(iterations):
    u_hat = make_u_hat()
    v = routed(u_hat, iterations)  # (B, J, D)
    assert v.shape == (B, J, D)
    expected = reference_routing(u_hat, iterations)
    torch.testing.assert_close(v.double(), expected, rtol=1e-5, atol=1e-6)


def test_routing_iterations_change_the_result():
    """Guards the reference test's power: on this input, routing really moves the couplings."""
    u_hat = make_u_hat()
    one, three = reference_routing(u_hat, 1), reference_routing(u_hat, 3)
    assert (one - three).abs().max() > 0.05


def test_one_iteration_uses_uniform_couplings_over_output_capsules():
    # b = 0 -> c_ij = 1/J (softmax over the J outputs; over the I inputs it would be 1/I).
    u_hat = make_u_hat(seed=1)
    v = routed(u_hat, iterations=1)
    s = u_hat.sum(dim=1) / J  # (B, J, D)
    n2 = s.pow(2).sum(-1, keepdim=True)
    torch.testing.assert_close(v, n2 / (1 + n2) * s / n2.sqrt())


def test_couplings_are_per_example():
    """b starts at zero for every example and is never shared or averaged across the batch."""
    u_hat = torch.cat([make_u_hat(seed=2), 10 * make_u_hat(seed=3)])  # (2B, I, J, D)
    together = routed(u_hat, iterations=3)
    alone = torch.cat([routed(u_hat[n:n + 1], iterations=3) for n in range(len(u_hat))])
    torch.testing.assert_close(together, alone)
    flipped = routed(u_hat.flip(0), iterations=3)
    torch.testing.assert_close(flipped, together.flip(0))


def test_routing_zero_predictions_are_finite():
    u_hat = torch.zeros(B, I, J, D, requires_grad=True)
    v = routed(u_hat, iterations=3, full_graph=True)
    assert torch.equal(v, torch.zeros(B, J, D))
    v.sum().backward()
    assert torch.isfinite(u_hat.grad).all()


def test_routing_runs_in_float32_for_low_precision_inputs():
    u_hat = make_u_hat(seed=4).bfloat16()
    v = routed(u_hat, iterations=3)
    assert v.dtype == torch.float32
    torch.testing.assert_close(v, routed(u_hat.float(), iterations=3))


# --- gradients ----------------------------------------------------------------------------

def plain_routing(u_hat: torch.Tensor, iterations: int, detach_early: bool) -> torch.Tensor:
    """Plain tensor routing; with ``detach_early`` the iterations before the last see
    u_hat.detach(), so gradients reach u_hat only through the last s_j = sum_i c_ij u_hat_j|i."""
    b = torch.zeros(u_hat.shape[:3], dtype=u_hat.dtype)  # (B, I, J)
    for r in range(iterations):
        u = u_hat.detach() if detach_early and r < iterations - 1 else u_hat
        c = torch.softmax(b, dim=2)  # (B, I, J)
        s = (c.unsqueeze(-1) * u).sum(dim=1)  # (B, J, D)
        n2 = s.pow(2).sum(-1, keepdim=True)
        v = n2 / (1 + n2) * s / n2.sqrt()  # (B, J, D)
        b = b + (u * v.unsqueeze(1)).sum(-1)  # (B, I, J)
    return v


def u_hat_gradient(fn, u_hat: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    x = u_hat.clone().requires_grad_(True)
    (fn(x) * weights).sum().backward()
    return x.grad


@pytest.mark.parametrize("iterations", [2, 3])
def test_gradient_flows_through_last_iteration_only_by_default(iterations):
    u_hat, weights = make_u_hat(seed=5), torch.randn(B, J, D)
    got = u_hat_gradient(lambda x: routed(x, iterations), u_hat, weights)
    detached = u_hat_gradient(lambda x: plain_routing(x, iterations, True), u_hat, weights)
    full = u_hat_gradient(lambda x: plain_routing(x, iterations, False), u_hat, weights)
    torch.testing.assert_close(got, detached, rtol=1e-4, atol=1e-6)
    assert (got - full).abs().max() > 1e-3  # the two options really differ here


@pytest.mark.parametrize("iterations", [2, 3])
def test_full_graph_backpropagates_through_every_iteration(iterations):
    u_hat, weights = make_u_hat(seed=6), torch.randn(B, J, D)
    got = u_hat_gradient(lambda x: routed(x, iterations, full_graph=True), u_hat, weights)
    full = u_hat_gradient(lambda x: plain_routing(x, iterations, False), u_hat, weights)
    default = u_hat_gradient(lambda x: routed(x, iterations), u_hat, weights)
    torch.testing.assert_close(got, full, rtol=1e-4, atol=1e-6)
    assert (got - default).abs().max() > 1e-3


def test_one_iteration_gradient_is_the_same_either_way():
    u_hat, weights = make_u_hat(seed=7), torch.randn(B, J, D)
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
    u_hat = make_u_hat(seed=9)  # (B, I, J, D)
    assert uniform_share(J, none_of_the_above=True) == pytest.approx(1 / (J + 1))
    v = dynamic_routing(u_hat.transpose(1, 2), 1, none_of_the_above=True)  # (B, J, D)
    s = u_hat.sum(dim=1) / (J + 1)  # (B, J, D)
    n2 = s.pow(2).sum(-1, keepdim=True)
    torch.testing.assert_close(v, n2 / (1 + n2) * s / n2.sqrt())
    three = dynamic_routing(u_hat.transpose(1, 2), 3, none_of_the_above=True)
    assert (three - routed(u_hat, 3)).abs().max() > 1e-3  # the category changes the routing
