"""Every path of GemmConv2d (per-kernel-row GEMMs, oneDNN NCHW, oneDNN channels-last) equals
F.conv2d: outputs and every gradient, in float64 and under bf16 autocast."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from capsnet.layers.gemm_conv import CONV_IMPLS, GemmConv2d


def _reference_and_gemm(in_channels, out_channels, kernel, stride, size, batch=3, bias=True,
                        impl="gemm", padding=0):
    torch.manual_seed(0)
    conv = GemmConv2d(in_channels, out_channels, kernel, stride, padding, impl=impl).double()
    if not bias:
        conv.bias = None
    x = torch.randn(batch, in_channels, *size, dtype=torch.float64, requires_grad=True)
    return conv, x


@pytest.mark.parametrize("impl", CONV_IMPLS)
@pytest.mark.parametrize("in_channels,out_channels,kernel,stride,size,padding", [
    (16, 24, 9, 2, (20, 20), 0),   # PrimaryCaps' shape, narrow
    (5, 7, 3, 1, (8, 8), 0),       # stride 1
    (4, 6, 5, 3, (17, 14), 0),     # non-square input, stride 3, ragged edge
    (3, 8, 9, 2, (9, 9), 0),       # a 1x1 output grid
    (1, 16, 9, 1, (28, 28), 0),    # Conv1's shape: narrow rows, the whole kernel in one chunk
    (20, 6, 5, 2, (13, 13), 0),    # 100-wide rows: chunks of 3 rows and a last one of 2
    (6, 5, 5, 1, (7, 9), 2),       # the CNN baseline's 'same' padding
])
def test_outputs_and_gradients_equal_conv2d(in_channels, out_channels, kernel, stride, size,
                                            padding, impl):
    conv, x = _reference_and_gemm(in_channels, out_channels, kernel, stride, size, impl=impl,
                                  padding=padding)
    out = conv(x)
    expected = F.conv2d(x, conv.weight, conv.bias, stride=stride, padding=padding)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)

    upstream = torch.randn_like(out)
    grads = torch.autograd.grad(out, (x, conv.weight, conv.bias), upstream)
    expected_grads = torch.autograd.grad(expected, (x, conv.weight, conv.bias), upstream)
    for got, want in zip(grads, expected_grads, strict=False):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_without_bias_and_without_input_gradient():
    conv, x = _reference_and_gemm(4, 6, 3, 2, (9, 9), bias=False)
    x = x.detach()
    out = conv(x)
    torch.testing.assert_close(out, F.conv2d(x, conv.weight, stride=2))
    (weight_grad,) = torch.autograd.grad(out.square().sum(), (conv.weight,))
    (expected,) = torch.autograd.grad(F.conv2d(x, conv.weight, stride=2).square().sum(),
                                      (conv.weight,))
    torch.testing.assert_close(weight_grad, expected)


def test_same_state_dict_as_conv2d_and_fallback_paths():
    conv = GemmConv2d(4, 6, 3, 2)
    plain = torch.nn.Conv2d(4, 6, 3, stride=2)
    assert conv.state_dict().keys() == plain.state_dict().keys()
    plain.load_state_dict(conv.state_dict())
    x = torch.randn(2, 4, 9, 9)
    torch.testing.assert_close(conv(x), plain(x))
    with torch.autocast("cpu", torch.bfloat16):  # bf16 out, as autocast's nn.Conv2d gives
        assert conv(x).dtype == plain(x).dtype == torch.bfloat16
    assert conv.candidates("cpu") == CONV_IMPLS and "gemm" not in conv.candidates("cuda")
    with pytest.raises(ValueError, match="not available"):
        conv.set_impl("winograd")
    with pytest.raises(RuntimeError):  # input smaller than the kernel: nn.Conv2d's error
        conv(torch.randn(2, 4, 2, 2))


def test_primary_caps_output_channel_view_still_works():
    """The CPU path returns a channels-last view; PrimaryCaps splits its channel dimension."""
    from capsnet.layers import PrimaryCaps

    layer = PrimaryCaps(in_channels=8, types=4, dim=8, kernel=9, stride=2)
    x = torch.randn(2, 8, 20, 20)
    u = layer(x)
    assert u.shape == (2, 4 * 6 * 6, 8)
    assert torch.isfinite(u).all()


@pytest.mark.parametrize("in_channels", [1, 3])
def test_weight_gradient_has_the_parameters_strides(in_channels):
    """DDP's gradient buckets expect .grad with the parameter's exact strides (with one
    input channel, channels-last and contiguous strides differ in that dimension only)."""
    conv = GemmConv2d(in_channels, 4, 3, 1)
    conv(torch.randn(2, in_channels, 6, 6)).sum().backward()
    assert conv.weight.grad.stride() == conv.weight.stride()
    x = torch.randn(2, in_channels, 6, 6)  # and the same values as F.conv2d's gradient
    w = conv.weight.detach().clone().requires_grad_()
    F.conv2d(x, w, conv.bias).sum().backward()
    conv.weight.grad = None
    conv(x).sum().backward()
    torch.testing.assert_close(conv.weight.grad, w.grad)


@pytest.mark.parametrize("impl", CONV_IMPLS)
@pytest.mark.parametrize("shape", [(16, 24, 9, 2, (20, 20)), (1, 16, 9, 1, (28, 28))])
def test_bf16_autocast_paths_agree_with_float64(impl, shape):
    """Under bf16 autocast every path gives bf16 outputs and float32 parameter gradients
    close to the float64 convolution (bf16 keeps 8 significant bits)."""
    in_channels, out_channels, kernel, stride, size = shape
    conv, x = _reference_and_gemm(in_channels, out_channels, kernel, stride, size, impl=impl)
    conv = conv.float()
    x32 = x.detach().float().requires_grad_()
    with torch.autocast("cpu", torch.bfloat16):
        out = conv(x32)
    assert out.dtype == torch.bfloat16
    w64, b64 = conv.weight.detach().double(), conv.bias.detach().double()
    x64 = x.detach().clone().requires_grad_()
    w64.requires_grad_(), b64.requires_grad_()
    expected = F.conv2d(x64, w64, b64, stride=stride)
    scale = expected.abs().max()
    assert (out.double() - expected).abs().max() < 2e-2 * scale
    upstream = torch.randn_like(expected)
    out.backward(upstream.to(out.dtype))
    want = torch.autograd.grad(expected, (x64, w64, b64), upstream)
    got = (x32.grad, conv.weight.grad, conv.bias.grad)
    assert conv.weight.grad.dtype == torch.float32
    for g, w in zip(got, want, strict=False):
        assert (g.double() - w).abs().max() < 3e-2 * w.abs().max()


def test_impl_sets_the_weight_layout_and_keeps_values():
    conv = GemmConv2d(8, 4, 3)
    assert conv.impl == "gemm" and conv.weight.is_contiguous(memory_format=torch.channels_last)
    before = conv.weight.detach().clone()
    conv.set_impl("native")
    assert conv.weight.is_contiguous() and torch.equal(conv.weight, before)
    conv.set_impl("channels_last")
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(conv.weight, before)


# --- a graph of the backward: double backward and torch.func ---------------------------------

TINY_CAPSNET = dict(image_size=12, conv1_channels=8, conv1_kernel=3, primary_types=2,
                    primary_kernel=3, decoder_hidden=(16,))


def test_the_gemm_path_is_twice_differentiable():
    """Second derivatives through the input and through the weights, checked numerically."""
    conv, x = _reference_and_gemm(3, 4, 3, 2, (9, 9))
    assert conv.impl == "gemm"
    assert torch.autograd.gradgradcheck(conv, (x,))
    assert torch.autograd.gradgradcheck(lambda w, b: torch.func.functional_call(
        conv, {"weight": w, "bias": b}, (x.detach(),)), (conv.weight, conv.bias))


def _capsnet_pair():
    """A tiny CapsNet on the GEMM path and the same one on PyTorch's convolution."""
    from capsnet.models import CapsNet, CapsNetConfig
    from capsnet.tuning import SpeedPlan, apply_plan

    torch.manual_seed(0)
    gemm = CapsNet(CapsNetConfig(**TINY_CAPSNET)).double()
    native = CapsNet(CapsNetConfig(**TINY_CAPSNET)).double()
    native.load_state_dict(gemm.state_dict())
    for model, impl in ((gemm, "gemm"), (native, "native")):
        apply_plan(model, SpeedPlan("fp32", {"conv1": impl, "primary_caps.conv": impl}))
    x = torch.rand(3, 1, 12, 12, dtype=torch.float64)
    y = torch.tensor([0, 3, 7])
    return gemm, native, x, y


