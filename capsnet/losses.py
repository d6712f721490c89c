"""Losses with the paper's constants as parameters (Sabour et al. 2017, Eq. 4 and section 4.1)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

M_PLUS, M_MINUS, LAMBDA = 0.9, 0.1, 0.5
RECONSTRUCTION_WEIGHT = 0.0005


def margin_loss(lengths: torch.Tensor, targets: torch.Tensor, m_plus: float = M_PLUS,
                m_minus: float = M_MINUS, lam: float = LAMBDA) -> torch.Tensor:
    """L_k = T_k max(0, m+ - |v_k|)^2 + lam (1 - T_k) max(0, |v_k| - m-)^2, summed over k,
    averaged over the batch.

    lengths: (B, J). targets: (B,) class indices or (B, J) 0/1 (several digits present).
    """
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
                 reconstruction_weight: float = RECONSTRUCTION_WEIGHT) -> torch.Tensor:
    """Margin loss plus the weighted reconstruction loss of a :class:`CapsuleOutput`."""
    loss = margin_loss(output.lengths.float(), labels)
    if output.reconstructions is not None and reconstruction_weight > 0:
        loss = loss + reconstruction_weight * reconstruction_loss(output.reconstructions, images)
    return loss


def model_loss(output, images: torch.Tensor, labels: torch.Tensor,
               reconstruction_weight: float = RECONSTRUCTION_WEIGHT) -> torch.Tensor:
    """The training loss of any model: capsule loss for CapsNet, cross-entropy for logits."""
    if isinstance(output, torch.Tensor):
        return F.cross_entropy(output.float(), labels)
    return capsule_loss(output, images, labels, reconstruction_weight)
