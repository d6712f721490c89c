"""Using a trained model: predict digits in your own images, reconstruct, move capsule poses.

    >>> from capsnet.inference import predict
    >>> [p] = predict("my_digit.jpg", model="runs/latest/best.pt")
    >>> p.digit, p.length, p.alternatives
    (7, 0.93, [(1, 0.12), (9, 0.08)])

Everything here takes the model's device from its parameters; inputs are MNIST-like uint8
images (N, 28, 28) made by :mod:`capsnet.preprocess` or taken from a dataset.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from capsnet.data.augment import to_model_input
from capsnet.data.image_dataset import PIXEL_MAX
from capsnet.loading import ModelSource, load_model
from capsnet.models import CapsuleOutput, class_scores
from capsnet.preprocess import ImageSource, PreprocessError, prepare_image

# The paper's Figure 4: each pose dimension moved by -0.25 .. 0.25 in steps of 0.05.
PERTURB_RANGE = 0.25
PERTURB_STEP = 0.05
BATCH_SIZE = 256



@dataclass
class Prediction:
    """One image's result. ``length`` is the winning capsule's length (a softmax probability
    for the CNN baseline); ``top`` lists (digit, length) best first, the winner included."""

    source: str
    digit: int
    length: float
    lengths: list[float]  # (J,) every class's capsule length
    top: list[tuple[int, float]]
    image: np.ndarray  # (28, 28) uint8: the input as the model saw it
    reconstruction: np.ndarray | None = None  # (28, 28) uint8; None without a decoder
    pose: list[float] | None = field(default=None, repr=False)  # (D,) the winning capsule

    @property
    def alternatives(self) -> list[tuple[int, float]]:
        """The runners-up: ``top`` without the winner."""
        return self.top[1:]

    def as_dict(self) -> dict:
        """JSON-ready fields (images left out)."""
        return {"source": self.source, "digit": self.digit, "length": self.length,
                "alternatives": [{"digit": d, "length": s} for d, s in self.alternatives],
                "lengths": self.lengths}


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def image_batch(images: np.ndarray | torch.Tensor, device: torch.device) -> torch.Tensor:
    """uint8 images (N, H, W) -> float model input (N, 1, H, W) on ``device``."""
    return to_model_input(torch.as_tensor(np.asarray(images), dtype=torch.uint8, device=device))


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """Float grey images (..., 1, H, W) in [0, 1] -> uint8 numpy (..., H, W)."""
    grey = images.select(-3, 0).float().clamp(0, 1)  # (..., H, W)
    return (grey * PIXEL_MAX).round().to(torch.uint8).cpu().numpy()


@torch.no_grad()
def run_model(model: nn.Module, images: np.ndarray | torch.Tensor,
              batch_size: int = BATCH_SIZE) -> tuple[torch.Tensor, torch.Tensor | None,
                                                      torch.Tensor | None]:
    """Scores (N, J), poses (N, J, D) or None, reconstructions (N, 1, H, W) or None for
    uint8 images (N, H, W); reconstructions are decoded from the winning capsule."""
    model.eval()
    device = model_device(model)
    scores, poses, recons = [], [], []
    for chunk in torch.as_tensor(np.asarray(images)).split(batch_size):
        out = model(image_batch(chunk, device))
        scores.append(class_scores(out).float())  # (b, J)
        if isinstance(out, CapsuleOutput):
            poses.append(out.poses.float())  # (b, J, D)
            if out.reconstructions is not None:
                recons.append(out.reconstructions.float())  # (b, 1, H, W)
    return (torch.cat(scores), torch.cat(poses) if poses else None,
            torch.cat(recons) if recons else None)


def predict_prepared(model: nn.Module, images: np.ndarray, sources: Sequence[str],
                     top_k: int = 3) -> list[Prediction]:
    """Predictions for MNIST-like uint8 images (N, 28, 28) already prepared, one per source."""
    if len(images) == 0:
        return []
    scores, poses, recons = run_model(model, images)  # (N, J), (N, J, D), (N, 1, H, W)
    k = min(top_k, scores.shape[1])
    best_scores, best = scores.topk(k, dim=1)  # (N, k)
    recon_u8 = to_uint8(recons) if recons is not None else None
    results = []
    for i, source in enumerate(sources):
        top = [(int(d), float(s)) for d, s in zip(best[i], best_scores[i], strict=False)]
        digit = top[0][0]
        results.append(Prediction(
            source=str(source), digit=digit, length=top[0][1], lengths=scores[i].tolist(),
            top=top, image=np.asarray(images[i], dtype=np.uint8),
            reconstruction=None if recon_u8 is None else recon_u8[i],
            pose=None if poses is None else poses[i, digit].tolist()))
    return results


def predict(images: ImageSource | Sequence[ImageSource], model: ModelSource = None,
            device: Any = "cpu", top_k: int = 3) -> list[Prediction]:
    """Predict the digit in each image: paths, encoded bytes, PIL images or grey arrays,
    each preprocessed the way MNIST was made (:func:`capsnet.preprocess.prepare_image`).
    One image or a list; a single numpy array is one (H, W) image.

    ``model``: None (the shipped model), a .pt / .safetensors path or a loaded model.
    Raises PreprocessError naming the first image that holds no usable digit.
    """
    if isinstance(images, (str, os.PathLike, bytes, bytearray, np.ndarray)) or not isinstance(
            images, Sequence):
        images = [images]
    prepared, names = [], []
    for i, source in enumerate(images):
        name = _source_name(source, i)
        try:
            prepared.append(prepare_image(source))  # (28, 28)
        except PreprocessError as exc:
            raise PreprocessError(f"{name}: {exc}") from None
        names.append(name)
    return predict_prepared(load_model(model, device), np.stack(prepared), names, top_k)


def _source_name(source: Any, index: int) -> str:
    if isinstance(source, (str, os.PathLike)):
        return str(source)
    return f"<image {index}>"


@torch.no_grad()
def decode_pose(model: nn.Module, pose: torch.Tensor, digit: int) -> torch.Tensor:
    """Decode one capsule's pose vectors (N, D) as class ``digit``: images (N, 1, H, W)."""
    N, D = pose.shape
    J = model.config.num_classes
    poses = torch.zeros(N, J, D, device=pose.device, dtype=pose.dtype)  # (N, J, D)
    poses[:, digit] = pose
    keep = torch.full((N,), digit, device=pose.device, dtype=torch.long)  # (N,)
    return model.decoder(poses, keep)  # (N, 1, H, W)


