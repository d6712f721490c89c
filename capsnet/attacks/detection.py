"""Detectors of adversarial (and out-of-distribution) images from a model's own output,
each a score per image (larger = more suspicious) and a threshold that flags DETECTION_FPR
of the clean *validation* images (never the test images):

- ``reconstruction``: the squared reconstruction error of the winning capsule (DARCCC,
  Frosst, Sabour & Hinton 2018); ``class-reconstruction``: the same, a threshold per
  predicted class;
- ``length``: 1 - the highest class score; ``margin``: minus the gap between the top two.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from capsnet.attacks.objectives import EVAL_BATCH, reconstruction_error
from capsnet.models import class_scores

DETECTION_FPR = 0.05
DETECTORS = ("reconstruction", "class-reconstruction", "length", "margin")
PER_CLASS = {"class-reconstruction"}
MIN_CLASS_IMAGES = 20  # fewer validation images of a class: its threshold is the global one


@torch.no_grad()
def image_scores(model: nn.Module,
                 x: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """({detector: (N,) score}, (N,) predicted class) for images x (N, C, H, W) in [0, 1].
    The reconstruction detectors appear only for models with a decoder."""
    parts: dict[str, list[torch.Tensor]] = {}
    predictions = []
    for xb in x.split(EVAL_BATCH):
        output = model(xb)
        scores = class_scores(output).float()  # (b, J)
        top2 = scores.topk(2, dim=-1).values  # (b, 2)
        row = {"length": 1 - top2[:, 0], "margin": top2[:, 1] - top2[:, 0]}
        if getattr(output, "reconstructions", None) is not None:
            error = reconstruction_error(output, xb)
            row |= {"reconstruction": error, "class-reconstruction": error}
        for name, value in row.items():
            parts.setdefault(name, []).append(value)
        predictions.append(scores.argmax(-1))
    return {k: torch.cat(v) for k, v in parts.items()}, torch.cat(predictions)


@dataclass
class Detector:
    """A score and its threshold per predicted class (J,) (all equal for a global one)."""

    name: str
    thresholds: torch.Tensor

    def normalised(self, scores: torch.Tensor, predictions: torch.Tensor) -> torch.Tensor:
        """(N,) scores minus the threshold that applies: > 0 means flagged."""
        return scores - self.thresholds[predictions]


def fit_detector(name: str, scores: torch.Tensor, predictions: torch.Tensor,
                 num_classes: int) -> Detector:
    """The detector ``name`` whose threshold(s) flag a share DETECTION_FPR of the clean
    (validation) images with these scores (N,) and predictions (N,)."""
    if name not in DETECTORS:
        raise ValueError(f"unknown detector {name!r}; choose from {', '.join(DETECTORS)}")
    thresholds = torch.quantile(scores.float(), 1 - DETECTION_FPR).repeat(num_classes)
    if name in PER_CLASS:
        for j in range(num_classes):
            own = scores[predictions == j]
            if len(own) >= MIN_CLASS_IMAGES:
                thresholds[j] = torch.quantile(own.float(), 1 - DETECTION_FPR)
    return Detector(name, thresholds)


def fit_detectors(model: nn.Module, validation: torch.Tensor) -> list[Detector]:
    """Every detector the model supports, thresholds fit on clean validation images
    (N, C, H, W) in [0, 1]."""
    scores, predictions = image_scores(model, validation)
    return [fit_detector(name, scores[name], predictions, model.config.num_classes)
            for name in DETECTORS if name in scores]


def auroc(negatives: torch.Tensor, positives: torch.Tensor) -> float:
    """Area under the ROC curve of scores (larger = positive): the probability that a
    random positive outscores a random negative, ties counting half (Mann-Whitney U)."""
    if len(negatives) == 0 or len(positives) == 0:
        return float("nan")
    neg, pos = negatives.double().flatten(), positives.double().flatten()
    greater = (pos[:, None] > neg[None, :]).double().sum()
    ties = (pos[:, None] == neg[None, :]).double().sum()
    return float((greater + 0.5 * ties) / (len(pos) * len(neg)))


def detection_metrics(detector: Detector, clean: tuple[torch.Tensor, torch.Tensor],
                      adversarial: tuple[torch.Tensor, torch.Tensor],
                      attacked: torch.Tensor, fooled: torch.Tensor) -> dict[str, float]:
    """The metrics of Qin et al. (2020): S_f, the share of attacked images (those the model
    got right, ``attacked`` (N,) bool) that the attack fooled (``fooled`` (N,) bool); S_d,
    the share fooled and not flagged; the true-positive rate (flagged among the fooled);
    the clean test images flagged; AUROC of clean against fooled adversarial images.
    ``clean``, ``adversarial``: (scores (N,), predictions (N,))."""
    clean_norm = detector.normalised(*clean)  # (N,)
    adv_norm = detector.normalised(*adversarial)  # (N,)
    success = attacked & fooled
    flagged = adv_norm > 0
    n = max(int(attacked.sum()), 1)
    return {"S_f": float(success.sum()) / n,
            "S_d": float((success & ~flagged).sum()) / n,
            "tpr": float(flagged[success].float().mean()) if success.any() else float("nan"),
            "test_fpr": float((clean_norm[attacked] > 0).float().mean()),
            "auroc": auroc(clean_norm[attacked], adv_norm[success])}
