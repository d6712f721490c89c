"""The routers' contract (couplings sum to 1 over parents, gradients, float32 under
autocast, the registry); inverted-attention routing against its slow loop reference
(tests/helpers_routing.py) and against the authors' code. Dynamic routing's reference
tests are in test_routing.py, self-attention's in test_efficient_capsnet.py, EM's in
test_em_routing.py."""
from __future__ import annotations

import pytest
import torch

from capsnet.layers import DigitCaps
from capsnet.models import CapsNet, CapsNetConfig, make_config
from capsnet.routing import ROUTERS, DynamicRouter, InvertedAttentionRouter, router_class
from tests.helpers_routing import assert_routed_close, inverted_attention_reference

B, J, I, D = 2, 3, 5, 4  # noqa: E741 (examples, parents, children, pose size: tiny)
ITERATIONS = 3


def make_u_hat(seed: int = 0, scale: float = 1.0, dtype=torch.float64) -> torch.Tensor:
    """Predictions (B, J, I, D) large enough that routing moves the couplings."""
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(B, J, I, D, generator=g, dtype=dtype)


def idpa_router(seed: int = 0, iterations: int = ITERATIONS, dtype=torch.float64,
                pose_dim: int = D) -> InvertedAttentionRouter:
    """An inverted-attention router whose LayerNorm and read-out are not at their defaults."""
    torch.manual_seed(seed)
    router = InvertedAttentionRouter(pose_dim, iterations).to(dtype)
    with torch.no_grad():
        for p in router.parameters():
            p.copy_(torch.randn_like(p))
    return router


def all_routers(dtype=torch.float64) -> list:
    return [DynamicRouter(ITERATIONS), idpa_router(dtype=dtype)]


# ---- the equations -------------------------------------------------------------------------

@pytest.mark.parametrize("iterations", [1, 2, 3])
def test_inverted_attention_router_matches_its_procedure_loop_by_loop(iterations):
    u_hat = make_u_hat(scale=2.0)
    router = idpa_router(iterations=iterations)
    with torch.no_grad():
        assert_routed_close(router(u_hat), inverted_attention_reference(u_hat, router))


def test_the_routers_are_registered_by_name():
    assert ROUTERS["dynamic"] is DynamicRouter
    assert ROUTERS["inverted-attention"] is InvertedAttentionRouter
    assert router_class("inverted-attention") is InvertedAttentionRouter
    with pytest.raises(ValueError, match="unknown routing 'em-ish'; choose from .*dynamic"):
        router_class("em-ish")
    with pytest.raises(ValueError, match="unknown routing 'em-ish' for capsnet; choose from"):
        make_config("capsnet", routing="em-ish")
    with pytest.raises(ValueError, match="unknown routing 'em-ish'"):  # a config made directly
        CapsNet(CapsNetConfig(routing="em-ish"))


@pytest.mark.parametrize("name", ["dynamic", "inverted-attention"])
def test_from_config_builds_the_configured_router(name):
    config = CapsNetConfig(routing=name, routing_iterations=2)
    router = router_class(name).from_config(config, children=config.num_primary_caps,
                                            parents=config.num_classes,
                                            pose_dim=config.digit_dim)
    assert type(router).name == name and router.iterations == 2


# ---- the contract --------------------------------------------------------------------------

@pytest.mark.parametrize("router", all_routers(), ids=lambda r: r.name)
def test_couplings_sum_to_one_over_parents_and_start_uniform(router):
    with torch.no_grad():
        routed = router(make_u_hat(seed=3, scale=3.0))
    assert routed.poses.shape == (B, J, D) and routed.activations.shape == (B, J)
    assert len(routed.couplings) == ITERATIONS
    for c in routed.couplings:
        assert c.shape == (B, J, I) and (c >= 0).all()
        torch.testing.assert_close(c.sum(dim=1), torch.ones(B, I, dtype=c.dtype))
    assert torch.equal(routed.couplings[0], torch.full((B, J, I), 1 / J, dtype=torch.float64))
    assert (routed.couplings[-1] - 1 / J).abs().max() > 0.1  # routing moved them
    assert ((routed.activations >= 0) & (routed.activations <= 1)).all()


