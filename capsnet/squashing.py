"""The capsule non-linearities, safe at zero and for huge vectors: ``squash`` (Sabour et al.
2017, Eq. 1) and Efficient-CapsNet's ``exp_squash`` (Mazzia, Salvetti & Chiaberge 2021,
"Primary capsules"): (1 - 1 / e^|s|) s / |s|, which saturates faster (half length at
|s| = ln 2 instead of 1) and is close to the identity for short vectors. A leaf module: the
layers and the routers both use it."""
from __future__ import annotations

import torch


def full_precision(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32 when it is in a 16-bit float type (autocast), else as it is."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def squash_parts(s: torch.Tensor, dim: int = -1) -> tuple[torch.Tensor, ...]:
    """The direction u = s / |s| (0 for s = 0), k = |s| / (1 + |s|^2) and f = |s|^2 /
    (1 + |s|^2) of ``s`` along ``dim`` (k and f with ``dim`` kept as 1), so that squash(s) =
    u f and its Jacobian is k (I + (1 - 2 f) u u^T). The vector is scaled by its largest
    entry first, so that the norm does not overflow; k = 1 / (|s| + 1 / |s|) takes its exact
    limits at |s| = 0 and |s| = inf (0 both), and f its (0 and 1)."""
    scale = torch.linalg.vector_norm(s, float("inf"), dim=dim, keepdim=True)
    scale = scale.clamp_min(torch.finfo(s.dtype).tiny)
    t = s / scale  # entries in [-1, 1], the largest +-1 unless s == 0
    t_norm = torch.linalg.vector_norm(t, dim=dim, keepdim=True)  # in [1, sqrt(D)] or 0
    u = t / t_norm.clamp_min(1)  # exact for s != 0 (t_norm >= 1), and 0 / 1 for s == 0
    n = scale * t_norm  # |s|, inf when it overflows
    inv_n = n.reciprocal()  # inf at s == 0
    k = (n + inv_n).reciprocal()
    # f = k |s| for short vectors (no cancellation), 1 - k / |s| for long ones (no inf * 0,
    # and below 1 wherever float32 can tell 1 - 1 / (1 + |s|^2) from 1)
    f = torch.where(n < 1, k * n, 1 - k * inv_n)
    return u, k, f


class Squash(torch.autograd.Function):
    """squash with its analytic gradient, grad_s = k (g + (1 - 2 f) u (u . g)) for the
    output's gradient g: seven kernels instead of autograd's forty. Its backward is itself
    differentiable (a gradient penalty, ``torch.func``): with ``create_graph`` the parts are
    recomputed from s under autograd, else the forward's are reused."""

    @staticmethod
    def forward(s: torch.Tensor, dim: int) -> tuple[torch.Tensor, ...]:
        u, k, f = squash_parts(s, dim)
        return u * f, u, k, f  # v, and the parts the backward reuses

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        s, dim = inputs
        _, u, k, f = output
        ctx.mark_non_differentiable(u, k, f)
        ctx.set_materialize_grads(False)  # no zero gradients made for the parts
        ctx.save_for_backward(s, u, k, f)
        ctx.dim = dim

    @staticmethod
    def backward(ctx, g: torch.Tensor | None, *_) -> tuple[torch.Tensor | None, None]:
        if g is None:  # v had no gradient (gradients are not materialised)
            return None, None
        s, u, k, f = ctx.saved_tensors
        if torch.is_grad_enabled():  # a graph of the gradient itself: parts with their graph
            u, k, f = squash_parts(s, ctx.dim)
        return squash_grad(g, u, k, f, ctx.dim), None


def squash_grad(g: torch.Tensor, u: torch.Tensor, k: torch.Tensor, f: torch.Tensor,
                dim: int = -1) -> torch.Tensor:
    """The gradient of s for the gradient g of squash(s), from s's parts (squash_parts)."""
    along = (u * g).sum(dim=dim, keepdim=True)  # u . g
    return torch.addcmul(g, u, along * (1 - 2 * f)) * k


def squash_with_parts(s: torch.Tensor, dim: int = -1) -> tuple[torch.Tensor, ...]:
    """squash(s) and the parts (u, k, f) of s that its gradient reuses (squash_grad)."""
    if s.requires_grad and torch.is_grad_enabled() and not torch.jit.is_tracing():
        return Squash.apply(s, dim)
    u, k, f = squash_parts(s, dim)
    return u * f, u, k, f


def squash(s: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """v = |s|^2 / (1 + |s|^2) * s / |s| along ``dim``, same shape, lengths in [0, 1); safe
    at s = 0 (v = 0, gradient 0) and for huge vectors (unit length, finite gradient). Under
    autograd :class:`Squash` (the analytic gradient); without (inference, export) plain ops."""
    return squash_with_parts(s, dim)[0]


# Short vectors use the factor's Taylor series (1 - e^-n) / n = 1 - n/2 + n^2/6 - n^3/24 +
# n^4/120: exact at s = 0 (where the gradient is the identity), free of the closed form's
# 0/0. Its relative truncation error is below n^5 / SERIES_ERROR_DENOMINATOR (6! = 720); the
# closed form 1 - e^-n loses eps / n to cancellation (expm1 would lose nothing, but ONNX has
# no expm1). The two errors are equal at n = (720 eps)^(1/6), where the series stops: 0.19 in
# float32 (relative error 3e-7 at most), 0.0066 in float64 (2e-14).
SERIES_ERROR_DENOMINATOR = 720


def exp_squash(s: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """v = (1 - e^-|s|) s / |s| along ``dim``, same shape, lengths in [0, 1); long vectors
    scaled by their largest entry first, short ones by a Taylor series, so no NaN gradient."""
    scale = s.detach().abs().amax(dim=dim, keepdim=True).clamp_min(torch.finfo(s.dtype).tiny)
    t = s / scale  # entries in [-1, 1], the largest is +-1 unless s == 0
    t_norm = torch.linalg.vector_norm(t, dim=dim, keepdim=True)  # in [1, sqrt(D)] or 0
    n = scale * t_norm  # |s|, inf only for entries near the float limit
    short = n < (SERIES_ERROR_DENOMINATOR * torch.finfo(s.dtype).eps) ** (1 / 6)
    n_short = n.masked_fill(~short, 0)
    series = 1 - n_short / 2 * (1 - n_short / 3 * (1 - n_short / 4 * (1 - n_short / 5)))
    direction = t / t_norm.masked_fill(short, 1)  # s / |s| for the long vectors
    return torch.where(short, s * series, direction * (1 - torch.exp(-n)))