@torch.no_grad()
def perturb_capsule(model: nn.Module, poses: torch.Tensor, digit: int, dim: int,
                    delta: float) -> torch.Tensor:
    """Reconstructions (B, 1, H, W) with dimension ``dim`` of capsule ``digit`` moved by
    ``delta`` in every pose set poses (B, J, D); the other capsules are masked out."""
    moved = poses.clone()  # (B, J, D)
    moved[:, digit, dim] += delta
    return model.decoder(moved, torch.full((poses.shape[0],), digit, dtype=torch.long,
                                           device=poses.device))  # (B, 1, H, W)


def perturbation_deltas(limit: float = PERTURB_RANGE, step: float = PERTURB_STEP) -> torch.Tensor:
    """-limit, ..., 0, ..., +limit in steps of ``step`` (11 values for the paper's range)."""
    count = int(round(limit / step))
    return torch.arange(-count, count + 1, dtype=torch.float32) * step  # (S,)


@torch.no_grad()
def perturbation_grid(model: nn.Module, pose: torch.Tensor, digit: int,
                      deltas: torch.Tensor) -> torch.Tensor:
    """The paper's Figure 4 for one capsule: pose (D,) of class ``digit``; every dimension
    moved by each delta (S,), all decoded in one batch. Returns images (D, S, 1, H, W)."""
    D, S = pose.shape[0], deltas.shape[0]
    offsets = torch.eye(D, device=pose.device, dtype=pose.dtype)[:, None, :] \
        * deltas.to(pose.device, pose.dtype)[None, :, None]  # (D, S, D)
    moved = (pose + offsets).reshape(D * S, D)  # (D*S, D)
    images = decode_pose(model, moved, digit)  # (D*S, 1, H, W)
    return images.view(D, S, *images.shape[1:])  # (D, S, 1, H, W)


def require_decoder(model: nn.Module) -> None:
    """Raise ValueError unless the model is a CapsNet with a reconstruction decoder."""
    if getattr(model, "decoder", None) is None:
        raise ValueError("this model has no reconstruction decoder (a CapsNet trained with "
                         "--reconstruction-weight > 0 is needed)")


def pick_examples(labels: torch.Tensor, predictions: torch.Tensor, count: int,
                  misclassified: int) -> torch.Tensor:
    """Indices (K,) of the first ``count`` examples, then the first ``misclassified``
    mis-classified examples not already among them (fewer if there are not enough)."""
    first = torch.arange(min(count, len(labels)), device=labels.device)  # (count,)
    wrong = torch.nonzero(predictions != labels).flatten()  # (W,)
    wrong = wrong[wrong >= len(first)][:misclassified]
    return torch.cat([first, wrong])  # (K,)


# test images classified per step of :func:`predict_until`'s search
SEARCH_CHUNK = 500


def predict_until(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, count: int,
                  misclassified: int) -> torch.Tensor:
    """Predicted classes (n,) of images[:n] (N, H, W), n the smallest multiple of
    SEARCH_CHUNK (or N) covering ``count`` images and ``misclassified`` errors after them."""
    predictions = []
    for start in range(0, len(images), SEARCH_CHUNK):
        scores, _, _ = run_model(model, images[start:start + SEARCH_CHUNK])  # (b, J)
        predictions.append(scores.argmax(dim=1).cpu())
        done = torch.cat(predictions)  # (n,)
        wrong_after = (done[count:] != labels[count:len(done)]).sum()
        if len(done) >= count and wrong_after >= misclassified:
            break
    return torch.cat(predictions)


def first_of_each_class(model: nn.Module, images: torch.Tensor, labels: torch.Tensor,
                        classes: Sequence[int]) -> list[int]:
    """For each of ``classes``, the index of the first of ``images`` (N, H, W) with that
    label that the model classifies correctly (else the first with that label)."""
    num_classes = model.config.num_classes
    bad = [c for c in classes if not 0 <= c < num_classes]
    if bad:
        raise ValueError(f"classes must be in 0..{num_classes - 1}, got {bad}")
    predictions = run_model(model, images)[0].argmax(dim=1).cpu()  # (N,)
    chosen = []
    for c in classes:
        right = torch.nonzero((labels == c) & (predictions == c)).flatten()
        anyone = torch.nonzero(labels == c).flatten()
        if len(anyone) == 0:
            raise ValueError(f"no image of class {c} among the first {len(labels)}")
        chosen.append(int(right[0] if len(right) else anyone[0]))
    return chosen
