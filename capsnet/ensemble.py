"""Summaries over several trained models: mean and spread of test error, and their ensemble."""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from capsnet.training.loop import predict_scores


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1 in the denominator; 0 for one value)."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    mean = sum(values) / n
    if n == 1:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def ensemble_scores(models: Sequence[nn.Module], images: torch.Tensor,
                    batch_size: int = 500) -> torch.Tensor:
    """Class scores (N, J) averaged over ``models`` (capsule lengths for CapsNets)."""
    total = None
    for model in models:
        scores = predict_scores(model, images, batch_size)  # (N, J)
        total = scores if total is None else total + scores
    return total / len(models)


def ensemble_accuracy(models: Sequence[nn.Module], images: torch.Tensor,
                      labels: torch.Tensor) -> float:
    """Accuracy of the averaged scores of ``models`` on uint8 images (N, H, W)."""
    predicted = ensemble_scores(models, images).argmax(dim=-1)
    return (predicted == labels).float().mean().item()
