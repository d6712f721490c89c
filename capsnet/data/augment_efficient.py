"""Efficient-CapsNet's MNIST training augmentation, batched on the training device.

As the authors' code applies it (EscVM/Efficient-CapsNet, utils/pre_process_mnist.py), to
every training image each epoch, in this order: :func:`random_rotate`, half of the time, by
-29..29 whole degrees; :func:`random_margin_shift` into the empty margins; :func:`random_squeeze`
of the width by 1..7 columns (Lanczos-3); :func:`random_erase` of a 4x4 patch. Each step is
one set of tensor operations over the batch (B, C, H, W); the random numbers come from
``generator``."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from capsnet.data.transforms import crop_at

SIGMA = 0.33  # the standard deviation of every normal draw (tf.random.normal(.., 0, .33))
CLIP = 0.9999  # draws are clipped to +-CLIP (tf.minimum / tf.maximum)
MAX_DEGREES = 30  # rotation: angle = int(30 r)
SQUEEZE_FRACTION = 4  # squeeze: up to W / 4 columns (7 for MNIST) taken from the width
LANCZOS_RADIUS = 3  # tf.image.ResizeMethod.LANCZOS3
ERASE_SIZE = 4  # erase: a 4x4 patch ...
ERASE_FIRST, ERASE_PLACES = 4, 19  # ... at row and column floor(19 u) + 4: 4..22
# OpenCV's warpAffine (bilinear) computes source coordinates in fixed point, 1/1024 pixel,
# then keeps 1/32 pixel for the interpolation weights (AB_BITS 10, INTER_BITS 5).
FIXED_POINT, SUBPIXEL = 1024, 32


def half_normal(shape: tuple[int, ...], generator: torch.Generator | None,
                device: torch.device) -> torch.Tensor:
    """min(|N(0, SIGMA)|, CLIP), float32: the fractions of the shift and the squeeze."""
    r = torch.randn(shape, generator=generator, device=device) * SIGMA
    return r.abs().clamp_max(CLIP)


# --- 1. rotation -----------------------------------------------------------------------------

def rotate(images: torch.Tensor, degrees: torch.Tensor) -> torch.Tensor:
    """Each image (B, C, H, W) turned counter-clockwise by its ``degrees`` (B,) about (W/2,
    H/2), bilinear, zero outside, as OpenCV's warpAffine rounds it -> (B, C, H, W)."""
    H, W = images.shape[-2:]
    device = images.device
    dtype = torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64
    angle = torch.deg2rad(degrees.to(device, dtype))  # (B,)
    a, b = angle.cos()[:, None], angle.sin()[:, None]  # (B, 1)
    cx, cy = W / 2, H / 2
    x = torch.arange(W, device=device, dtype=dtype)  # (W,)
    y = torch.arange(H, device=device, dtype=dtype)  # (H,)
    # the inverse map, destination -> source (cv2.invertAffineTransform): a turn by -angle
    # about (cx, cy), as a part per column plus a part per row
    col = opencv_subpixel(a * x, -b * y + (cx - a * cx + b * cy))  # (B, H, W) source x
    row = opencv_subpixel(b * x, a * y + (cy - b * cx - a * cy))  # (B, H, W) source y
    grid = torch.stack([col / (W - 1), row / (H - 1)], dim=-1) * 2 - 1  # (B, H, W, 2)
    turned = F.grid_sample(images.to(dtype), grid, mode="bilinear", padding_mode="zeros",
                           align_corners=True)  # (B, C, H, W)
    return turned.to(images.dtype)