@pytest.mark.parametrize("router", all_routers(), ids=lambda r: r.name)
def test_couplings_are_per_example(router):
    u_hat = make_u_hat(seed=4, scale=2.0)
    with torch.no_grad():
        both = router(u_hat)
        alone = router(u_hat[1:])
    for c_both, c_alone in zip(both.couplings, alone.couplings, strict=True):
        torch.testing.assert_close(c_both[1:], c_alone)
    torch.testing.assert_close(both.poses[1:], alone.poses)


@pytest.mark.parametrize("router", all_routers(), ids=lambda r: r.name)
def test_gradients_reach_the_votes_and_every_router_parameter(router):
    u_hat = make_u_hat(seed=5).requires_grad_()
    routed = router(u_hat)
    (routed.poses.sum() + routed.activations.sum()).backward()
    assert u_hat.grad is not None and torch.isfinite(u_hat.grad).all()
    assert u_hat.grad.abs().sum() > 0
    for name, p in router.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_inverted_attention_backpropagates_through_every_iteration():
    """As the authors' code: no detached iterations (dynamic routing detaches all but the
    last unless routing_full_graph). The agreements' gradient reaches u_hat through the
    coefficients r, which a detached iteration would cut."""
    u_hat = make_u_hat(seed=6).requires_grad_()
    router = idpa_router()
    router(u_hat).poses.sum().backward()
    full = u_hat.grad.clone()
    u_hat.grad = None
    fixed_r = router(u_hat).couplings[-1].detach()  # (B, J, I) the last coefficients, held
    router.norm(router.weighted_sum(fixed_r, u_hat)).sum().backward()
    assert not torch.allclose(full, u_hat.grad)


@pytest.mark.parametrize("router", all_routers(torch.float32), ids=lambda r: r.name)
def test_routing_runs_in_float32_under_bf16_autocast(router):
    u_hat = make_u_hat(seed=7, dtype=torch.float32)
    with torch.no_grad():
        want = router(u_hat)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = router(u_hat)
            from_bf16 = router(u_hat.bfloat16())
    for routed in (got, from_bf16):
        assert routed.poses.dtype == routed.activations.dtype == torch.float32
        assert all(c.dtype == torch.float32 for c in routed.couplings)
    assert torch.equal(got.poses, want.poses)  # autocast changed nothing
    assert torch.equal(got.activations, want.activations)


@pytest.mark.parametrize("router", all_routers(), ids=lambda r: r.name)
def test_agreements_give_the_next_couplings(router):
    """Router.agreements (for traces): dynamic routing's c(r+1) is the softmax over j of
    the sum of the agreements 1..r; inverted attention's r(t+1) that of agreement t."""
    u_hat = make_u_hat(seed=8, scale=2.0)
    with torch.no_grad():
        couplings, agreements = router(u_hat).couplings, router.agreements(u_hat)
    assert len(agreements) == ITERATIONS
    for r in range(1, ITERATIONS):
        logits = (sum(agreements[:r]) if isinstance(router, DynamicRouter)
                  else agreements[r - 1])  # (B, J, I)
        torch.testing.assert_close(couplings[r], torch.softmax(logits, dim=1))


@pytest.mark.parametrize("router", all_routers(), ids=lambda r: r.name)
def test_convolutional_children_are_refused_with_a_clear_error(router):
    children = torch.zeros(J, I, dtype=torch.long)
    with pytest.raises(ValueError, match="fully connected capsule layers only"):
        router(make_u_hat(), None, children, I)


