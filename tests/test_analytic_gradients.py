"""The autograd Functions of the training step (routing, predictions, losses) against the
autograd graphs they replace: the same values, the same gradients, and gradcheck /
gradgradcheck in float64 (a gradient penalty differentiates their backward too)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from capsnet.layers.decoder import Decoder, Perceptron
from capsnet.layers.routed_caps import Predictions
from capsnet.losses import MarginLoss, SquaredErrorSum, margin_loss, reconstruction_loss
from capsnet.routing.dynamic import DynamicRouter, LastIterationRouting

B, J, I, D, K = 3, 4, 6, 5, 2


def votes(dtype=torch.float64) -> torch.Tensor:
    torch.manual_seed(0)
    return (3 * torch.randn(B, J, I, D, dtype=dtype)).requires_grad_(True)  # (B, J, I, D)


@pytest.mark.parametrize("iterations", [1, 2, 3])
@pytest.mark.parametrize("none_of_the_above", [False, True])
def test_last_iteration_routing_equals_autograd_through_the_loop(iterations, none_of_the_above):
    router = DynamicRouter(iterations, none_of_the_above=none_of_the_above)
    u_hat = votes(torch.float32)
    weights, length_weights = torch.randn(B, J, D), torch.randn(B, J)
    fused = router(u_hat)
    (g_fused,) = torch.autograd.grad((fused.poses * weights).sum()
                                     + (fused.activations * length_weights).sum(), u_hat)
    v, c_all, _ = router.route(u_hat)  # autograd through Procedure 1, the reference
    lengths = torch.linalg.vector_norm(v, dim=-1)  # (B, J)
    (g_loop,) = torch.autograd.grad((v * weights).sum() + (lengths * length_weights).sum(),
                                    u_hat)
    assert torch.equal(fused.poses, v)  # the same forward, bit for bit
    assert torch.equal(fused.activations, lengths)
    for got, expected in zip(fused.couplings[1:], c_all[1:], strict=True):
        assert torch.equal(got, expected)
    torch.testing.assert_close(g_fused, g_loop, rtol=1e-5, atol=1e-7)


def test_one_iteration_routing_passes_gradcheck_and_gradgradcheck():
    """With one iteration nothing is detached: the gradient is the function's own."""
    def poses(u_hat):
        return LastIterationRouting.apply(u_hat, 1, False)[:2]  # v and |v|
    u_hat = votes()
    assert torch.autograd.gradcheck(poses, (u_hat,))
    assert torch.autograd.gradgradcheck(poses, (u_hat,))


def test_a_gradient_penalty_through_routing_equals_autograd_through_the_loop():
    """Three iterations (couplings constant to the gradient, as the loop's detach makes
    them): the gradient of |d loss / d u_hat|^2 by both paths."""
    router = DynamicRouter(3)
    weights = torch.randn(B, J, D, dtype=torch.float64)
    penalties = []
    for poses in (lambda u: router(u).poses, lambda u: router.route(u)[0]):
        u_hat = votes()
        (g,) = torch.autograd.grad((poses(u_hat) * weights).sum(), u_hat, create_graph=True)
        penalties.append(torch.autograd.grad(g.square().sum(), u_hat)[0])
    assert penalties[0].abs().max() > 0
    torch.testing.assert_close(*penalties)


def test_predictions_equal_the_einsum_and_pass_gradcheck():
    torch.manual_seed(1)
    W = torch.randn(I, J, D, K, dtype=torch.float64, requires_grad=True)  # (I, J, D, K)
    u = torch.randn(B, I, K, dtype=torch.float64, requires_grad=True)  # (B, I, K)
    expected = torch.einsum("ijdk,bik->bjid", W, u)  # (B, J, I, D)
    got = Predictions.apply(W, u)
    assert got.shape == (B, J, I, D) and torch.equal(got, expected)
    assert torch.autograd.gradcheck(Predictions.apply, (W, u))
    assert torch.autograd.gradgradcheck(Predictions.apply, (W, u))


def reference_margin_loss(lengths, targets, m_plus=0.9, m_minus=0.1, lam=0.5):
    """Eq. 4 written out, one-hot targets, through autograd."""
    T = F.one_hot(targets, lengths.shape[-1]).to(lengths.dtype)  # (B, J)
    present = T * F.relu(m_plus - lengths).pow(2)
    absent = lam * (1 - T) * F.relu(lengths - m_minus).pow(2)
    return (present + absent).sum(dim=-1).mean()


def test_margin_loss_equals_eq_4_in_value_and_gradient():
    torch.manual_seed(2)
    lengths = torch.rand(8, 10, dtype=torch.float64, requires_grad=True)  # (B, J)
    labels = torch.randint(0, 10, (8,))
    got, expected = margin_loss(lengths, labels), reference_margin_loss(lengths, labels)
    assert torch.equal(got, expected)
    torch.testing.assert_close(torch.autograd.grad(got, lengths)[0],
                               torch.autograd.grad(expected, lengths)[0])
    present = F.one_hot(labels, 10).bool()

    def loss(x):
        return MarginLoss.apply(x, present, 0.9, 0.1, 0.5)[0]
    assert torch.autograd.gradcheck(loss, (lengths,))
    assert torch.autograd.gradgradcheck(loss, (lengths,))


def test_reconstruction_loss_gradient_and_gradcheck():
    torch.manual_seed(3)
    images = torch.rand(4, 1, 5, 5, dtype=torch.float64)
    recon = torch.rand(4, 1, 5, 5, dtype=torch.float64, requires_grad=True)
    got = reconstruction_loss(recon, images)
    expected = (recon.float() - images.float()).flatten(1).pow(2).sum(dim=-1).mean()  # float32
    assert torch.equal(got, expected)
    torch.testing.assert_close(torch.autograd.grad(got, recon)[0],
                               torch.autograd.grad(expected, recon)[0])

    def loss(x):
        return SquaredErrorSum.apply(x, images)[0]
    assert torch.autograd.gradcheck(loss, (recon,))
    assert torch.autograd.gradgradcheck(loss, (recon,))


def test_decoder_equals_autograd_of_its_linear_layers_and_passes_gradgradcheck():
    torch.manual_seed(4)
    decoder = Decoder(num_caps=J, caps_dim=D, hidden=(7, 9), image_shape=(1, 3, 4)).double()
    poses = torch.randn(B, J, D, dtype=torch.float64, requires_grad=True)  # (B, J, D)
    keep = torch.tensor([1, 0, 3])
    inputs = (poses, *decoder.parameters())
    got = decoder(poses, keep)  # (B, 1, 3, 4)
    g = torch.randn_like(got)
    x = poses * F.one_hot(keep, J).unsqueeze(-1)  # (B, J, D) the others zeroed
    expected = decoder.net(x.flatten(1)).view(got.shape)  # autograd through nn.Linear
    assert torch.equal(got, expected)
    for a, b in zip(torch.autograd.grad(got, inputs, g), torch.autograd.grad(expected, inputs, g),
                    strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)

    def pixels(x, *params):
        return Perceptron.apply(x, *params)[0]
    flat = x.detach().flatten(1).requires_grad_(True)  # (B, J*D)
    assert torch.autograd.gradcheck(pixels, (flat, *decoder.parameters()))
    assert torch.autograd.gradgradcheck(pixels, (flat, *decoder.parameters()))
