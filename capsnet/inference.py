"""Using a trained model: predict the class of your own images, reconstruct, move capsule poses.

    >>> p = predict("my_digit.jpg", model="runs/latest/best.pt")  # a list for a batch
    >>> p.class_name, p.index, p.length, p.alternatives
    ('7', 7, 0.93, [(1, 0.12), (9, 0.08)])

Model inputs are uint8 images (N, H, W) or (N, C, H, W) on the model's device; images handed
back for showing are uint8 in the display layout, (H, W) grey or (H, W, 3) RGB."""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from capsnet.checkpoint import ModelSource, load_model
from capsnet.data.image_dataset import CHANNEL_COUNTS, PIXEL_MAX, display_images, to_model_input
from capsnet.data.model_view import class_names
from capsnet.preprocess import ImageSource, PreprocessError, prepare_for_model

# The paper's Figure 4: each pose dimension moved by -0.25 .. 0.25 in steps of 0.05.
PERTURB_RANGE = 0.25
PERTURB_STEP = 0.05
BATCH_SIZE = 256
RGB = 3
TENSOR_IMAGE_NDIM = 3  # (C, H, W)


@dataclass
class Prediction:
    """One image's result: ``index`` (alias ``digit``) the predicted class, ``length`` the
    winning capsule's length, ``top`` (index, length) best first, images in the display layout."""

    source: str
    digit: int
    length: float
    lengths: list[float]  # (J,) every class's capsule length
    top: list[tuple[int, float]]
    image: np.ndarray  # (H, W) or (H, W, 3) uint8: the input as the model saw it
    reconstruction: np.ndarray | None = None  # as image; None without a decoder
    pose: list[float] | None = field(default=None, repr=False)  # (D,) the winning capsule
    class_names: list[str] = field(default_factory=list, repr=False)  # (J,) index order

    @property
    def index(self) -> int:
        return self.digit

    @property
    def class_name(self) -> str:
        return self.name_of(self.digit)

    def name_of(self, index: int) -> str:
        return self.class_names[index] if self.class_names else str(index)

    @property
    def alternatives(self) -> list[tuple[int, float]]:
        """The runners-up: ``top`` without the winner."""
        return self.top[1:]

    def as_dict(self) -> dict:
        """JSON-ready fields, images left out."""
        return {"source": self.source, "class": self.class_name, "index": self.digit,
                "digit": self.digit, "length": self.length,
                "alternatives": [{"class": self.name_of(d), "index": d, "digit": d, "length": s}
                                 for d, s in self.alternatives],
                "lengths": self.lengths}


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def image_batch(images: np.ndarray | torch.Tensor, device: torch.device) -> torch.Tensor:
    """uint8 images (N, H, W) or (N, C, H, W) -> float model input (N, C, H, W) on ``device``."""
    return to_model_input(torch.as_tensor(images).to(device=device, dtype=torch.uint8))


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """Float images (..., C, H, W) in [0, 1] -> uint8 numpy (..., H, W) or (..., H, W, 3)."""
    pixels = (images.float().clamp(0, 1) * PIXEL_MAX).round().to(torch.uint8)  # (..., C, H, W)
    if pixels.shape[-3] == RGB:
        return pixels.movedim(-3, -1).cpu().numpy()  # (..., H, W, 3)
    return pixels.select(-3, 0).cpu().numpy()  # (..., H, W)


@torch.no_grad()
def run_model(model: nn.Module, images: np.ndarray | torch.Tensor,
              batch_size: int = BATCH_SIZE) -> tuple[torch.Tensor, torch.Tensor | None,
                                                      torch.Tensor | None]:
    """Scores (N, J), poses (N, J, D) or None, reconstructions (N, C, H, W) or None (from
    the winning capsule) for uint8 images (N, [C,] H, W)."""
    model.eval()
    device = model_device(model)
    scores, poses, recons = [], [], []
    for chunk in torch.as_tensor(images).split(batch_size):
        out = model(image_batch(chunk, device))
        scores.append(out.scores.float())  # (b, J)
        if out.poses is not None:
            poses.append(out.poses.float())  # (b, J, D)
        if out.reconstructions is not None:
            recons.append(out.reconstructions.float())  # (b, C, H, W)
    return (torch.cat(scores), torch.cat(poses) if poses else None,
            torch.cat(recons) if recons else None)


