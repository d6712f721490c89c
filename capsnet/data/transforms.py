"""Batched geometric transforms of digit images on any device: rotation, affNIST-like random
affine maps, placement on a larger black canvas.

Every warp is one ``affine_grid`` + ``grid_sample`` (bilinear, zeros outside); matrices are
in pixel coordinates (x right, y down) about the image centre; a positive angle turns
counter-clockwise on screen. uint8 images come back as uint8 (rounded)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from capsnet.data.image_dataset import PIXEL_MAX

HALF_PIXEL = 0.5  # a pixel's extent around its centre
AFFINE_DRAWS = 6  # uniform numbers per image: rotation, shear, scale x, scale y, position x, y


@dataclass(frozen=True)
class AffineRanges:
    """Ranges of the random affine maps, after affNIST, each drawn uniformly per image:
    rotation, horizontal shear (x' = x + shear * y), x and y scale; then a translation
    uniform over the positions keeping the digit's bounding box inside."""

    max_rotation_deg: float = 20.0
    max_shear: float = 0.2
    scale: tuple[float, float] = (0.8, 1.2)

    def describe(self) -> str:
        low, high = self.scale
        return (f"rotation +-{self.max_rotation_deg:g} deg, shear +-{self.max_shear:g}, "
                f"x and y scale {low:g}-{high:g}, translation keeping the digit inside the image")


@dataclass
class AffineParams:
    """Per-image parameters, each (N,) float32 on the CPU; ``position`` (N, 2) in [0, 1]
    picks the translation within its allowed range."""

    rotation_deg: torch.Tensor
    shear: torch.Tensor
    scale_x: torch.Tensor
    scale_y: torch.Tensor
    position: torch.Tensor

    def __len__(self) -> int:
        return self.rotation_deg.numel()


def sample_affine(n: int, ranges: AffineRanges = AffineRanges(), seed: int = 0) -> AffineParams:
    """``n`` parameter sets from a CPU generator seeded with ``seed``; image i's draws are
    row i of one (n, 6) tensor, so the first k images' parameters do not depend on n."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, AFFINE_DRAWS, generator=g)  # (n, 6)
    low, high = ranges.scale
    r, s = ranges.max_rotation_deg, ranges.max_shear
    return AffineParams(rotation_deg=-r + 2 * r * u[:, 0], shear=-s + 2 * s * u[:, 1],
                        scale_x=low + (high - low) * u[:, 2],
                        scale_y=low + (high - low) * u[:, 3], position=u[:, 4:6])


def rotation_matrix(angle_deg: torch.Tensor) -> torch.Tensor:
    """Forward maps (N, 2, 2) turning counter-clockwise on screen by ``angle_deg`` (N,)."""
    a = torch.deg2rad(angle_deg.float())  # (N,)
    cos, sin = torch.cos(a), torch.sin(a)
    return torch.stack([torch.stack([cos, sin], -1), torch.stack([-sin, cos], -1)], -2)  # (N, 2, 2)


def linear_matrix(params: AffineParams) -> torch.Tensor:
    """Forward maps (N, 2, 2): scale, then shear, then rotate."""
    n = len(params)
    zeros, ones = torch.zeros(n), torch.ones(n)
    scale = torch.diag_embed(torch.stack([params.scale_x, params.scale_y], -1))  # (N, 2, 2)
    shear = torch.stack([torch.stack([ones, params.shear], -1),
                         torch.stack([zeros, ones], -1)], -2)  # (N, 2, 2)
    return rotation_matrix(params.rotation_deg) @ shear @ scale  # (N, 2, 2)


def warp(images: torch.Tensor, matrix: torch.Tensor, translation: torch.Tensor | None = None,
         out_size: int | None = None) -> torch.Tensor:
    """Apply p' = matrix (p - centre_in) + centre_out + translation.

    images: (N, H, W) or (N, C, H, W), square; matrix: (N, 2, 2) or (2, 2); translation:
    (N, 2) pixels or None. Output: ``out_size`` square (default: the input's), same dtype."""
    squeeze = images.dim() == 3
    x = images.unsqueeze(1) if squeeze else images  # (N, C, H, W)
    N, C, H, W = x.shape
    if H != W:
        raise ValueError(f"warp expects square images, got {H}x{W}")
    size_out = out_size or H
    device = images.device
    forward = matrix.to(device=device, dtype=torch.float32).expand(N, 2, 2)  # (N, 2, 2)
    shift = (torch.zeros(N, 2, device=device) if translation is None
             else translation.to(device=device, dtype=torch.float32))  # (N, 2)
    # Normalised coordinates (align_corners=False): n = centred pixel / (size / 2).
    inverse = torch.linalg.inv(forward)  # (N, 2, 2)
    linear = inverse * (size_out / H)  # (N, 2, 2)
    offset = -(inverse @ shift.unsqueeze(-1)).squeeze(-1) * (2.0 / H)  # (N, 2)
    theta = torch.cat([linear, offset.unsqueeze(-1)], dim=-1)  # (N, 2, 3)
    grid = F.affine_grid(theta, [N, C, size_out, size_out], align_corners=False)  # (N, S, S, 2)
    out = F.grid_sample(x.float(), grid, mode="bilinear", padding_mode="zeros",
                        align_corners=False)  # (N, C, S, S)
    if images.dtype == torch.uint8:
        out = out.round_().clamp_(0, PIXEL_MAX).to(torch.uint8)
    else:
        out = out.to(images.dtype)
    return out.squeeze(1) if squeeze else out


def rotate(images: torch.Tensor, angle_deg: float | torch.Tensor,
           out_size: int | None = None) -> torch.Tensor:
    """Turn every image (N, H, W) by ``angle_deg`` (number or (N,)), on an ``out_size`` canvas."""
    angles = torch.as_tensor(angle_deg, dtype=torch.float32).reshape(-1)  # (N,) or (1,)
    return warp(images, rotation_matrix(angles), out_size=out_size)


def bounding_boxes(images: torch.Tensor) -> torch.Tensor:
    """Ink extent (N, 4) as (x_min, x_max, y_min, y_max) in centred pixel coordinates;
    an empty image gets a zero-size box at its centre."""
    N, H, W = images.shape
    ink = images > 0  # (N, H, W)
    cols, rows = ink.any(dim=1), ink.any(dim=2)  # (N, W), (N, H)

    def extent(mask: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.arange(size, device=images.device, dtype=torch.float32)  # (size,)
        first = torch.where(mask, index, float(size)).amin(dim=1)  # (N,)
        last = torch.where(mask, index, -1.0).amax(dim=1)  # (N,)
        centre = (size - 1) / 2
        empty = ~mask.any(dim=1)  # (N,)
        low = torch.where(empty, 0.0, first - centre - HALF_PIXEL)
        high = torch.where(empty, 0.0, last - centre + HALF_PIXEL)
        return low, high  # (N,), (N,)

    x_min, x_max = extent(cols, W)
    y_min, y_max = extent(rows, H)
    return torch.stack([x_min, x_max, y_min, y_max], dim=-1)  # (N, 4)


def inside_translation(boxes: torch.Tensor, matrix: torch.Tensor, position: torch.Tensor,
                       out_size: int) -> torch.Tensor:
    """Translations (N, 2) keeping each transformed box (N, 4) inside ``out_size``;
    ``position`` (N, 2) in [0, 1] goes from the leftmost (topmost) place to the rightmost."""
    x0, x1, y0, y1 = boxes.unbind(-1)  # (N,) each
    corners = torch.stack([torch.stack([x0, y0], -1), torch.stack([x1, y0], -1),
                           torch.stack([x0, y1], -1), torch.stack([x1, y1], -1)], 1)  # (N, 4, 2)
    moved = corners @ matrix.to(corners.device).transpose(1, 2)  # (N, 4, 2)
    half = out_size / 2
    low = -half - moved.amin(dim=1)  # (N, 2): the smallest translation that keeps it in
    high = half - moved.amax(dim=1)  # (N, 2)
    fits = low <= high
    middle = (low + high) / 2
    pos = position.to(device=corners.device, dtype=torch.float32)
    return torch.where(fits, low + pos * (high - low), middle)  # (N, 2)


def random_affine(images: torch.Tensor, params: AffineParams,
                  out_size: int | None = None) -> torch.Tensor:
    """Each image (N, [C,] H, W) by its own affine map from ``params`` on an ``out_size`` canvas."""
    if len(params) != images.shape[0]:
        raise ValueError(f"{len(params)} parameter sets for {images.shape[0]} images")
    size_out = out_size or images.shape[-1]
    matrix = linear_matrix(params).to(images.device)  # (N, 2, 2)
    ink = images if images.dim() == 3 else images.amax(dim=1)  # (N, H, W): any channel lit
    shift = inside_translation(bounding_boxes(ink), matrix, params.position, size_out)  # (N, 2)
    return warp(images, matrix, shift, out_size=size_out)


def affine_set(images: torch.Tensor, ranges: AffineRanges = AffineRanges(), seed: int = 0,
               out_size: int | None = None) -> torch.Tensor:
    """The seeded affine test set of ``images`` (N, H, W), alike on every run, device, model."""
    return random_affine(images, sample_affine(images.shape[0], ranges, seed), out_size)


def place_on_canvas(images: torch.Tensor, canvas: int,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """Each image (N, H, W) at a random integer position (centred without ``generator``, on
    any device) on a black ``canvas`` square -> (N, canvas, canvas), same dtype, one gather."""
    N, H, W = images.shape
    top, left = canvas_offsets(N, (H, W), canvas, generator, images.device)
    return place_at(images, canvas, top, left)


def canvas_offsets(n: int, size: tuple[int, int], canvas: int,
                   generator: torch.Generator | None = None,
                   device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Top and left offsets (n,) on a ``canvas``: random from ``generator`` or centred."""
    H, W = size
    if canvas < max(H, W):
        raise ValueError(f"canvas {canvas} is smaller than the {H}x{W} images")
    if generator is None:
        return (torch.full((n,), (canvas - H) // 2, device=device),
                torch.full((n,), (canvas - W) // 2, device=device))
    u = torch.rand(n, 2, device=generator.device, generator=generator)  # (n, 2): a row per image
    top = (u[:, 0] * (canvas - H + 1)).long().clamp_max(canvas - H)  # (n,)
    left = (u[:, 1] * (canvas - W + 1)).long().clamp_max(canvas - W)  # (n,)
    return top.to(device), left.to(device)


def place_at(images: torch.Tensor, canvas: int, top: torch.Tensor,
             left: torch.Tensor) -> torch.Tensor:
    """Images (N, H, W) at (top, left) (N,) on a black canvas -> (N, canvas, canvas), one gather."""
    N, H, W = images.shape
    device = images.device
    grid = torch.arange(canvas, device=device)  # (canvas,)
    rows = grid - top.to(device)[:, None]  # (N, canvas): source row of each canvas row
    cols = grid - left.to(device)[:, None]  # (N, canvas)
    valid = ((rows >= 0) & (rows < H))[:, :, None] & ((cols >= 0) & (cols < W))[:, None, :]
    batch = torch.arange(N, device=device)[:, None, None]
    picked = images[batch, rows.clamp(0, H - 1)[:, :, None], cols.clamp(0, W - 1)[:, None, :]]
    return picked * valid.to(images.dtype)  # (N, canvas, canvas)


def angle_range(max_angle: float, step: float) -> list[float]:
    """Angles from -max_angle to +max_angle in steps of ``step`` (0 always included)."""
    if step <= 0 or max_angle < 0:
        raise ValueError(f"need step > 0 and max_angle >= 0, got {step} and {max_angle}")
    count = math.floor(max_angle / step + 1e-9)
    return [float(k * step) for k in range(-count, count + 1)]

