"""capsnet's fast path against the naive reference of benchmarks/ and against itself compiled."""
import pytest
import torch

from benchmarks.naive_reference import NaiveCapsNet
from capsnet.losses import capsule_loss
from capsnet.models import CapsNet, CapsNetConfig


def copy_naive_weights(naive: NaiveCapsNet, model: CapsNet) -> None:
    """Give ``model`` the naive model's weights. The naive PrimaryCaps has one conv per
    capsule dimension k, each with one output channel per type t; capsnet's single conv has
    channel t * dim + k."""
    with torch.no_grad():
        model.conv1.load_state_dict(naive.conv_layer.state_dict())
        convs = naive.primary_capsules.capsules
        weight = torch.stack([c.weight for c in convs], dim=1)  # (types, dim, 256, 9, 9)
        bias = torch.stack([c.bias for c in convs], dim=1)  # (types, dim)
        model.primary_caps.conv.weight.copy_(weight.flatten(0, 1))
        model.primary_caps.conv.bias.copy_(bias.flatten())
        model.digit_caps.W.copy_(naive.digit_capsules.W[0])
        model.decoder.net.load_state_dict(naive.decoder.reconstruction_layers.state_dict())


def test_capsnet_matches_naive_reference_outputs_and_gradients():
    torch.manual_seed(0)
    naive = NaiveCapsNet().double()
    # The reference backpropagates through every routing iteration.
    model = CapsNet(CapsNetConfig(routing_full_graph=True)).double()
    copy_naive_weights(naive, model)
    x = torch.rand(3, 1, 28, 28, dtype=torch.float64)
    y = torch.tensor([3, 0, 7])
    onehot = torch.nn.functional.one_hot(y, 10).double()

    lengths, recon = naive(x, onehot)
    naive.loss(x, lengths, onehot, recon).backward()
    out = model(x, y)
    capsule_loss(out, x, y).backward()

    torch.testing.assert_close(out.scores, lengths)
    torch.testing.assert_close(out.reconstructions, recon)
    torch.testing.assert_close(model.digit_caps.W.grad, naive.digit_capsules.W.grad[0])
    torch.testing.assert_close(model.conv1.weight.grad, naive.conv_layer.weight.grad)
    naive_primary_grad = torch.stack([c.weight.grad for c in naive.primary_capsules.capsules], 1)
    torch.testing.assert_close(model.primary_caps.conv.weight.grad,
                               naive_primary_grad.flatten(0, 1))


def tiny_config() -> CapsNetConfig:
    return CapsNetConfig(image_size=12, conv1_channels=8, conv1_kernel=3, primary_types=2,
                         primary_kernel=3, decoder_hidden=(16,))


@pytest.mark.slow
def test_compiled_model_matches_eager_outputs_and_gradients():
    """torch.compile (the --compile fast path) agrees with eager within float tolerance."""
    if not hasattr(torch, "compile"):
        pytest.skip("torch.compile unavailable")
    torch.manual_seed(0)
    eager = CapsNet(tiny_config())
    compiled_model = CapsNet(tiny_config())
    compiled_model.load_state_dict(eager.state_dict())
    compiled = torch.compile(compiled_model)
    x = torch.rand(4, 1, 12, 12)
    y = torch.tensor([1, 2, 3, 4])
    try:
        out_c = compiled(x, y)
    except Exception as exc:  # no C++ toolchain for inductor on this machine
        pytest.skip(f"torch.compile cannot build here: {type(exc).__name__}")
    out_e = eager(x, y)
    capsule_loss(out_e, x, y).backward()
    capsule_loss(out_c, x, y).backward()
    torch.testing.assert_close(out_c.scores, out_e.scores, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out_c.reconstructions, out_e.reconstructions, rtol=1e-4, atol=1e-5)
    for (name, p_e), p_c in zip(eager.named_parameters(), compiled_model.parameters(),
                                strict=False):
        torch.testing.assert_close(p_c.grad, p_e.grad, rtol=1e-3, atol=1e-5, msg=name)
