"""Losses with the papers' constants as parameters: the margin and reconstruction losses
(Sabour et al. 2017, Eq. 4 and section 4.1) and the spread loss of matrix capsules (Hinton
et al. 2018, Eq. 3)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

M_PLUS, M_MINUS, LAMBDA = 0.9, 0.1, 0.5
RECONSTRUCTION_WEIGHT = 0.0005
# What a model's class scores are, by the loss that trains them (their name in exported files).
SCORE_NAMES = {"margin": "lengths", "spread": "activations", "cross_entropy": "probabilities"}
# Spread loss: "starting from a small margin of 0.2 and linearly increasing it during
# training to 0.9" (Hinton et al. 2018, section 4).
SPREAD_MARGIN_START, SPREAD_MARGIN_END = 0.2, 0.9


def margin_error(lengths: torch.Tensor, present: torch.Tensor, m_plus: float,
                 m_minus: float) -> torch.Tensor:
    """max(0, m+ - |v_k|) for the present classes, max(0, |v_k| - m-) for the others (B, J)."""
    return torch.where(present, m_plus - lengths, lengths - m_minus).clamp_min(0)


class MarginLoss(torch.autograd.Function):
    """The margin loss of lengths (B, J) for the present classes (B, J) bool, with its
    analytic gradient, 2 / B (-max(0, m+ - |v_k|) if present else lam max(0, |v_k| - m-)):
    a few kernels instead of autograd's graph of one-hot, ReLUs and squares. Its backward
    is differentiable (the error is recomputed under autograd when a graph is asked for)."""

    @staticmethod
    def forward(lengths, present, m_plus, m_minus, lam):
        error = margin_error(lengths, present, m_plus, m_minus)  # (B, J)
        squares = error.pow(2)
        return torch.where(present, squares, lam * squares).sum(dim=-1).mean(), error

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        lengths, present, *ctx.constants = inputs
        ctx.mark_non_differentiable(output[1])
        ctx.set_materialize_grads(False)  # no zeros made for the error's gradient
        ctx.save_for_backward(lengths, present, output[1])

    @staticmethod
    def backward(ctx, g, _):
        if g is None:
            return None, None, None, None, None
        lengths, present, error = ctx.saved_tensors
        m_plus, m_minus, lam = ctx.constants
        if torch.is_grad_enabled():  # a graph of the gradient: the error with its graph
            error = margin_error(lengths, present, m_plus, m_minus)
        slope = torch.where(present, -error, lam * error)  # (B, J) d loss / d |v| * B / 2
        return slope * (g * (2 / error.shape[0])), None, None, None, None


def margin_loss(lengths: torch.Tensor, targets: torch.Tensor, m_plus: float = M_PLUS,
                m_minus: float = M_MINUS, lam: float = LAMBDA) -> torch.Tensor:
    """L_k = T_k max(0, m+ - |v_k|)^2 + lam (1 - T_k) max(0, |v_k| - m-)^2, summed over k,
    averaged over the batch. lengths (B, J); targets (B,) indices or (B, J) 0/1."""
    if targets.dim() == 1:
        present = torch.arange(lengths.shape[-1], device=targets.device) == targets.unsqueeze(-1)
    else:
        present = targets.bool()  # (B, J)
    return MarginLoss.apply(lengths, present, m_plus, m_minus, lam)[0]


class SquaredErrorSum(torch.autograd.Function):
    """sum of (x - y)^2 over each example's numbers, averaged over the batch, x (B, ...) with
    its gradient 2 (x - y) / B (y is data: no gradient); differentiable backward."""

    @staticmethod
    def forward(x, y):
        diff = (x - y).flatten(1)  # (B, N)
        return diff.pow(2).sum(dim=-1).mean(), diff

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.mark_non_differentiable(output[1])
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(*inputs, output[1])

    @staticmethod
    def backward(ctx, g, _):
        if g is None:
            return None, None
        x, y, diff = ctx.saved_tensors
        if torch.is_grad_enabled():  # a graph of the gradient: the difference with its graph
            diff = (x - y).flatten(1)
        return (diff * (g * (2 / diff.shape[0]))).view(x.shape), None


def reconstruction_loss(reconstructions: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    """Sum of squared pixel errors per image, averaged over the batch (not per pixel)."""
    return SquaredErrorSum.apply(reconstructions.float(), images.float())[0]


def capsule_loss(output, images: torch.Tensor, labels: torch.Tensor,
                 reconstruction_weight: float = RECONSTRUCTION_WEIGHT,
                 margin_weight: float = 1.0) -> torch.Tensor:
    """Margin loss (times ``margin_weight``: 0.5 in the released code, 0.5 x present + 0.25 x
    absent) plus the weighted reconstruction loss of a model's output."""
    loss = margin_loss(output.scores.float(), labels)
    if margin_weight != 1.0:
        loss = margin_weight * loss
    if output.reconstructions is not None and reconstruction_weight > 0:
        loss = loss + reconstruction_weight * reconstruction_loss(output.reconstructions, images)
    return loss


def spread_margin(run_fraction: float, start: float = SPREAD_MARGIN_START,
                  end: float = SPREAD_MARGIN_END) -> float:
    """The spread loss's margin after ``run_fraction`` (0 to 1) of the training run: linear
    from ``start`` to ``end`` (1 and beyond: ``end``, the margin of evaluation)."""
    return start + (end - start) * min(max(run_fraction, 0.0), 1.0)


def spread_loss(activations: torch.Tensor, targets: torch.Tensor,
                margin: float = SPREAD_MARGIN_END) -> torch.Tensor:
    """L = sum over i != t of max(0, m - (a_t - a_i))^2 (Hinton et al. 2018, Eq. 3), averaged
    over the batch. activations (B, J); targets (B,)."""
    a_t = activations.gather(1, targets.unsqueeze(1))  # (B, 1)
    gap = F.relu(margin - (a_t - activations)).pow(2)  # (B, J); m^2 at the target itself
    wrong = 1.0 - F.one_hot(targets, activations.shape[-1]).to(activations.dtype)  # (B, J)
    return (gap * wrong).sum(dim=-1).mean()


def cross_entropy_loss(output, images: torch.Tensor, labels: torch.Tensor,
                       reconstruction_weight: float = RECONSTRUCTION_WEIGHT) -> torch.Tensor:
    """Cross-entropy of a CNN's logits, plus the weighted reconstruction loss if it has a
    decoder (Qin et al. 2020's CNN+R)."""
    loss = F.cross_entropy(output.logits.float(), labels)
    if output.reconstructions is not None:
        loss = loss + reconstruction_weight * reconstruction_loss(output.reconstructions, images)
    return loss


def model_loss(output, images: torch.Tensor, labels: torch.Tensor,
               reconstruction_weight: float = RECONSTRUCTION_WEIGHT,
               run_fraction: float = 1.0, margin_weight: float = 1.0) -> torch.Tensor:
    """The training loss of any model's :class:`~capsnet.models.ModelOutput`, the one its
    ``loss`` names (the model's registry entry's): CapsNet's margin (times ``margin_weight``)
    and reconstruction loss, the spread loss (its margin at ``run_fraction`` of the run; 1,
    the final margin, outside training) or cross-entropy."""
    if output.loss == "spread":
        return spread_loss(output.scores.float(), labels, spread_margin(run_fraction))
    if output.loss == "cross_entropy":
        return cross_entropy_loss(output, images, labels, reconstruction_weight)
    if output.loss == "margin":
        return capsule_loss(output, images, labels, reconstruction_weight, margin_weight)
    raise ValueError(f"unknown loss {output.loss!r}; choose from margin, spread, cross_entropy")
