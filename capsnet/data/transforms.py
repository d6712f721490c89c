"""Batched geometric transforms of images on any device: rotation, affNIST-like random
affine maps, placement on a larger black canvas, the paper's random shifts, crops.

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
    scale = torch.diag_embed(torch.stack([params.scale_x, params.scale_y], -1))  # (N, 2, 2)
    shear = torch.eye(2).repeat(params.shear.numel(), 1, 1)  # (N, 2, 2)
    shear[:, 0, 1] = params.shear  # x' = x + shear * y
    return rotation_matrix(params.rotation_deg) @ shear @ scale  # (N, 2, 2)


def warp(images: torch.Tensor, matrix: torch.Tensor, translation: torch.Tensor | None = None,
         out_size: int | None = None) -> torch.Tensor:
    """Square images (N, [C,] H, W) mapped by p' = matrix (p - centre_in) + centre_out +
    translation; matrix (N, 2, 2) or (2, 2), translation (N, 2) pixels -> (N, [C,] S, S),
    S = ``out_size`` (default H), same dtype."""
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
        out = out.round_().clamp_(0, PIXEL_MAX)
    out = out.to(images.dtype)
    return out.squeeze(1) if squeeze else out


def rotate(images: torch.Tensor, angle_deg: float | torch.Tensor,
           out_size: int | None = None) -> torch.Tensor:
    """Turn every image (N, H, W) by ``angle_deg`` (number or (N,)), on an ``out_size`` canvas."""
    angles = torch.as_tensor(angle_deg, dtype=torch.float32).reshape(-1)  # (N,) or (1,)
    return warp(images, rotation_matrix(angles), out_size=out_size)


def bounding_boxes(images: torch.Tensor) -> torch.Tensor:
    """Ink extent (N, 4) of images (N, H, W) as (x_min, x_max, y_min, y_max) in centred pixel
    coordinates; an empty image gets a zero-size box at its centre."""
    ink = images > 0  # (N, H, W)
    extents = []
    for mask in (ink.any(dim=1), ink.any(dim=2)):  # columns (N, W), then rows (N, H)
        size = mask.shape[1]
        first = mask.int().argmax(dim=1)  # (N,): argmax finds the first inked place
        last = size - 1 - mask.flip(1).int().argmax(dim=1)  # (N,)
        centre, found = (size - 1) / 2, mask.any(dim=1)  # (N,)
        extents += [torch.where(found, first - centre - HALF_PIXEL, 0.0),
                    torch.where(found, last - centre + HALF_PIXEL, 0.0)]
    return torch.stack(extents, dim=-1)  # (N, 4)


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


def affine_set(images: torch.Tensor, ranges: AffineRanges = AffineRanges(), seed: int = 0,
               out_size: int | None = None) -> torch.Tensor:
    """The seeded affine test set of ``images`` (N, [C,] H, W), alike on every run, device and
    model: each image by its own map from :func:`sample_affine` on an ``out_size`` canvas."""
    params = sample_affine(images.shape[0], ranges, seed)
    size_out = out_size or images.shape[-1]
    matrix = linear_matrix(params).to(images.device)  # (N, 2, 2)
    ink = images if images.dim() == 3 else images.amax(dim=1)  # (N, H, W): any channel lit
    shift = inside_translation(bounding_boxes(ink), matrix, params.position, size_out)  # (N, 2)
    return warp(images, matrix, shift, out_size=size_out)


def place_on_canvas(images: torch.Tensor, canvas: int,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """Each image (N, H, W) at a random integer position (centred without ``generator``, on
    any device) on a black ``canvas`` square -> (N, canvas, canvas), same dtype."""
    N, H, W = images.shape
    if canvas < max(H, W):
        raise ValueError(f"canvas {canvas} is smaller than the {H}x{W} images")
    if generator is None:
        top = torch.full((N,), (canvas - H) // 2)
        left = torch.full((N,), (canvas - W) // 2)
    else:
        u = torch.rand(N, 2, device=generator.device, generator=generator)  # (N, 2): one row each
        top = (u[:, 0] * (canvas - H + 1)).long().clamp_max(canvas - H)  # (N,)
        left = (u[:, 1] * (canvas - W + 1)).long().clamp_max(canvas - W)  # (N,)
    # the canvas is a window of the image padded by canvas - size on every side
    padded = F.pad(images.unsqueeze(1), (canvas - W,) * 2 + (canvas - H,) * 2)  # (N, 1, ., .)
    return crop_at(padded, canvas - H - top, canvas - W - left, canvas, canvas)[:, 0]


def angle_range(max_angle: float, step: float) -> list[float]:
    """Angles from -max_angle to +max_angle in steps of ``step`` (0 always included)."""
    if step <= 0 or max_angle < 0:
        raise ValueError(f"need step > 0 and max_angle >= 0, got {step} and {max_angle}")
    count = math.floor(max_angle / step + 1e-9)
    return [float(k * step) for k in range(-count, count + 1)]



def crop_at(images: torch.Tensor, top: torch.Tensor, left: torch.Tensor, height: int,
            width: int) -> torch.Tensor:
    """The ``height`` x ``width`` window of each image (B, C, H, W) whose corner is at
    (top, left), each (B,) -> (B, C, height, width), by one gather."""
    B, C = images.shape[:2]
    device = images.device
    rows = top.to(device)[:, None] + torch.arange(height, device=device)  # (B, height)
    cols = left.to(device)[:, None] + torch.arange(width, device=device)  # (B, width)
    batch = torch.arange(B, device=device)[:, None, None, None]
    channel = torch.arange(C, device=device)[None, :, None, None]
    return images[batch, channel, rows[:, None, :, None], cols[:, None, None, :]]


def random_crop(images: torch.Tensor, size: int, generator: torch.Generator | None = None,
                width: int | None = None) -> torch.Tensor:
    """A ``size`` x ``width`` (default square) window of each image (B, C, H, W) at a uniform
    place -> (B, C, size, width)."""
    B, C, H, W = images.shape
    width = size if width is None else width
    if size > H or width > W:
        raise ValueError(f"a {size}x{width} crop does not fit {H}x{W} images")
    top = torch.randint(0, H - size + 1, (B,), device=images.device, generator=generator)
    left = torch.randint(0, W - width + 1, (B,), device=images.device, generator=generator)
    return crop_at(images, top, left, size, width)  # (B, C, size, width)


def random_shift(images: torch.Tensor, max_shift: int,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """Each image (B, C, H, W) shifted by up to ``max_shift`` pixels in x and y (uniform,
    independent), zero fill: the paper's augmentation."""
    if max_shift <= 0:
        return images
    padded = F.pad(images, (max_shift,) * 4)  # (B, C, H + 2s, W + 2s)
    return random_crop(padded, images.shape[-2], generator, images.shape[-1])  # (B, C, H, W)


def center_crop(images: torch.Tensor, size: int) -> torch.Tensor:
    """The central ``size`` x ``size`` window of images (..., H, W) (a view)."""
    H, W = images.shape[-2:]
    if size > H or size > W:
        raise ValueError(f"a {size}x{size} crop does not fit {H}x{W} images")
    top, left = (H - size) // 2, (W - size) // 2
    return images[..., top:top + size, left:left + size]
