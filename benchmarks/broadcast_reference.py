"""REFERENCE ONLY: a CapsNet written the way the fastest public PyTorch CapsNet we found
writes it (danielhavir/capsule-network on GitHub, MIT licence), re-typed here in that style.

This is a baseline the benchmarks compare against, not part of capsnet. Same layer sizes as
the paper's model. The style: PrimaryCaps as one convolution reshaped into capsules; u_hat
as one broadcast matmul of W (1, J, I, D, K) with the inputs (B, 1, I, K, 1) (no copy of
W per example, but a 5-D matmul of 16x8 by 8x1 blocks); the routing iterations before the
last run on a detached u_hat, by elementwise products over (B, J, I, D) and a sum; the
decoder reconstructs the predicted class; the loss is summed over the batch.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def broadcast_squash(s: torch.Tensor, dim: int = -1) -> torch.Tensor:
    norm2 = (s ** 2).sum(dim=dim, keepdim=True)
    return norm2 / (1 + norm2) * s / (torch.sqrt(norm2) + 1e-8)


class BroadcastPrimaryCaps(nn.Module):
    def __init__(self, in_channels=256, out_channels=256, dim=8, kernel=9, stride=2):
        super().__init__()
        self.dim = dim
        self.conv = nn.Conv2d(in_channels, out_channels, kernel, stride=stride)

    def forward(self, x):
        out = self.conv(x)  # (B, 256, 6, 6)
        return broadcast_squash(out.view(out.size(0), -1, self.dim))  # (B, 1152, 8)


class BroadcastDigitCaps(nn.Module):
    def __init__(self, in_dim=8, in_caps=1152, num_caps=10, dim=16, iterations=3):
        super().__init__()
        self.iterations = iterations
        self.W = nn.Parameter(0.01 * torch.randn(1, num_caps, in_caps, dim, in_dim))

    def forward(self, x):
        B = x.size(0)
        u_hat = torch.matmul(self.W, x.unsqueeze(1).unsqueeze(4)).squeeze(-1)  # (B, J, I, D)
        detached = u_hat.detach()
        b = torch.zeros(B, self.W.size(1), self.W.size(2), 1, device=x.device)  # (B, J, I, 1)
        for _ in range(self.iterations - 1):
            c = F.softmax(b, dim=1)
            v = broadcast_squash((c * detached).sum(dim=2))  # (B, J, D)
            b = b + torch.matmul(detached, v.unsqueeze(-1))  # (B, J, I, 1)
        c = F.softmax(b, dim=1)
        return broadcast_squash((c * u_hat).sum(dim=2))  # (B, J, D)


class BroadcastCapsNet(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.classes = classes
        self.conv1 = nn.Conv2d(1, 256, 9)
        self.primary = BroadcastPrimaryCaps()
        self.digits = BroadcastDigitCaps(num_caps=classes)
        self.decoder = nn.Sequential(
            nn.Linear(16 * classes, 512), nn.ReLU(inplace=True),
            nn.Linear(512, 1024), nn.ReLU(inplace=True),
            nn.Linear(1024, 784), nn.Sigmoid())

    def forward(self, x):
        v = self.digits(self.primary(F.relu(self.conv1(x))))  # (B, 10, 16)
        lengths = torch.norm(v, dim=-1)  # (B, 10)
        mask = torch.eye(self.classes, device=x.device).index_select(0, lengths.argmax(1))
        reconstructions = self.decoder((v * mask.unsqueeze(2)).view(x.size(0), -1))
        return lengths, reconstructions.view(-1, 1, 28, 28)

    @staticmethod
    def loss(images, labels_onehot, lengths, reconstructions):
        present = labels_onehot * F.relu(0.9 - lengths) ** 2
        absent = 0.5 * (1 - labels_onehot) * F.relu(lengths - 0.1) ** 2
        margin = (present + absent).sum()
        return margin + 5e-4 * F.mse_loss(reconstructions, images, reduction="sum")