def predict_prepared(model: nn.Module, images: np.ndarray | torch.Tensor, sources: Sequence[str],
                     top_k: int = 3) -> list[Prediction]:
    """Predictions for uint8 images (N, [C,] H, W) already prepared for the model."""
    if len(images) == 0:
        return []
    scores, poses, recons = run_model(model, images)  # (N, J), (N, J, D), (N, C, H, W)
    # read back once: per-element reads of device tensors would each wait for the GPU
    scores = scores.cpu()
    poses = None if poses is None else poses.cpu()
    k = min(top_k, scores.shape[1])
    best_scores, best = scores.topk(k, dim=1)  # (N, k)
    shown = display_images(images)  # (N, H, W) or (N, H, W, 3)
    recon_u8 = to_uint8(recons) if recons is not None else None
    names = class_names(model.config)
    results = []
    for i, source in enumerate(sources):
        top = [(int(d), float(s)) for d, s in zip(best[i], best_scores[i], strict=False)]
        digit = top[0][0]
        results.append(Prediction(
            source=str(source), digit=digit, length=top[0][1], lengths=scores[i].tolist(),
            top=top, image=np.ascontiguousarray(shown[i], dtype=np.uint8),
            reconstruction=None if recon_u8 is None else recon_u8[i],
            pose=None if poses is None else poses[i, digit].tolist(), class_names=names))
    return results


def split_batch(images: Any) -> tuple[list, bool]:
    """(the images one by one, whether ``images`` was one image); PreprocessError on a bad shape."""
    if isinstance(images, torch.Tensor):
        if images.dim() not in (TENSOR_IMAGE_NDIM, TENSOR_IMAGE_NDIM + 1):
            raise PreprocessError(f"expected an image tensor (C, H, W) or a batch (B, C, H, W), "
                                  f"got shape {tuple(images.shape)}")
        single = images.dim() == TENSOR_IMAGE_NDIM
        return ([images] if single else list(images)), single
    if isinstance(images, np.ndarray):
        channels_last = images.ndim > 2 and images.shape[-1] in CHANNEL_COUNTS
        single = images.ndim == 2 or (images.ndim == 3 and channels_last)
        if single:
            return [images], True
        if images.ndim == 3 or (images.ndim == 4 and channels_last):
            return list(images), False
        raise PreprocessError(f"expected an image array (H, W) or (H, W, C) or a batch "
                              f"(B, H, W) or (B, H, W, C), C in {CHANNEL_COUNTS}; got shape "
                              f"{tuple(images.shape)}")
    if isinstance(images, Sequence) and not isinstance(images, (str, bytes, bytearray)):
        return list(images), False
    return [images], True


def prepare_one(source: ImageSource | torch.Tensor, config) -> np.ndarray:
    """One image -> uint8 (C, H, W): a tensor (C, H, W), float in [0, 1] or uint8, as model
    input; anything else as an own image (:func:`capsnet.preprocess.prepare_for_model`)."""
    if isinstance(source, np.ndarray) and source.ndim == 3 and source.shape[-1] == 1:
        source = source[..., 0]  # (H, W, 1) -> (H, W)
    if not isinstance(source, torch.Tensor):
        return prepare_for_model(source, config)
    expected = (config.in_channels, config.image_size, config.image_size)
    if tuple(source.shape) != expected:
        raise PreprocessError(f"expected a tensor (C, H, W) = {expected} for this model, or a "
                              f"batch (B, {', '.join(map(str, expected))}); got shape "
                              f"{tuple(source.shape)}")
    if source.dtype != torch.uint8:
        source = (source.detach().float().clamp(0, 1) * PIXEL_MAX).round().to(torch.uint8)
    return source.cpu().numpy()  # (C, H, W)


def predict(images: ImageSource | torch.Tensor | Sequence[ImageSource | torch.Tensor],
            model: ModelSource = None, device: Any = "cpu",
            top_k: int = 3) -> Prediction | list[Prediction]:
    """The class of one image (-> a Prediction) or of each image of a batch (-> a list).

    One image: a path, encoded bytes, a PIL image, an array (H, W) or (H, W, C), or a tensor
    (C, H, W); a batch: a list of them, an array (B, H, W) or (B, H, W, C), or a tensor
    (B, C, H, W). Tensors are model input (float in [0, 1] or uint8); everything else is an own
    picture, prepared by :func:`capsnet.preprocess.prepare_for_model`. ``model``: None (the
    shipped model), a .pt / .safetensors path or a loaded model. PreprocessError names the
    first image that cannot be used."""
    model = load_model(model, device)
    sources, single = split_batch(images)
    prepared, names = [], []
    for i, source in enumerate(sources):
        name = str(source) if isinstance(source, (str, os.PathLike)) else f"<image {i}>"
        try:
            prepared.append(prepare_one(source, model.config))  # (C, H, W)
        except PreprocessError as exc:
            raise PreprocessError(f"{name}: {exc}") from None
        names.append(name)
    results = predict_prepared(model, np.stack(prepared), names, top_k)
    return results[0] if single else results


