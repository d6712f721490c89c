"""Geometric transforms: rotations that match exact pixel permutations, affine maps that move
points where their matrices say, seeded and prefix-stable random sets, canvas placement."""
from __future__ import annotations

import pytest
import torch

from capsnet.data.transforms import (
    AffineRanges,
    affine_set,
    angle_range,
    bounding_boxes,
    linear_matrix,
    place_on_canvas,
    rotate,
    rotation_matrix,
    sample_affine,
    warp,
)


def asymmetric_image(size: int = 28) -> torch.Tensor:
    """(1, size, size) uint8 with no rotational symmetry: an L-shape and a dot."""
    img = torch.zeros(1, size, size, dtype=torch.uint8)
    img[0, 5:15, 8:11] = 200  # vertical bar
    img[0, 13:15, 8:18] = 120  # foot to the right
    img[0, 20, 21] = 77
    return img


def blob(size: int, centre: tuple[float, float], sigma: float = 2.5) -> torch.Tensor:
    """(1, size, size) float Gaussian blob centred at (x, y) pixel coordinates."""
    y, x = torch.meshgrid(torch.arange(size).float(), torch.arange(size).float(),
                          indexing="ij")
    return torch.exp(-((x - centre[0]) ** 2 + (y - centre[1]) ** 2) / (2 * sigma**2))[None]


@pytest.mark.parametrize("angle,k", [(90.0, 1), (-90.0, -1), (180.0, 2), (270.0, 3)])
def test_quarter_turns_are_exact_pixel_rotations_counter_clockwise(angle, k):
    img = asymmetric_image()
    # torch.rot90 with k=1 over (rows, columns) turns the picture counter-clockwise on screen.
    assert torch.equal(rotate(img, angle), torch.rot90(img, k, dims=(-2, -1)))


def test_rotation_by_zero_is_the_identity_for_uint8_and_float():
    img = asymmetric_image()
    assert torch.equal(rotate(img, 0.0), img)
    as_float = img.float().unsqueeze(1) / 255  # (1, 1, 28, 28)
    out = rotate(as_float, 0.0)
    assert out.dtype == torch.float32 and out.shape == as_float.shape
    assert torch.allclose(out, as_float, atol=1e-6)


def test_positive_angle_moves_a_point_on_the_right_upwards():
    img = (blob(29, (22.0, 14.0)) * 255).round().to(torch.uint8)  # right of the centre (14, 14)
    turned = rotate(img, 90.0)[0].float()
    row, col = divmod(int(turned.argmax()), 29)
    assert (col, row) == (14, 6)  # now straight above the centre


def test_rotation_onto_a_larger_canvas_equals_centring_then_rotating():
    img = asymmetric_image()
    centred = place_on_canvas(img, 40)
    assert torch.equal(rotate(img, 90.0, out_size=40), torch.rot90(centred, 1, dims=(-2, -1)))
    difference = rotate(img, 33.0, out_size=40).int() - rotate(centred, 33.0).int()
    assert difference.abs().max() <= 1


def test_per_image_angles():
    imgs = asymmetric_image().repeat(2, 1, 1)
    out = rotate(imgs, torch.tensor([0.0, 90.0]))
    assert torch.equal(out[0], imgs[0]) and torch.equal(out[1], torch.rot90(imgs[1], 1, (-2, -1)))


def test_warp_moves_a_pixel_where_the_matrix_and_translation_say():
    size, c = 29, 14  # odd size: the centre is a pixel
    img = torch.zeros(1, size, size)
    img[0, c + 3, c + 2] = 1.0  # point (x, y) = (2, 3) from the centre
    shear = torch.tensor([[1.0, 1.0], [0.0, 1.0]])  # x' = x + y
    out = warp(img, shear, translation=torch.tensor([[-1.0, 2.0]]))
    # (2 + 3 - 1, 3 + 2) = (4, 5) from the centre
    assert out[0, c + 5, c + 4] == pytest.approx(1.0)
    assert out.sum() == pytest.approx(1.0)


def test_scaling_scales_the_ink_by_the_determinant():
    img = blob(40, (19.5, 19.5))
    params = sample_affine(1, AffineRanges(max_rotation_deg=0, max_shear=0, scale=(1.2, 1.2)))
    out = warp(img, linear_matrix(params))
    assert out.sum().item() == pytest.approx(1.44 * img.sum().item(), rel=0.01)


def test_rotation_matrices_are_rotations():
    m = rotation_matrix(torch.tensor([0.0, 30.0, -75.0]))
    assert torch.allclose(m @ m.transpose(1, 2), torch.eye(2).expand(3, 2, 2), atol=1e-6)
    assert torch.allclose(torch.linalg.det(m), torch.ones(3), atol=1e-6)


