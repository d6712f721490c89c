"""Functions only the tests use: decoding one capsule with one pose dimension moved (the
reference of ``perturbation_grid``)."""
from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def perturb_capsule(model: nn.Module, poses: torch.Tensor, digit: int, dim: int,
                    delta: float) -> torch.Tensor:
    """Reconstructions (B, C, H, W) with dimension ``dim`` of capsule ``digit`` moved by
    ``delta`` in every pose set poses (B, J, D); the other capsules are masked out."""
    moved = poses.clone()  # (B, J, D)
    moved[:, digit, dim] += delta
    return model.decoder(moved, torch.full((poses.shape[0],), digit, dtype=torch.long,
                                           device=poses.device))  # (B, C, H, W)
