"""Every router against a slow reference written from its paper's equations with plain loops
over examples b, parents j and children i; the contract (couplings sum to 1 over parents,
gradients, float32 under autocast); inverted-attention routing against the authors' code."""
from __future__ import annotations

import math

import pytest
import torch

from capsnet.layers import ROUTERS, DigitCaps, DynamicRouter, InvertedAttentionRouter
from capsnet.layers.router import Routed, router_class
from capsnet.models import CapsNet, CapsNetConfig, make_config

torch.set_num_threads(1)  # on shared, busy cores one thread is several times faster than two

B, J, I, D = 2, 3, 5, 4  # noqa: E741 (examples, parents, children, pose size: tiny)
ITERATIONS = 3
LN_EPS = 1e-5  # nn.LayerNorm's default, as in the authors' code


def make_votes(seed: int = 0, scale: float = 1.0, dtype=torch.float64) -> torch.Tensor:
    """Votes (B, J, I, D) large enough that routing moves the couplings."""
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


# ---- slow references, from the equations ---------------------------------------------------

def softmax_list(x: list[float]) -> list[float]:
    e = [math.exp(t) for t in x]
    return [t / sum(e) for t in e]


def dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def squash_list(s: list[float]) -> list[float]:
    """Sabour et al. Eq. 1: v = |s|^2 / (1 + |s|^2) s / |s|."""
    n2 = dot(s, s)
    return [n2 / (1 + n2) * x / math.sqrt(n2) for x in s]


def layer_norm_list(s: list[float], gain: list[float], bias: list[float]) -> list[float]:
    mean = sum(s) / len(s)
    var = sum((x - mean) ** 2 for x in s) / len(s)
    return [(x - mean) / math.sqrt(var + LN_EPS) * g + c for x, g, c in zip(s, gain, bias,
                                                                             strict=True)]


def dynamic_reference(votes: torch.Tensor, iterations: int) -> Routed:
    """Sabour et al. 2017, Procedure 1, for each example: b_ij <- 0; repeat: c_i = softmax_j
    (b_i); s_j = sum_i c_ij u_hat_j|i; v_j = squash(s_j); b_ij += u_hat_j|i . v_j."""
    u_hat = votes.tolist()  # [b][j][i][d]
    nb, nj, ni, nd = votes.shape
    poses, lengths, couplings = [], [], [[] for _ in range(iterations)]
    for b in range(nb):
        logits = [[0.0] * nj for _ in range(ni)]  # b_ij, indexed [i][j]
        for r in range(iterations):
            c = [softmax_list(logits[i]) for i in range(ni)]  # [i][j], over the parents j
            couplings[r].append([[c[i][j] for i in range(ni)] for j in range(nj)])
            v = [squash_list([sum(c[i][j] * u_hat[b][j][i][d] for i in range(ni))
                              for d in range(nd)]) for j in range(nj)]
            for i in range(ni):
                for j in range(nj):
                    logits[i][j] += dot(u_hat[b][j][i], v[j])
        poses.append(v)
        lengths.append([math.sqrt(dot(v[j], v[j])) for j in range(nj)])
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    return Routed(t(poses), t(lengths), tuple(t(c) for c in couplings))


def idpa_reference(votes: torch.Tensor, router: InvertedAttentionRouter) -> Routed:
    """Tsai et al. 2020, Procedure 1, for each example: p_j <- 0; repeat: a_ij = p_j . v_ij
    (Eq. 2, scaled by 1/sqrt(D) as in the authors' code); r_i = softmax_j(a_i) (Eq. 3, over
    the parents); s_j = sum_i r_ij v_ij, p_j = LayerNorm(s_j) (lines 5-6). Score: |squash(s_j)|."""
    gain, bias = router.norm.weight.tolist(), router.norm.bias.tolist()
    v_ = votes.tolist()  # [b][j][i][d]
    nb, nj, ni, nd = votes.shape
    poses, scores, couplings = [], [], [[] for _ in range(router.iterations)]
    for b in range(nb):
        p = [[0.0] * nd for _ in range(nj)]  # "set to 0 initially"
        for t in range(router.iterations):
            a = [[dot(p[j], v_[b][j][i]) / math.sqrt(nd) for j in range(nj)] for i in range(ni)]
            r = [softmax_list(a[i]) for i in range(ni)]  # [i][j]
            couplings[t].append([[r[i][j] for i in range(ni)] for j in range(nj)])
            s = [[sum(r[i][j] * v_[b][j][i][d] for i in range(ni)) for d in range(nd)]
                 for j in range(nj)]
            p = [layer_norm_list(s[j], gain, bias) for j in range(nj)]
        poses.append(p)
        scores.append([math.sqrt(dot(squash_list(s[j]), squash_list(s[j]))) for j in range(nj)])
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    return Routed(t(poses), t(scores), tuple(t(c) for c in couplings))