def test_affine_parameters_are_seeded_within_their_ranges_and_prefix_stable():
    ranges = AffineRanges()
    a, b, c = sample_affine(500, ranges, seed=3), sample_affine(500, ranges, seed=3), \
        sample_affine(500, ranges, seed=4)
    assert torch.equal(a.rotation_deg, b.rotation_deg) and torch.equal(a.position, b.position)
    assert not torch.equal(a.rotation_deg, c.rotation_deg)
    assert a.rotation_deg.abs().max() <= ranges.max_rotation_deg
    assert a.rotation_deg.abs().max() > 0.9 * ranges.max_rotation_deg  # the range is used
    assert a.shear.abs().max() <= ranges.max_shear
    for scale in (a.scale_x, a.scale_y):
        assert ranges.scale[0] <= scale.min() and scale.max() <= ranges.scale[1]
    head = sample_affine(7, ranges, seed=3)
    assert torch.equal(head.shear, a.shear[:7]) and torch.equal(head.position, a.position[:7])


def test_affine_set_is_deterministic_and_keeps_the_digit_inside():
    images = torch.cat([(blob(28, (x, y), 2.0) * 255).round().to(torch.uint8)
                        for x, y in [(8, 8), (20, 9), (13.5, 13.5), (10, 20)]])  # (4, 28, 28)
    first = affine_set(images, seed=11, out_size=40)
    assert first.shape == (4, 40, 40) and first.dtype == torch.uint8
    assert torch.equal(first, affine_set(images, seed=11, out_size=40))
    assert not torch.equal(first, affine_set(images, seed=12, out_size=40))
    assert torch.equal(first[:2], affine_set(images[:2], seed=11, out_size=40))
    # Nothing is cut off: the ink is the original's times the area factor sx * sy.
    params = sample_affine(4, AffineRanges(), seed=11)
    expected = images.float().sum((1, 2)) * params.scale_x * params.scale_y  # (4,)
    assert torch.allclose(first.float().sum((1, 2)), expected, rtol=0.03, atol=0)


def test_affine_translation_spreads_over_the_canvas():
    img = (blob(28, (13.5, 13.5), 1.5) * 255).round().to(torch.uint8).repeat(200, 1, 1)
    out = affine_set(img, seed=0, out_size=40)
    boxes = bounding_boxes(out)  # (200, 4)
    centres = (boxes[:, 0] + boxes[:, 1]) / 2
    assert centres.min() < -10 and centres.max() > 10  # far beyond the +-6 of centring


def test_bounding_boxes():
    img = torch.zeros(2, 28, 28, dtype=torch.uint8)
    img[0, 3:10, 5:8] = 1
    assert bounding_boxes(img).tolist() == [[-9.0, -6.0, -11.0, -4.0], [0.0, 0.0, 0.0, 0.0]]


def test_place_on_canvas_is_a_seeded_exact_copy_at_every_position():
    images = torch.randint(1, 256, (300, 28, 28), dtype=torch.uint8)
    g = torch.Generator().manual_seed(5)
    placed = place_on_canvas(images, 40, g)
    again = place_on_canvas(images, 40, torch.Generator().manual_seed(5))
    assert placed.shape == (300, 40, 40) and torch.equal(placed, again)
    tops, lefts = [], []
    for src, out in zip(images, placed, strict=False):
        rows, cols = (out > 0).any(1).nonzero(), (out > 0).any(0).nonzero()
        top, left = int(rows.min()), int(cols.min())
        assert torch.equal(out[top:top + 28, left:left + 28], src)
        assert int(out.sum()) == int(src.sum())
        tops.append(top), lefts.append(left)
    assert min(tops) == 0 and max(tops) == 12 and min(lefts) == 0 and max(lefts) == 12
    centred = place_on_canvas(images[:1], 40)
    assert torch.equal(centred[0, 6:34, 6:34], images[0])


def test_place_on_canvas_rejects_a_small_canvas():
    with pytest.raises(ValueError, match="smaller"):
        place_on_canvas(torch.zeros(1, 28, 28, dtype=torch.uint8), 20)


def test_angle_range():
    assert angle_range(60, 15) == [-60, -45, -30, -15, 0, 15, 30, 45, 60]
    assert angle_range(50, 20) == [-40, -20, 0, 20, 40]
    assert angle_range(0, 5) == [0]
    with pytest.raises(ValueError):
        angle_range(60, 0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_transforms_run_on_the_device_of_their_input():
    images = torch.randint(0, 256, (5, 28, 28), dtype=torch.uint8)
    on_gpu = affine_set(images.cuda(), seed=2, out_size=40)
    assert on_gpu.device.type == "cuda"
    difference = on_gpu.cpu().int() - affine_set(images, seed=2, out_size=40).int()
    assert difference.abs().max() <= 1
