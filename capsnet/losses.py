"""Losses with the papers' constants as parameters: the margin and reconstruction losses
(Sabour et al. 2017, Eq. 4 and section 4.1) and the spread loss of matrix capsules (Hinton
et al. 2018, Eq. 3)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

M_PLUS, M_MINUS, LAMBDA = 0.9, 0.1, 0.5
RECONSTRUCTION_WEIGHT = 0.0005
# Spread loss: "starting from a small margin of 0.2 and linearly increasing it during
# training to 0.9" (Hinton et al. 2018, section 4).
SPREAD_MARGIN_START, SPREAD_MARGIN_END = 0.2, 0.9


def margin_loss(lengths: torch.Tensor, targets: torch.Tensor, m_plus: float = M_PLUS,
                m_minus: float = M_MINUS, lam: float = LAMBDA) -> torch.Tensor:
    """L_k = T_k max(0, m+ - |v_k|)^2 + lam (1 - T_k) max(0, |v_k| - m-)^2, summed over k,
    averaged over the batch. lengths (B, J); targets (B,) indices or (B, J) 0/1."""
    if targets.dim() == 1:
        targets = F.one_hot(targets, lengths.shape[-1])
    T = targets.to(lengths.dtype)  # (B, J)
    present = T * F.relu(m_plus - lengths).pow(2)
    absent = lam * (1 - T) * F.relu(lengths - m_minus).pow(2)
    return (present + absent).sum(dim=-1).mean()


def reconstruction_loss(reconstructions: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    """Sum of squared pixel errors per image, averaged over the batch (not per pixel)."""
    diff = (reconstructions.float() - images.float()).flatten(1)  # (B, C*H*W)
    return diff.pow(2).sum(dim=-1).mean()


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
