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


def squash_terms(s: torch.Tensor, dim: int = -1) -> tuple[torch.Tensor, ...]:
    """t = s / a, with a the largest |entry| of s along ``dim``, |t| and a (``dim`` kept as
    1), and m = a |s| / (1 + |s|^2), so that squash(s) = t m: ten kernels in all. No norm
    overflows (|t| is in [1, sqrt(D)], or 0 for s = 0); m = 1 / (|t| + 1 / (a |s|)) takes
    its limits exactly: 0 at s = 0 (a |s| = 0) and 1 / |t| (unit length) where a |s|
    overflows."""
    scale = torch.linalg.vector_norm(s, float("inf"), dim=dim, keepdim=True)
    scale = scale.clamp_min(torch.finfo(s.dtype).tiny)
    t = s / scale  # entries in [-1, 1], the largest +-1 unless s == 0
    t_norm = torch.linalg.vector_norm(t, dim=dim, keepdim=True)  # in [1, sqrt(D)] or 0
    m = (t_norm + (scale * t_norm * scale).reciprocal()).reciprocal()  # a |s| = a^2 |t|
    return t, t_norm, scale, m


def squash_parts(s: torch.Tensor, dim: int = -1) -> tuple[torch.Tensor, ...]:
    """squash(s) = u f, the direction u = s / |s| (0 for s = 0), k = |s| / (1 + |s|^2) and
    f = |s|^2 / (1 + |s|^2) = |squash(s)| of ``s`` along ``dim`` (k and f with ``dim`` kept
    as 1), so that the Jacobian of squash is k (I + (1 - 2 f) u u^T)."""
    t, t_norm, scale, m = squash_terms(s, dim)
    return t * m, t / t_norm.clamp_min(1), m / scale, t_norm * m


class Squash(torch.autograd.Function):
    """squash with its analytic gradient, grad_s = k (g + (1 - 2 f) u (u . g)) for the
    output's gradient g: six kernels instead of autograd's forty. Its backward is itself
    differentiable (a gradient penalty, ``torch.func``): with ``create_graph`` the parts are
    recomputed from s under autograd, else the forward's are reused."""

    @staticmethod
    def forward(s: torch.Tensor, dim: int) -> tuple[torch.Tensor, ...]:
        return squash_parts(s, dim)  # v, and the parts the backward reuses

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
            _, u, k, f = squash_parts(s, ctx.dim)
        return squash_grad(g, u, k, f, ctx.dim), None


def squash_grad(g: torch.Tensor, u: torch.Tensor, k: torch.Tensor, f: torch.Tensor,
                dim: int = -1) -> torch.Tensor:
    """The gradient of s for the gradient g of squash(s), from s's parts (squash_parts)."""
    along = (u * g).sum(dim=dim, keepdim=True)  # u . g
    return torch.addcmul(g, u, along * torch.rsub(f, 1, alpha=2)) * k  # 1 - 2 f


def under_autograd(s: torch.Tensor) -> bool:
    """Whether ``s``'s squash is differentiated: then :class:`Squash` computes it."""
    return s.requires_grad and torch.is_grad_enabled() and not torch.jit.is_tracing()


def squash_with_parts(s: torch.Tensor, dim: int = -1) -> tuple[torch.Tensor, ...]:
    """squash(s) and the parts (u, k, f) of s that its gradient reuses (squash_grad)."""
    if under_autograd(s):
        return Squash.apply(s, dim)
    return squash_parts(s, dim)


def squash(s: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """v = |s|^2 / (1 + |s|^2) * s / |s| along ``dim``, same shape, lengths in [0, 1); safe
    at s = 0 (v = 0, gradient 0) and for huge vectors (unit length, finite gradient). Under
    autograd :class:`Squash` (the analytic gradient); without (inference, export) ten plain
    kernels (:func:`squash_terms`)."""
    if under_autograd(s):
        return Squash.apply(s, dim)[0]
    t, _, _, m = squash_terms(s, dim)
    return t * m


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
