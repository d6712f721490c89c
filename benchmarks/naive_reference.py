"""REFERENCE ONLY: a CapsNet written the way typical public implementations write it.

This is the baseline the benchmarks compare against, not part of capsnet. Same layer sizes
as the paper's model, but in the common style: PrimaryCaps as eight separate convolutions
stacked, u_hat computed by concatenating W once per example and the input once per output
capsule before a broadcast matmul, and routing by elementwise products over expanded
tensors. (The softmax here is over the output capsules, as in the paper, so that both
models do the same arithmetic.)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def naive_squash(s: torch.Tensor, dim: int = -1) -> torch.Tensor:
    squared_norm = (s**2).sum(dim=dim, keepdim=True)
    return squared_norm * s / ((1.0 + squared_norm) * torch.sqrt(squared_norm))


class NaivePrimaryCaps(nn.Module):
    def __init__(self, num_capsules=8, in_channels=256, out_channels=32, kernel_size=9):
        super().__init__()
        self.capsules = nn.ModuleList([
            nn.Conv2d(in_channels, out_channels, kernel_size=kernel_size, stride=2)
            for _ in range(num_capsules)])

    def forward(self, x):
        u = [capsule(x) for capsule in self.capsules]
        u = torch.stack(u, dim=1)
        u = u.view(x.size(0), u.size(1), -1).transpose(1, 2)  # (B, 1152, 8)
        return naive_squash(u)


class NaiveDigitCaps(nn.Module):
    def __init__(self, num_routes=1152, in_channels=8, num_capsules=10, out_channels=16,
                 iterations=3):
        super().__init__()
        self.num_routes, self.num_capsules, self.iterations = num_routes, num_capsules, iterations
        self.W = nn.Parameter(0.01 * torch.randn(1, num_routes, num_capsules, out_channels,
                                                 in_channels))

    def forward(self, x):
        batch_size = x.size(0)
        x = torch.stack([x] * self.num_capsules, dim=2).unsqueeze(4)  # (B, 1152, 10, 8, 1)
        W = torch.cat([self.W] * batch_size, dim=0)  # (B, 1152, 10, 16, 8): W copied per example
        u_hat = torch.matmul(W, x)  # (B, 1152, 10, 16, 1)
        b_ij = torch.zeros(batch_size, self.num_routes, self.num_capsules, 1, device=x.device)
        for iteration in range(self.iterations):
            c_ij = F.softmax(b_ij, dim=2).unsqueeze(4)  # (B, 1152, 10, 1, 1)
            s_j = (c_ij * u_hat).sum(dim=1, keepdim=True)  # (B, 1, 10, 16, 1)
            v_j = naive_squash(s_j, dim=3)
            if iteration < self.iterations - 1:
                a_ij = torch.matmul(u_hat.transpose(3, 4),
                                    torch.cat([v_j] * self.num_routes, dim=1))
                b_ij = b_ij + a_ij.squeeze(4).squeeze(3).unsqueeze(3)
        return v_j.squeeze(1).squeeze(-1)  # (B, 10, 16)


class NaiveDecoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.reconstruction_layers = nn.Sequential(
            nn.Linear(16 * 10, 512), nn.ReLU(inplace=True),
            nn.Linear(512, 1024), nn.ReLU(inplace=True),
            nn.Linear(1024, 784), nn.Sigmoid())

    def forward(self, x, target):
        masked = x * target.unsqueeze(2)
        return self.reconstruction_layers(masked.view(x.size(0), -1)).view(-1, 1, 28, 28)


class NaiveCapsNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv_layer = nn.Conv2d(1, 256, kernel_size=9, stride=1)
        self.primary_capsules = NaivePrimaryCaps()
        self.digit_capsules = NaiveDigitCaps()
        self.decoder = NaiveDecoder()

    def forward(self, data, target):
        output = self.digit_capsules(self.primary_capsules(F.relu(self.conv_layer(data))))
        lengths = torch.sqrt((output**2).sum(dim=2))
        reconstructions = self.decoder(output, target)
        return lengths, reconstructions

    def loss(self, data, lengths, target, reconstructions):
        left = F.relu(0.9 - lengths).view(data.size(0), -1) ** 2
        right = F.relu(lengths - 0.1).view(data.size(0), -1) ** 2
        margin = (target * left + 0.5 * (1.0 - target) * right).sum(dim=1).mean()
        recon = ((reconstructions.view(data.size(0), -1) - data.view(data.size(0), -1)) ** 2)
        return margin + 0.0005 * recon.sum(dim=1).mean()