def assert_routed_close(got: Routed, want: Routed) -> None:
    torch.testing.assert_close(got.poses, want.poses)
    torch.testing.assert_close(got.activations, want.activations)
    assert len(got.couplings) == len(want.couplings)
    for c, ref in zip(got.couplings, want.couplings, strict=True):
        torch.testing.assert_close(c, ref)


# ---- the equations -------------------------------------------------------------------------

@pytest.mark.parametrize("iterations", [1, 2, 3])
def test_dynamic_router_matches_procedure_1_loop_by_loop(iterations):
    votes = make_votes(scale=2.0)
    with torch.no_grad():
        assert_routed_close(DynamicRouter(iterations)(votes),
                            dynamic_reference(votes, iterations))


@pytest.mark.parametrize("iterations", [1, 2, 3])
def test_inverted_attention_router_matches_its_procedure_loop_by_loop(iterations):
    votes = make_votes(scale=2.0)
    router = idpa_router(iterations=iterations)
    with torch.no_grad():
        assert_routed_close(router(votes), idpa_reference(votes, router))


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
        routed = router(make_votes(seed=3, scale=3.0))
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
    votes = make_votes(seed=4, scale=2.0)
    with torch.no_grad():
        both = router(votes)
        alone = router(votes[1:])
    for c_both, c_alone in zip(both.couplings, alone.couplings, strict=True):
        torch.testing.assert_close(c_both[1:], c_alone)
    torch.testing.assert_close(both.poses[1:], alone.poses)


@pytest.mark.parametrize("router", all_routers(), ids=lambda r: r.name)
def test_gradients_reach_the_votes_and_every_router_parameter(router):
    votes = make_votes(seed=5).requires_grad_()
    routed = router(votes)
    (routed.poses.sum() + routed.activations.sum()).backward()
    assert votes.grad is not None and torch.isfinite(votes.grad).all()
    assert votes.grad.abs().sum() > 0
    for name, p in router.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_inverted_attention_backpropagates_through_every_iteration():
    """As the authors' code: no detached iterations (dynamic routing detaches all but the
    last unless routing_full_graph). The agreements' gradient reaches the votes through the
    coefficients r, which a detached iteration would cut."""
    votes = make_votes(seed=6).requires_grad_()
    router = idpa_router()
    router(votes).poses.sum().backward()
    full = votes.grad.clone()
    votes.grad = None
    fixed_r = router(votes).couplings[-1].detach()  # (B, J, I) the last coefficients, held
    router.norm(router.weighted_votes(fixed_r, votes)).sum().backward()
    assert not torch.allclose(full, votes.grad)


@pytest.mark.parametrize("router", all_routers(torch.float32), ids=lambda r: r.name)
def test_routing_runs_in_float32_under_bf16_autocast(router):
    votes = make_votes(seed=7, dtype=torch.float32)
    with torch.no_grad():
        want = router(votes)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = router(votes)
            from_bf16 = router(votes.bfloat16())
    for routed in (got, from_bf16):
        assert routed.poses.dtype == routed.activations.dtype == torch.float32
        assert all(c.dtype == torch.float32 for c in routed.couplings)
    assert torch.equal(got.poses, want.poses)  # autocast changed nothing
    assert torch.equal(got.activations, want.activations)


@pytest.mark.parametrize("router", all_routers(), ids=lambda r: r.name)
def test_agreements_give_the_next_couplings(router):
    """Router.agreements (for traces): dynamic routing's c(r+1) is the softmax over j of
    the sum of the agreements 1..r; inverted attention's r(t+1) that of agreement t."""
    votes = make_votes(seed=8, scale=2.0)
    with torch.no_grad():
        couplings, agreements = router(votes).couplings, router.agreements(votes)
    assert len(agreements) == ITERATIONS
    for r in range(1, ITERATIONS):
        logits = (sum(agreements[:r]) if isinstance(router, DynamicRouter)
                  else agreements[r - 1])  # (B, J, I)
        torch.testing.assert_close(couplings[r], torch.softmax(logits, dim=1))


@pytest.mark.parametrize("router", all_routers(), ids=lambda r: r.name)
def test_convolutional_children_are_refused_with_a_clear_error(router):
    children = torch.zeros(J, I, dtype=torch.long)
    with pytest.raises(ValueError, match="fully connected capsule layers only"):
        router(make_votes(), None, children, I)


def test_the_first_couplings_of_dynamic_routing_cost_no_memory():
    routed = DynamicRouter(ITERATIONS)(make_votes())
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
    classes, is not capsnet's class score: see capsnet.layers.attention_routing.)"""
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
