"""Out-of-distribution inputs for the detectors: another dataset (MNIST models shown
Fashion-MNIST and the reverse) and synthetic corruptions of the test images, judged by the
AUROC of each detector's score (in-distribution test images negative, the others positive).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from capsnet import writers
from capsnet.attacks.detection import Detector, auroc, image_scores

NOISE_STD = 0.3  # Gaussian pixel noise
BLUR_SIGMA = 1.5  # Gaussian blur, pixels
BLUR_RADIUS = 3  # kernel half-width (2 * radius + 1 taps)
CONTRAST_FACTOR = 0.3  # contrast scaled about each image's mean


def gaussian_noise(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    noise = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
    return (x + NOISE_STD * noise).clamp(0, 1)


def gaussian_blur(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Separable Gaussian blur of x (B, C, H, W), per channel, zero padded."""
    taps = torch.arange(-BLUR_RADIUS, BLUR_RADIUS + 1, device=x.device, dtype=x.dtype)
    kernel = torch.exp(-taps.pow(2) / (2 * BLUR_SIGMA**2))
    kernel = kernel / kernel.sum()  # (K,)
    C = x.shape[1]
    rows = kernel.view(1, 1, 1, -1).repeat(C, 1, 1, 1)  # (C, 1, 1, K)
    y = F.conv2d(x, rows, padding=(0, BLUR_RADIUS), groups=C)
    return F.conv2d(y, rows.transpose(2, 3), padding=(BLUR_RADIUS, 0), groups=C)


def low_contrast(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    return (mean + CONTRAST_FACTOR * (x - mean)).clamp(0, 1)


CORRUPTIONS: dict[str, Callable[..., torch.Tensor]] = {
    "noise": gaussian_noise, "blur": gaussian_blur, "contrast": low_contrast}


def ood_row(label: str, model, detectors: list[Detector], clean_images: torch.Tensor,
            shifted_name: str, shifted_images: torch.Tensor) -> dict:
    """One row: the AUROC of each detector of ``model`` separating clean test images
    (N, C, H, W) from ``shifted_images`` (M, C, H, W), both in [0, 1]."""
    clean_scores, clean_pred = image_scores(model, clean_images)
    shifted_scores, shifted_pred = image_scores(model, shifted_images)
    aurocs = {d.name: auroc(d.normalised(clean_scores[d.name], clean_pred),
                            d.normalised(shifted_scores[d.name], shifted_pred))
              for d in detectors}
    return {"model": label, "shift": shifted_name, "n_clean": len(clean_images),
            "n_shifted": len(shifted_images), "auroc": aurocs}


def ood_markdown(rows: list[dict]) -> str:
    """The OOD rows as a Markdown table of AUROCs, one column per detector."""
    detectors = sorted({d for r in rows for d in r["auroc"]})
    head = ["model", "shift", "n", *(f"{d} AUROC" for d in detectors)]
    return writers.markdown_table(head, [
        [r["model"], r["shift"], r["n_shifted"],
         *(f"{r['auroc'][d]:.3f}" if d in r["auroc"] else "" for d in detectors)]
        for r in rows])