def test_a_gradient_penalty_through_a_gemm_capsnet_equals_conv2ds():
    """Double backward: the gradient of ||d loss / d x||^2 with respect to the weights."""
    from capsnet.losses import model_loss

    gemm, native, x, y = _capsnet_pair()
    grads = []
    for model in (gemm, native):
        images = x.clone().requires_grad_(True)
        loss = model_loss(model(images, y), images, y)
        (d_images,) = torch.autograd.grad(loss, images, create_graph=True)
        penalty = d_images.square().sum()
        penalty.backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    assert grads[0]["conv1.weight"].abs().sum() > 0
    for name, grad in grads[1].items():
        torch.testing.assert_close(grads[0][name], grad, rtol=1e-9, atol=1e-12)


def test_torch_func_grad_through_a_gemm_capsnet_equals_conv2ds():
    from capsnet.losses import model_loss

    gemm, native, x, y = _capsnet_pair()

    def grads_of(model):
        params = dict(model.named_parameters())

        def loss(p):
            return model_loss(torch.func.functional_call(model, p, (x, y)), x, y)
        return torch.func.grad(loss)(params)

    got, expected = grads_of(gemm), grads_of(native)
    assert got["primary_caps.conv.weight"].abs().sum() > 0
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-9, atol=1e-12)