def opencv_subpixel(per_col: torch.Tensor, per_row: torch.Tensor) -> torch.Tensor:
    """Source coordinates per_col (B, W) + per_row (B, H) rounded to 1/1024, then to 1/32
    pixel -> (B, H, W) of per_col's dtype."""
    fixed = ((per_col * FIXED_POINT).round()[:, None, :]
             + (per_row * FIXED_POINT).round()[:, :, None]).long()  # (B, H, W), 1/1024 pixel
    step = FIXED_POINT // SUBPIXEL
    sub = torch.div(fixed + step // 2, step, rounding_mode="floor")  # (B, H, W), 1/32 pixel
    return sub.to(per_col.dtype) / SUBPIXEL


def rotation_draws(batch: int, generator: torch.Generator | None,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Whole degrees int(30 r), r ~ N(0, 0.33) clipped to +-0.9999, (B,), and whether each
    image is turned (half of the time), (B,) bool."""
    r = (torch.randn((batch, 2), generator=generator, device=device) * SIGMA).clamp(-CLIP, CLIP)
    return (r[:, 0] * MAX_DEGREES).trunc(), r[:, 1] <= 0


def random_rotate(images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Half of the images (B, C, H, W) turned by :func:`rotation_draws`."""
    degrees, turned = rotation_draws(images.shape[0], generator, images.device)
    return torch.where(turned[:, None, None, None], rotate(images, degrees), images)


# --- 2. shift into the free margins ----------------------------------------------------------

def margins(images: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Empty columns left and right of the ink, rows above and below (0 if blank), each (B,)."""
    cols = (images.sum(dim=(1, 2)) > 0).int()  # (B, W)
    rows = (images.sum(dim=(1, 3)) > 0).int()  # (B, H)
    # argmax finds the first maximum: the first inked column from either side
    return cols.argmax(1), cols.flip(1).argmax(1), rows.argmax(1), rows.flip(1).argmax(1)


def margin_shift(before: torch.Tensor, after: torch.Tensor, fraction: torch.Tensor,
                 forward: torch.Tensor) -> torch.Tensor:
    """Pixels (B,) to move along one axis toward the start or (``forward``) the end, a
    ``fraction`` of the margin ``before`` or ``after``; all (B,)."""
    back = torch.floor(-fraction * before)  # (B,)
    ahead = torch.floor(fraction * (1 + after))  # (B,)
    return torch.where(forward, ahead, back).long()


def roll(images: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor) -> torch.Tensor:
    """Each image (B, C, H, W) rolled down by dy (B,) and right by dx (B,), as tf.roll:
    a window of the image wrapped around on every side."""
    H, W = images.shape[-2:]
    wrapped = F.pad(images, (W, W, H, H), mode="circular")  # (B, C, 3H, 3W)
    return crop_at(wrapped, H - dy, W - dx, H, W)  # (B, C, H, W)


def random_margin_shift(images: torch.Tensor,
                        generator: torch.Generator | None = None) -> torch.Tensor:
    """Each image (B, C, H, W) moved in x and y by a fraction min(|N(0, 0.33)|, 0.9999) of
    its free margin on a random side."""
    B, device = images.shape[0], images.device
    left, right, top, bottom = margins(images)
    forward = torch.rand((B, 2), generator=generator, device=device) >= 0.5  # floor(2u) == 1
    fraction = half_normal((B, 2), generator, device)  # (B, 2)
    dx = margin_shift(left, right, fraction[:, 0], forward[:, 1])  # their pairing of draws
    dy = margin_shift(top, bottom, fraction[:, 1], forward[:, 0])
    return roll(images, dy, dx)


# --- 3. horizontal squeeze -------------------------------------------------------------------

def lanczos3(x: torch.Tensor) -> torch.Tensor:
    """TensorFlow's Lanczos-3 kernel: 3 sin(pi x) sin(pi x / 3) / (pi x)^2 within 3, else 0."""
    x = x.abs()
    safe = x.clamp_min(1e-3)
    value = (LANCZOS_RADIUS * torch.sin(math.pi * safe) * torch.sin(math.pi * safe / LANCZOS_RADIUS)
             / (math.pi ** 2 * safe * safe))
    return torch.where(x <= 1e-3, 1.0, torch.where(x > LANCZOS_RADIUS, 0.0, value))


def squeeze_weights(size: int, cut: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
    """The matrices (B, size, size) [b, output column, input column] resizing a row to size -
    cut (B,) pixels (TensorFlow's antialiased Lanczos-3) placed from column cut // 2 + extra."""
    device = cut.device
    out_size = (size - cut).float()[:, None, None]  # (B, 1, 1)
    inv_scale = size / out_size  # (B, 1, 1): the kernel's width, > 1 (a downscale)
    j = torch.arange(size, device=device)[None, :, None] - (cut // 2 + extra)[:, None, None]
    sample = (j + 0.5) * inv_scale  # (B, size, 1): where output column j samples the input
    source = torch.arange(size, device=device, dtype=torch.float32)[None, None, :]  # (1, 1, size)
    # the span of input pixels TensorFlow sums over, clamped to the image
    start = torch.ceil(sample - LANCZOS_RADIUS * inv_scale - 0.5).clamp(0, size - 1)
    end = torch.floor(sample + LANCZOS_RADIUS * inv_scale - 0.5).clamp(0, size - 1)
    weights = lanczos3((source + 0.5 - sample) * (1 / inv_scale))  # (B, size, size)
    weights = weights * ((source >= start) & (source <= end))
    weights = weights * (1 / weights.sum(-1, keepdim=True).clamp_min(1e-30))
    placed = (j >= 0) & (j < out_size)  # (B, size, 1): the columns the resized row covers
    return weights * placed


def squeeze(images: torch.Tensor, cut: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
    """Each image's (B, C, H, W) width resized to W - cut (B,), placed from column
    cut // 2 + extra (B,) on zeros."""
    weights = squeeze_weights(images.shape[-1], cut.to(images.device), extra.to(images.device))
    return torch.einsum("bchs,bjs->bchj", images, weights.to(images.dtype))  # (B, C, H, W)


def random_squeeze(images: torch.Tensor,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """Each image (B, C, H, W) squeezed by floor(W/4 r + 1) columns at cut // 2 + floor(2 r')."""
    B, W = images.shape[0], images.shape[-1]
    r = half_normal((B, 2), generator, images.device)  # (B, 2)
    cut = torch.floor(r[:, 0] * (W / SQUEEZE_FRACTION) + 1).long()  # (B,)
    extra = torch.floor(r[:, 1] * 2).long()  # (B,) 0 or 1
    return squeeze(images, cut, extra)


# --- 4. erasing ------------------------------------------------------------------------------

def erase(images: torch.Tensor, top: torch.Tensor, left: torch.Tensor,
          size: int = ERASE_SIZE) -> torch.Tensor:
    """The ``size`` x ``size`` patch of each image (B, C, H, W) at (top, left) (B,) zeroed."""
    H, W = images.shape[-2:]
    device = images.device
    rows = torch.arange(H, device=device) - top[:, None]  # (B, H)
    cols = torch.arange(W, device=device) - left[:, None]  # (B, W)
    patch = (((rows >= 0) & (rows < size))[:, :, None]
             & ((cols >= 0) & (cols < size))[:, None, :])  # (B, H, W)
    return images * ~patch[:, None]  # (B, C, H, W)


def random_erase(images: torch.Tensor, generator: torch.Generator | None = None,
                 size: int = ERASE_SIZE, first: int = ERASE_FIRST,
                 places: int = ERASE_PLACES) -> torch.Tensor:
    """A ``size`` x ``size`` patch of each image (B, C, H, W) zeroed at a uniform place."""
    B, C, H, W = images.shape
    if first + places - 1 + size > min(H, W):
        raise ValueError(f"a {size}x{size} patch from {first}..{first + places - 1} does not "
                         f"fit {H}x{W} images")
    u = torch.rand((B, 2), generator=generator, device=images.device)  # (B, 2)
    corner = torch.floor(u * places).long() + first  # (B, 2)
    return erase(images, corner[:, 0], corner[:, 1], size)


def efficient_augment(images: torch.Tensor,
                      generator: torch.Generator | None = None) -> torch.Tensor:
    """Rotation, margin shift, squeeze, erasing, in the authors' order. (B, C, H, W) -> same."""
    x = random_rotate(images, generator)
    x = random_margin_shift(x, generator)
    x = random_squeeze(x, generator)
    return random_erase(x, generator)
