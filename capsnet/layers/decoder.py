"""The reconstruction decoder: masked DigitCaps output -> FC ReLU layers -> sigmoid pixels."""
from __future__ import annotations

import torch
from torch import nn


class Decoder(nn.Module):
    """Poses (B, J, D) and the capsule to keep (B,) or a mask (B, J) -> images (B, C, H, W)
    in [0, 1]; the other capsules are zeroed, as in the paper's Figure 2."""

    def __init__(self, num_caps: int, caps_dim: int, hidden: tuple[int, ...],
                 image_shape: tuple[int, int, int]):
        super().__init__()
        self.image_shape = image_shape
        sizes = (num_caps * caps_dim, *hidden)
        layers: list[nn.Module] = []
        for n_in, n_out in zip(sizes[:-1], sizes[1:], strict=False):
            layers += [nn.Linear(n_in, n_out), nn.ReLU(inplace=True)]
        n_pixels = image_shape[0] * image_shape[1] * image_shape[2]
        layers += [nn.Linear(sizes[-1], n_pixels), nn.Sigmoid()]
        self.net = nn.Sequential(*layers)

    def forward(self, poses: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        B, J, _ = poses.shape
        if keep.dim() == 1:  # class indices -> a (B, J) mask, with no host sync
            keep = torch.arange(J, device=keep.device) == keep.unsqueeze(-1)
        masked = poses * keep.unsqueeze(-1)  # (B, J, D), the mask 0/1 in poses' dtype
        pixels = self.net(masked.reshape(B, -1))  # (B, C*H*W)
        return pixels.view(B, *self.image_shape)  # (B, C, H, W)