def test_the_first_couplings_of_dynamic_routing_cost_no_memory():
    routed = DynamicRouter(ITERATIONS)(make_u_hat())
    assert routed.couplings[0].stride() == (0, 0, 0)  # one number, viewed as (B, J, I)
    assert DynamicRouter(ITERATIONS).state_dict() == {}  # the paper model's keys are unchanged


# ---- parity with the authors' code ---------------------------------------------------------

def authors_capsule_fc(x: torch.Tensor, w: torch.Tensor, norm: torch.nn.LayerNorm,
                       previous: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """What ``CapsuleFC.forward`` of github.com/apple/ml-capsules-inverted-attention-routing
    (src/layers.py, vector poses, dropout 0) computes, restated: x (b, n, a) child poses,
    w (n, a, m, d), previous (b, m, d) the parents' poses of the last pass or None.
    Returns the parents' new poses (b, m, d) and the routing coefficients (b, n, m)."""
    n, m, d = w.shape[0], w.shape[2], w.shape[3]
    if previous is None:  # first pass: the softmax of all-zero logits
        coefficients = torch.softmax(torch.zeros(n, m, dtype=x.dtype), dim=1)  # (n, m)
        value = torch.einsum("nm,bna,namd->bmd", coefficients, x, w)
        coefficients = coefficients.expand(x.shape[0], n, m)
    else:
        logits = torch.einsum("bna,namd,bmd->bnm", x, w, previous) / d ** 0.5
        coefficients = torch.softmax(logits, dim=2)  # over the parents m
        coefficients = coefficients / (coefficients.sum(dim=2, keepdim=True) + 1e-10)
        value = torch.einsum("bnm,bna,namd->bmd", coefficients, x, w)
    return norm(value), coefficients


def authors_class_capsules(x, w, norm, num_routing):
    """``CapsModel.forward``'s class-capsule layer (sequential routing): one initial pass,
    then num_routing - 1 refining passes. (Its classifier, a linear layer shared by the
    classes, is not capsnet's class score: see capsnet.routing.inverted_attention.)"""
    value, coefficients = authors_capsule_fc(x, w, norm, None)
    history = [coefficients]
    for _ in range(num_routing - 1):
        value, coefficients = authors_capsule_fc(x, w, norm, value)
        history.append(coefficients)
    return value, history


# float64: the coefficients differ by 1e-10 relative, the code's division by sum + 1e-10
@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-9), (torch.float32, 1e-5)])
def test_inverted_attention_matches_the_authors_code(dtype, tolerance):
    """Same W and LayerNorm: poses, routing coefficients and the gradient of W (through a
    random linear function of the poses) agree to rounding."""
    n, a, m, d = 24, 8, 10, 16  # children, child pose, parents (classes), parent pose
    torch.manual_seed(0)
    caps = DigitCaps(n, a, m, d, idpa_router(dtype=dtype, pose_dim=d)).to(dtype)
    with torch.no_grad():
        caps.W.normal_(0, 0.5)
    w = caps.W.detach().permute(0, 3, 1, 2).clone().requires_grad_()  # (n,m,d,a) -> (n,a,m,d)
    x = torch.randn(3, n, a, dtype=dtype)
    probe = torch.randn(3, m, d, dtype=dtype)  # the loss: (poses * probe).sum()

    ours = caps(x)
    poses, history = authors_class_capsules(x, w, caps.router.norm, ITERATIONS)
    gaps = {"poses": (ours.poses - poses).abs().max(),
            "couplings": max((c - h.transpose(1, 2)).abs().max()
                             for c, h in zip(ours.couplings, history, strict=True))}
    (ours.poses * probe).sum().backward()
    (poses * probe).sum().backward()
    gaps["grad W"] = (caps.W.grad - w.grad.permute(0, 2, 3, 1)).abs().max()
    gaps = {k: float(v.detach()) for k, v in gaps.items()}
    print(dtype, {k: f"{v:.1e}" for k, v in gaps.items()})  # the parity figure in the docs
    assert all(v <= tolerance for v in gaps.values()), gaps