@torch.no_grad()
def decode_pose(model: nn.Module, pose: torch.Tensor, digit: int) -> torch.Tensor:
    """Decode one capsule's pose vectors (N, D) as class ``digit``: images (N, C, H, W)."""
    N, D = pose.shape
    J = model.config.num_classes
    poses = torch.zeros(N, J, D, device=pose.device, dtype=pose.dtype)  # (N, J, D)
    poses[:, digit] = pose
    keep = torch.full((N,), digit, device=pose.device, dtype=torch.long)  # (N,)
    return model.decoder(poses, keep)  # (N, C, H, W)


def perturbation_deltas(limit: float = PERTURB_RANGE, step: float = PERTURB_STEP) -> torch.Tensor:
    """-limit, ..., 0, ..., +limit in steps of ``step`` (11 values for the paper's range)."""
    count = int(round(limit / step))
    return torch.arange(-count, count + 1, dtype=torch.float32) * step  # (S,)


@torch.no_grad()
def perturbation_grid(model: nn.Module, pose: torch.Tensor, digit: int,
                      deltas: torch.Tensor) -> torch.Tensor:
    """The paper's Figure 4 for one pose (D,) of class ``digit``: every dimension moved by
    each delta (S,) and decoded -> images (D, S, C, H, W)."""
    D, S = pose.shape[0], deltas.shape[0]
    offsets = torch.eye(D, device=pose.device, dtype=pose.dtype)[:, None, :] \
        * deltas.to(pose.device, pose.dtype)[None, :, None]  # (D, S, D)
    moved = (pose + offsets).reshape(D * S, D)  # (D*S, D)
    images = decode_pose(model, moved, digit)  # (D*S, C, H, W)
    return images.view(D, S, *images.shape[1:])  # (D, S, C, H, W)


def require_decoder(model: nn.Module) -> None:
    """Raise ValueError unless the model is a CapsNet with a reconstruction decoder."""
    if getattr(model, "decoder", None) is None:
        raise ValueError("this model has no reconstruction decoder (a CapsNet trained with "
                         "--reconstruction-weight > 0 is needed)")


def pick_examples(labels: torch.Tensor, predictions: torch.Tensor, count: int,
                  misclassified: int) -> torch.Tensor:
    """Indices (K,) of the first ``count`` examples, then up to ``misclassified`` later errors."""
    first = torch.arange(min(count, len(labels)), device=labels.device)  # (count,)
    wrong = torch.nonzero(predictions.to(labels.device) != labels).flatten()  # (W,)
    wrong = wrong[wrong >= len(first)][:misclassified]
    return torch.cat([first, wrong])  # (K,)


# test images classified per step of :func:`predict_until`'s search
SEARCH_CHUNK = 500


def predict_until(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, count: int,
                  misclassified: int) -> torch.Tensor:
    """Predictions (n,) of images[:n], n the first multiple of SEARCH_CHUNK (or N) that
    covers ``count`` images and ``misclassified`` errors after them."""
    predictions = []
    labels = labels.cpu()  # compared with the predictions, read back to the CPU
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
    """For each of ``classes``, the first image (N, [C,] H, W) of it classified correctly
    (else the first of it)."""
    num_classes = model.config.num_classes
    bad = [c for c in classes if not 0 <= c < num_classes]
    if bad:
        raise ValueError(f"classes must be in 0..{num_classes - 1}, got {bad}")
    predictions = run_model(model, images)[0].argmax(dim=1).cpu()  # (N,)
    labels = labels.cpu()
    chosen = []
    for c in classes:
        right = torch.nonzero((labels == c) & (predictions == c)).flatten()
        anyone = torch.nonzero(labels == c).flatten()
        if len(anyone) == 0:
            raise ValueError(f"no image of class {c} among the first {len(labels)}")
        chosen.append(int(right[0] if len(right) else anyone[0]))
    return chosen
