"""Tiny trained models for the attack tests: a CapsNet and a CNN fit in seconds on the
fake digits of conftest (a class-specific bright bar over noise)."""
from __future__ import annotations

import torch

from capsnet.attacks import prepare_for_attack
from capsnet.losses import model_loss
from capsnet.models import build_model, make_config
from tests.conftest import make_fake_digits

TINY_CAPSNET = {"conv1_channels": 16, "primary_types": 4, "decoder_hidden": (32, 64)}
TINY_CNN = {"conv_channels": (8, 8), "pool": 2, "fc_hidden": (32,), "dropout": 0.0}
TRAIN_STEPS, BATCH, LR = 30, 50, 1e-2
ATTACK_IMAGES = 20  # the images of the `data` fixture (conftest)


def fake_digits(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, 1, 28, 28) float images in [0, 1] and (n,) labels."""
    images, labels = make_fake_digits(n, seed=seed)
    return torch.from_numpy(images).float().div(255).unsqueeze(1), torch.from_numpy(labels).long()


def trained(model_name: str, seed: int = 0, **overrides) -> torch.nn.Module:
    """A tiny model of ``model_name`` trained on 600 fake digits, ready to attack."""
    torch.manual_seed(seed)
    sizes = TINY_CAPSNET if model_name == "capsnet" else TINY_CNN
    model = build_model(make_config(model_name, **{**sizes, **overrides}))
    x, y = fake_digits(600, seed=1)
    optimiser = torch.optim.Adam(model.parameters(), lr=LR)
    model.train()
    for step in range(TRAIN_STEPS):
        idx = torch.arange(step * BATCH, (step + 1) * BATCH) % len(y)
        loss = model_loss(model(x[idx], y[idx]), x[idx], y[idx])
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    return prepare_for_attack(model)
