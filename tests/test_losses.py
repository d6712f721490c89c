"""The margin loss (Eq. 4), the reconstruction loss and their sum, against hand-computed values."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from capsnet.losses import (
    LAMBDA,
    M_MINUS,
    M_PLUS,
    RECONSTRUCTION_WEIGHT,
    capsule_loss,
    margin_loss,
    model_loss,
    reconstruction_loss,
)
from capsnet.models import ModelOutput

# Two examples, three classes.
LENGTHS = torch.tensor([[0.95, 0.30, 0.05],
                        [0.60, 0.80, 0.20]])
LABELS = torch.tensor([0, 1])


def test_paper_constants():
    assert (M_PLUS, M_MINUS, LAMBDA, RECONSTRUCTION_WEIGHT) == (0.9, 0.1, 0.5, 0.0005)


def test_margin_loss_hand_computed():
    # L_k = T_k max(0, 0.9 - |v_k|)^2 + 0.5 (1 - T_k) max(0, |v_k| - 0.1)^2, summed over k.
    # Example 0 (label 0): k=0 present: max(0, 0.9 - 0.95)^2 = 0
    #                      k=1 absent:  0.5 * (0.30 - 0.1)^2 = 0.5 * 0.04 = 0.02
    #                      k=2 absent:  max(0, 0.05 - 0.1) = 0 -> 0          => 0.02
    # Example 1 (label 1): k=0 absent:  0.5 * (0.60 - 0.1)^2 = 0.5 * 0.25 = 0.125
    #                      k=1 present: (0.9 - 0.80)^2 = 0.01
    #                      k=2 absent:  0.5 * (0.20 - 0.1)^2 = 0.5 * 0.01 = 0.005 => 0.14
    # Mean over the batch: (0.02 + 0.14) / 2 = 0.08.
    # (Without the squares it would be (0.1 + 0.4) / 2 = 0.25; averaged over classes 0.0267.)
    loss = margin_loss(LENGTHS, LABELS)
    assert loss.shape == ()
    assert loss.item() == pytest.approx(0.08, abs=1e-6)


def test_margin_loss_lambda_and_margins_are_parameters():
    # lam = 1: example 0: 0.04; example 1: 0.25 + 0.01 + 0.01 = 0.27 => mean 0.155.
    assert margin_loss(LENGTHS, LABELS, lam=1.0).item() == pytest.approx(0.155, abs=1e-6)
    # m+ = 1, m- = 0, lam = 1: example 0: 0.05^2 + 0.3^2 + 0.05^2 = 0.095;
    # example 1: 0.6^2 + 0.2^2 + 0.2^2 = 0.44 => mean 0.2675.
    loss = margin_loss(LENGTHS, LABELS, m_plus=1.0, m_minus=0.0, lam=1.0)
    assert loss.item() == pytest.approx(0.2675, abs=1e-6)


def test_margin_loss_multi_hot_targets():
    # Example 0 has classes {0, 1}: 0 + (0.9 - 0.3)^2 = 0.36, class 2 absent: 0 => 0.36.
    # Example 1 has classes {1, 2}: absent 0: 0.125; present 1: 0.01; present 2: (0.9 - 0.2)^2
    # = 0.49 => 0.625. Mean: 0.4925.
    targets = torch.tensor([[1, 1, 0], [0, 1, 1]])
    assert margin_loss(LENGTHS, targets).item() == pytest.approx(0.4925, abs=1e-6)
    # One-hot targets are the same as class indices.
    one_hot = F.one_hot(LABELS, 3)
    torch.testing.assert_close(margin_loss(LENGTHS, one_hot), margin_loss(LENGTHS, LABELS))


def test_margin_loss_is_zero_when_confident_and_right():
    lengths = torch.tensor([[0.05, 0.95, 0.0]])
    assert margin_loss(lengths, torch.tensor([1])).item() == 0.0


def test_margin_loss_gradient_sign():
    lengths = LENGTHS.clone().requires_grad_(True)
    margin_loss(lengths, LABELS).backward()
    # The loss pushes the labelled capsule (if below m+) up and the others (above m-) down.
    assert lengths.grad[1, 1] < 0
    assert lengths.grad[1, 0] > 0 and lengths.grad[0, 1] > 0
    assert lengths.grad[0, 0] == 0 and lengths.grad[0, 2] == 0


def test_reconstruction_loss_is_a_per_image_sum_averaged_over_the_batch():
    images = torch.rand(2, 1, 28, 28)
    errors = torch.tensor([0.1, 0.2]).view(2, 1, 1, 1)  # a constant error per image
    loss = reconstruction_loss(images + errors, images)
    # Per image: 784 * 0.1^2 = 7.84 and 784 * 0.2^2 = 31.36; batch mean: 19.6.
    assert loss.item() == pytest.approx(19.6, rel=1e-4)
    per_pixel_mean = F.mse_loss(images + errors, images)
    assert loss.item() == pytest.approx(784 * per_pixel_mean.item(), rel=1e-4)


def test_reconstruction_loss_shape_agnostic_and_float32():
    recon = torch.full((3, 1, 4, 4), 0.5, dtype=torch.bfloat16)
    images = torch.zeros(3, 1, 4, 4)
    loss = reconstruction_loss(recon, images)
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(16 * 0.25)


def test_capsule_loss_is_margin_plus_weighted_reconstruction():
    images = torch.rand(2, 1, 28, 28)
    recon = torch.rand(2, 1, 28, 28)
    output = ModelOutput(LENGTHS, torch.zeros(2, 3, 16), recon)
    expected = margin_loss(LENGTHS, LABELS) + 0.0005 * reconstruction_loss(recon, images)
    torch.testing.assert_close(capsule_loss(output, images, LABELS), expected)
    torch.testing.assert_close(model_loss(output, images, LABELS), expected)
    # Weight 0, or no decoder: the margin loss alone.
    torch.testing.assert_close(capsule_loss(output, images, LABELS, reconstruction_weight=0.0),
                               margin_loss(LENGTHS, LABELS))
    no_decoder = ModelOutput(LENGTHS, torch.zeros(2, 3, 16))
    torch.testing.assert_close(capsule_loss(no_decoder, images, LABELS),
                               margin_loss(LENGTHS, LABELS))


def test_model_loss_of_logits_is_cross_entropy():
    logits = torch.randn(4, 10)
    labels = torch.tensor([0, 3, 9, 3])
    output = ModelOutput(torch.softmax(logits, -1), logits=logits, loss="cross_entropy")
    torch.testing.assert_close(model_loss(output, torch.rand(4, 1, 28, 28), labels),
                               F.cross_entropy(logits, labels))


def test_model_loss_names_the_valid_losses():
    with pytest.raises(ValueError, match="choose from margin, spread, cross_entropy"):
        model_loss(ModelOutput(LENGTHS, loss="hinge"), torch.rand(2, 1, 28, 28), LABELS)
