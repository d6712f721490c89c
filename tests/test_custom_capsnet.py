"""A capsule network of your own from the top-level names: 3x64x48 (non-square) colour
images, 5 classes, trained in a plain PyTorch loop."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import capsnet

CLASSES, CHANNELS, HEIGHT, WIDTH = 5, 3, 64, 48
STEPS, BATCH = 30, 16


class ShapesCapsNet(nn.Module):
    """Conv -> PrimaryCaps -> DigitCaps (dynamic routing) -> Decoder, at 3x64x48."""

    def __init__(self, lazy: bool):
        super().__init__()
        self.conv1 = nn.Conv2d(CHANNELS, 16, kernel_size=9, stride=2)  # (B, 16, 28, 20)
        self.primary = capsnet.PrimaryCaps(16, types=8, dim=8, kernel=9, stride=2)  # (B, 480, 8)
        router = capsnet.DynamicRouter(iterations=3)
        self.digits = (capsnet.LazyDigitCaps(8, CLASSES, 16, router) if lazy else
                       capsnet.DigitCaps(self.primary.num_capsules(28, 20), 8, CLASSES, 16, router))
        self.decoder = capsnet.Decoder(CLASSES, 16, (64, 128), (CHANNELS, HEIGHT, WIDTH))

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None):
        u = self.primary(torch.relu(self.conv1(x)))  # (B, 480, 8)
        routed = self.digits(u)  # poses (B, 5, 16), activations (B, 5)
        keep = labels if labels is not None else routed.activations.argmax(dim=-1)  # (B,)
        return capsnet.ModelOutput(routed.activations, routed.poses,  # (B, 5), (B, 5, 16)
                                   self.decoder(routed.poses, keep))  # (B, 3, 64, 48)


def coloured_blocks(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Class k: a bright block in the k-th band of rows, in colour k % 3, on noise."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % CLASSES  # (n,)
    images = 0.2 * torch.rand(n, CHANNELS, HEIGHT, WIDTH, generator=g)  # (n, 3, 64, 48)
    band = HEIGHT // CLASSES
    for i, k in enumerate(labels.tolist()):
        images[i, k % CHANNELS, k * band:(k + 1) * band, 8:40] = 1.0
    return images, labels


@pytest.mark.parametrize("lazy", [True, False])
def test_the_capsule_count_is_read_or_computed_alike(lazy):
    model = ShapesCapsNet(lazy)
    out = model(torch.rand(2, CHANNELS, HEIGHT, WIDTH))
    assert out.scores.shape == (2, CLASSES)
    assert out.reconstructions.shape == (2, CHANNELS, HEIGHT, WIDTH)
    assert model.digits.W.shape == (8 * 10 * 6, CLASSES, 16, 8)  # 8 types on a 10 x 6 grid


def test_own_capsule_net_on_non_square_colour_images_learns():
    torch.manual_seed(0)
    images, labels = coloured_blocks(4 * BATCH)
    model = ShapesCapsNet(lazy=True)
    model(images[:2])  # the lazy layer reads its input count here, before the optimiser is made
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for step in range(STEPS):
        batch = slice((step * BATCH) % len(images), (step * BATCH) % len(images) + BATCH)
        x, y = images[batch], labels[batch]
        loss = capsnet.model_loss(model(x, y), x, y)  # margin + 0.0005 x reconstruction
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    assert last < 0.5 * first, losses
    with torch.no_grad():
        scores = model(images).scores
    assert (scores.argmax(-1) == labels).float().mean() > 0.9


def test_a_wrong_input_size_is_one_line_naming_the_expected_shape():
    model = ShapesCapsNet(lazy=False)
    with pytest.raises(ValueError, match=r"DigitCaps expects input capsules \(B, 480, 8\), got "
                                         r"\(2, 800, 8\)"):
        model(torch.rand(2, CHANNELS, HEIGHT, HEIGHT))  # square 64x64: 8 x 10 x 10 capsules
    with pytest.raises(ValueError, match=r"PrimaryCaps expects feature maps \(B, 16, H, W\)"):
        model.primary(torch.rand(2, CHANNELS, HEIGHT, WIDTH))
