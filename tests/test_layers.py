"""Unit tests of the capsule layers: squash, PrimaryCaps, DigitCaps' einsum, the Decoder."""
from __future__ import annotations

import pytest
import torch

from capsnet.layers import Decoder, DigitCaps, PrimaryCaps, squash
from capsnet.layers.digit_caps import LazyDigitCaps
from capsnet.routing import DynamicRouter
from capsnet.squashing import squash_parts

DTYPES = [torch.float32, torch.float64]


def tolerance(dtype: torch.dtype) -> float:
    return 1e-6 if dtype == torch.float32 else 1e-12


# --- squash -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_squash_hand_computed(dtype):
    # s = (3, 4): |s| = 5, |s|^2 = 25, so v = 25 / 26 * s / 5 = 25 / 26 * (0.6, 0.8).
    v = squash(torch.tensor([3.0, 4.0], dtype=dtype))
    expected = torch.tensor([25 / 26 * 0.6, 25 / 26 * 0.8], dtype=dtype)
    torch.testing.assert_close(v, expected, rtol=tolerance(dtype), atol=tolerance(dtype))
    # s = (1, 0): |s|^2 = 1, so v = (1/2, 0).
    v = squash(torch.tensor([[1.0, 0.0]], dtype=dtype))
    torch.testing.assert_close(v, torch.tensor([[0.5, 0.0]], dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_squash_shrinks_length_below_one_and_keeps_direction(dtype):
    g = torch.Generator().manual_seed(0)
    scales = torch.logspace(-1, 3, 64, dtype=dtype)[:, None]  # lengths from ~0.3 to ~3000
    s = torch.randn(64, 8, generator=g, dtype=dtype) * scales  # (64, 8)
    v = squash(s)  # (64, 8)
    s_len, v_len = s.norm(dim=-1), v.norm(dim=-1)  # (64,)
    assert (v_len < 1).all()
    expected_len = s_len**2 / (1 + s_len**2)
    torch.testing.assert_close(v_len, expected_len, rtol=1e-5, atol=1e-12)
    cosine = (s * v).sum(-1) / (s_len * v_len)
    torch.testing.assert_close(cosine, torch.ones_like(cosine))


def test_squash_short_vectors_keep_relative_precision_in_float32():
    s = torch.full((3, 8), 5e-5)  # |s| = 1.41e-4, |s|^2 = 2e-8 < float32 epsilon
    v_len = squash(s).norm(dim=-1)  # (3,)
    s_len = s.double().norm(dim=-1)
    torch.testing.assert_close(v_len.double(), s_len**2 / (1 + s_len**2), rtol=1e-4, atol=0)


def test_squash_along_another_dim():
    s = torch.randn(2, 5, 3)  # capsule vectors along dim 1
    expected = squash(s.transpose(1, 2)).transpose(1, 2)
    torch.testing.assert_close(squash(s, dim=1), expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_squash_zero_vector_gives_zero_and_finite_gradient(dtype):
    s = torch.zeros(3, 4, dtype=dtype, requires_grad=True)
    v = squash(s)
    assert torch.equal(v, torch.zeros_like(v))
    (v * torch.randn_like(v)).sum().backward()
    assert torch.isfinite(s.grad).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("value", [1e20, 1e30, -1e30])
def test_squash_huge_vectors_have_unit_length_and_finite_gradient(dtype, value):
    s = torch.full((3, 4), value, dtype=dtype)
    s[1, 0] = 0.0  # mixed magnitudes in one vector
    s.requires_grad_(True)
    v = squash(s)
    assert torch.isfinite(v).all()
    torch.testing.assert_close(v.norm(dim=-1), torch.ones(3, dtype=dtype), rtol=1e-6, atol=1e-6)
    (v * torch.randn_like(v)).sum().backward()
    assert torch.isfinite(s.grad).all()


def test_squash_gradient_matches_finite_differences():
    s = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(squash, (s,))


def test_squash_second_derivatives_match_finite_differences():
    # a gradient penalty or torch.func differentiates the fused backward itself
    s = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(squash, (s,))


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_squash_gradient_matches_finite_differences_at_all_lengths(scale):
    s = (scale * torch.randn(3, 5, 4, dtype=torch.float64)).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: squash(x, dim=1), (s,))


def test_fused_squash_equals_autograd_of_its_formula():
    # The analytic backward against autograd through the plain ops of the same values, and
    # the parts against the textbook formula, s |s| / (1 + |s|^2).
    s = (torch.randn(64, 10, 16, dtype=torch.float64)
         * torch.logspace(-4, 4, 64, dtype=torch.float64)[:, None, None]).requires_grad_(True)
    g = torch.randn_like(s)
    fused, = torch.autograd.grad(squash(s), s, g)
    v, u, k, f = squash_parts(s)
    plain, = torch.autograd.grad(v, s, g)
    torch.testing.assert_close(fused, plain, rtol=1e-10, atol=1e-14)
    n = s.detach().norm(dim=-1, keepdim=True)  # (64, 10, 1)
    for got, expected in ((v, s * n / (1 + n**2)), (u, s / n), (k, n / (1 + n**2)),
                          (f, n**2 / (1 + n**2)), (u * f, v)):
        torch.testing.assert_close(got.detach(), expected.detach(), rtol=1e-12, atol=0)
    with torch.no_grad():  # the inference path: the same values
        torch.testing.assert_close(squash(s), v.detach(), rtol=0, atol=0)


# --- PrimaryCaps --------------------------------------------------------------------------

def test_primary_caps_shape_and_type_major_order():
    B, C, types, dim, grid = 2, 5, 3, 4, 6
    layer = PrimaryCaps(C, types, dim, kernel=3, stride=2)
    x = torch.randn(B, C, 2 * grid + 1, 2 * grid + 1)  # conv output grid: (13 - 3) // 2 + 1 = 6
    u = layer(x)  # (B, types * 6 * 6, dim)
    assert u.shape == (B, types * grid * grid, dim)
    assert (u.norm(dim=-1) < 1).all()
    # Capsule (type t, row r, column c) is the squashed vector of channels t*dim .. t*dim+dim-1.
    conv = layer.conv(x)  # (B, types*dim, 6, 6)
    t, r, c = 2, 4, 1
    expected = squash(conv[:, t * dim:(t + 1) * dim, r, c])  # (B, dim)
    torch.testing.assert_close(u[:, t * grid * grid + r * grid + c], expected)



def test_primary_caps_on_non_square_maps_counts_its_capsules():
    B, C, types, dim = 2, 4, 3, 5
    layer = PrimaryCaps(C, types, dim, kernel=3, stride=2)
    x = torch.randn(B, C, 13, 9)  # grid (13 - 3) // 2 + 1 = 6 rows, (9 - 3) // 2 + 1 = 4 columns
    u = layer(x)  # (B, 3 * 6 * 4, 5)
    assert layer.grid(13, 9) == (6, 4)
    assert u.shape == (B, layer.num_capsules(13, 9), dim) == (B, types * 6 * 4, dim)
    conv = layer.conv(x)  # (B, types*dim, 6, 4): capsule (t, r, c) is still type-major
    t, r, c = 1, 5, 3
    expected = squash(conv[:, t * dim:(t + 1) * dim, r, c])  # (B, dim)
    torch.testing.assert_close(u[:, t * 6 * 4 + r * 4 + c], expected)


def test_paper_primary_caps_count_is_1152():
    assert PrimaryCaps(256, 32, 8, kernel=9, stride=2).num_capsules(20) == 1152


@pytest.mark.parametrize("shape, expected", [
    ((2, 3, 13, 13), r"expects feature maps \(B, 4, H, W\), got \(2, 3, 13, 13\)"),
    ((4, 13, 13), r"expects feature maps \(B, 4, H, W\)"),
    ((2, 4, 13, 2), r"needs input maps of at least 3x3, got 13x2"),
])
def test_primary_caps_wrong_input_is_one_line(shape, expected):
    layer = PrimaryCaps(4, 3, 5, kernel=3, stride=2)
    with pytest.raises(ValueError, match=expected) as error:
        layer(torch.randn(*shape))
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="at least 3x3"):
        layer.num_capsules(2, 9)

# --- DigitCaps ----------------------------------------------------------------------------

def test_digit_caps_einsum_equals_plain_loop_and_expanded_matmul():
    B, I, K, J, D = 2, 5, 3, 4, 6
    layer = DigitCaps(I, K, J, D, DynamicRouter(iterations=3)).double()
    u = torch.randn(B, I, K, dtype=torch.float64)
    u_hat = layer.predictions(u).transpose(1, 2)  # output-major (B, J, I, D) -> (B, I, J, D)
    assert u_hat.shape == (B, I, J, D)
    W = layer.W.detach()  # (I, J, D, K)
    loop = torch.zeros(B, I, J, D, dtype=torch.float64)
    for b in range(B):
        for i in range(I):
            for j in range(J):
                for d in range(D):
                    loop[b, i, j, d] = sum(W[i, j, d, k] * u[b, i, k] for k in range(K))
    torch.testing.assert_close(u_hat, loop)
    # The common (wasteful) formulation: W copied per example, u per output capsule.
    W_big = W.unsqueeze(0).expand(B, I, J, D, K)  # (B, I, J, D, K)
    u_big = u[:, :, None, :, None].expand(B, I, J, K, 1)  # (B, I, J, K, 1)
    torch.testing.assert_close(u_hat, (W_big @ u_big)[..., 0])


def test_digit_caps_forward_shape_and_lengths():
    layer = DigitCaps(in_caps=7, in_dim=4, out_caps=3, out_dim=5, router=DynamicRouter(2))
    routed = layer(torch.randn(1, 7, 4))  # batch of one
    v = routed.poses
    assert v.shape == (1, 3, 5)
    assert (v.norm(dim=-1) < 1).all()
    assert torch.equal(routed.activations, torch.linalg.vector_norm(v, dim=-1))
    assert len(routed.couplings) == 2 and routed.couplings[0].shape == (1, 3, 7)



def test_digit_caps_wrong_capsule_count_is_one_line_naming_the_fix():
    layer = DigitCaps(in_caps=7, in_dim=4, out_caps=3, out_dim=5, router=DynamicRouter(2))
    with pytest.raises(ValueError, match=r"expects input capsules \(B, 7, 4\), got \(2, 9, 4\).*"
                                         r"num_capsules") as error:
        layer(torch.randn(2, 9, 4))
    assert "\n" not in str(error.value)


def test_lazy_digit_caps_reads_its_input_count_then_is_a_digit_caps():
    torch.manual_seed(0)
    layer = LazyDigitCaps(in_dim=4, out_caps=3, out_dim=5, router=DynamicRouter(2))
    routed = layer(torch.randn(2, 9, 4))  # (B, I=9, 4)
    assert type(layer) is DigitCaps and layer.W.shape == (9, 3, 5, 4)
    assert routed.poses.shape == (2, 3, 5)
    assert list(layer.state_dict()) == ["W"]  # the keys of a DigitCaps
    assert 0.005 < layer.W.std().item() < 0.02  # initialised as DigitCaps does (std 0.01)
    with pytest.raises(ValueError, match=r"\(B, 9, 4\)"):  # fixed from now on
        layer(torch.randn(2, 8, 4))

# --- Decoder ------------------------------------------------------------------------------

@pytest.fixture
def decoder() -> Decoder:
    torch.manual_seed(0)
    return Decoder(num_caps=4, caps_dim=3, hidden=(8, 16), image_shape=(1, 5, 5)).eval()


@pytest.mark.parametrize("B", [1, 3])
def test_decoder_shape_and_range(decoder, B):
    poses = torch.randn(B, 4, 3)
    images = decoder(poses, torch.zeros(B, dtype=torch.long))
    assert images.shape == (B, 1, 5, 5)
    assert ((images >= 0) & (images <= 1)).all()


def test_decoder_sees_only_the_kept_capsule(decoder):
    poses = torch.randn(2, 4, 3)
    keep = torch.tensor([1, 3])
    out = decoder(poses, keep)
    changed = poses.clone()
    changed[0, [0, 2, 3]] = torch.randn(3, 3)  # everything but capsule 1 of example 0
    changed[1, :3] = torch.randn(3, 3)  # everything but capsule 3 of example 1
    torch.testing.assert_close(decoder(changed, keep), out, rtol=0, atol=0)
    changed[0, 1] += 1.0  # the kept capsule does matter
    assert not torch.allclose(decoder(changed, keep)[0], out[0])


def test_decoder_index_and_one_hot_mask_agree(decoder):
    poses = torch.randn(3, 4, 3)
    keep = torch.tensor([2, 0, 3])
    mask = torch.nn.functional.one_hot(keep, 4)  # (3, 4)
    torch.testing.assert_close(decoder(poses, keep), decoder(poses, mask))
    # The input to the first layer is the whole J*D vector with other capsules zeroed.
    expected_input = torch.zeros(3, 4, 3)
    expected_input[torch.arange(3), keep] = poses[torch.arange(3), keep]
    expected = decoder.net(expected_input.flatten(1)).view(3, 1, 5, 5)
    torch.testing.assert_close(decoder(poses, keep), expected)
