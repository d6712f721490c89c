"""Matrix capsule layers (Hinton, Sabour & Frosst 2018): primary, convolutional and class
capsules with coordinate addition, routed by EM.

A layer's output is poses (B, H, W, T, 16) (4x4 row-major) and activations (B, H, W, T);
capsule (y, x, t) has the global index (y W + x) T + t. Votes are V_ij = M_i W_ij with W
shared across positions; votes and routing run in float32 under autocast."""
from __future__ import annotations

import math

import torch
from torch import nn

from capsnet.config import conv_output_size
from capsnet.layers.gemm_conv import GemmConv2d
from capsnet.routing import Routed
from capsnet.routing.em import FINAL_LAMBDA, EMRouter
from capsnet.squashing import full_precision

POSE_SIDE = 4  # 4x4 pose matrices
POSE_SIZE = POSE_SIDE * POSE_SIDE
# Initial transformations: entries of variance 1/POSE_SIDE, so that a vote (a sum of
# POSE_SIDE products) has the scale of the pose it transforms.
W_INIT_STD = 1 / math.sqrt(POSE_SIDE)
# Coordinate addition: the "first two elements of the right-hand column" of a vote matrix,
# (row 0, last column) and (row 1, last column), flattened row-major.
ROW_SLOT, COLUMN_SLOT = POSE_SIDE - 1, 2 * POSE_SIDE - 1


class PrimaryMatrixCaps(nn.Module):
    """A 1x1 convolution giving ``types`` capsules a position (16 pose units, one logistic
    activation). (B, C_in, H, W) -> poses (B, H, W, types, 16), activations (B, H, W, types)."""

    def __init__(self, in_channels: int, types: int):
        super().__init__()
        self.types = types
        self.conv = GemmConv2d(in_channels, types * (POSE_SIZE + 1), kernel_size=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, _, H, W = x.shape
        T = self.types
        out = full_precision(self.conv(x)).permute(0, 2, 3, 1)  # (B, H, W, T*17)
        poses = out[..., :T * POSE_SIZE].reshape(B, H, W, T, POSE_SIZE)  # (B, 12, 12, 32, 16)
        activations = torch.sigmoid(out[..., T * POSE_SIZE:])  # (B, 12, 12, 32)
        return poses, activations

    @torch.no_grad()
    def scale_poses(self, factor: float) -> None:
        """Multiply the pose units' weights and biases by ``factor``."""
        pose_channels = self.types * POSE_SIZE
        self.conv.weight[:pose_channels] *= factor
        self.conv.bias[:pose_channels] *= factor


def window_children(grid: int, kernel: int, stride: int, types: int) -> torch.Tensor:
    """Global child index of every window slot: (G'^2, kernel^2 types)."""
    out = conv_output_size(grid, kernel, stride)
    start = torch.arange(out) * stride  # (G',) first row (column) of each window
    offset = torch.arange(kernel)  # (k,)
    rows = (start[:, None] + offset[None, :])  # (G', k) the rows each window covers
    cells = rows[:, None, :, None] * grid + rows[None, :, None, :]  # (G', G', k, k)
    t = torch.arange(types)  # (T,)
    index = cells[..., None] * types + t  # (G', G', k, k, T)
    return index.reshape(out * out, kernel * kernel * types)  # (P, K)


class ConvMatrixCaps(nn.Module):
    """Convolutional capsules: each parent gets votes from the kernel x kernel x ``in_types``
    children of its window, transformations shared across positions; EM routing normalises
    each child's assignments over all its parents.
    (B, G, G, T_in, 16), (B, G, G, T_in) -> (B, G', G', T_out, 16), (B, G', G', T_out)."""

    def __init__(self, in_types: int, out_types: int, kernel: int, stride: int, grid: int,
                 iterations: int = 3, final_lambda: float = FINAL_LAMBDA):
        super().__init__()
        self.in_types, self.out_types, self.grid = in_types, out_types, grid
        self.out_grid = conv_output_size(grid, kernel, stride)
        K = kernel * kernel * in_types
        self.W = nn.Parameter(W_INIT_STD * torch.randn(K, out_types, POSE_SIDE, POSE_SIDE))
        self.router = EMRouter(out_types, iterations, final_lambda)
        windows = window_children(grid, kernel, stride, in_types)  # (P, K)
        P = windows.shape[0]
        # the parents are laid out (position, type): parent (p, c) sees window p
        children = windows[:, None, :].expand(P, out_types, K).reshape(P * out_types, K)
        self.register_buffer("windows", windows, persistent=False)  # (P, K)
        self.register_buffer("slot_children", children, persistent=False)  # (J, K)

    @property
    def num_children(self) -> int:
        return self.grid * self.grid * self.in_types

    def votes(self, poses: torch.Tensor) -> torch.Tensor:
        """V_ij = M_i W_ij: poses (B, G, G, T_in, 16) -> votes (B, J = P T_out, K, 16)."""
        B = poses.shape[0]
        M = poses.reshape(B, self.num_children, POSE_SIDE, POSE_SIDE)  # (B, N, 4, 4)
        M = M[:, self.windows]  # (B, P, K, 4, 4): each window's children
        V = torch.einsum("bpkxy,kcyz->bpckxz", M, self.W)  # (B, P, T_out, K, 4, 4)
        return V.reshape(B, -1, self.windows.shape[1], POSE_SIZE)  # (B, J, K, 16)

    def forward(self, poses: torch.Tensor,
                activations: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, G = poses.shape[0], self.out_grid
        with torch.autocast(device_type=poses.device.type, enabled=False):
            poses, activations = full_precision(poses), full_precision(activations)
            V = self.votes(poses)  # (B, J, K, 16)
            a = activations.reshape(B, self.num_children)  # (B, N)
            routed = self.router(V, a, self.slot_children, self.num_children)
        return (routed.poses.reshape(B, G, G, self.out_types, POSE_SIZE),  # (B, G', G', T, 16)
                routed.activations.reshape(B, G, G, self.out_types))  # (B, G', G', T)


class ClassCapsules(nn.Module):
    """One capsule per class from every capsule of the last convolutional layer, one
    transformation per (child type, class), with Coordinate Addition of ``coordinates`` (G,).
    (B, G, G, T, 16), (B, G, G, T) -> votes, activations and their :class:`Routed`."""

    def __init__(self, in_types: int, num_classes: int, coordinates: tuple[float, ...],
                 iterations: int = 3, final_lambda: float = FINAL_LAMBDA):
        super().__init__()
        self.W = nn.Parameter(W_INIT_STD * torch.randn(in_types, num_classes, POSE_SIDE,
                                                       POSE_SIDE))
        self.router = EMRouter(num_classes, iterations, final_lambda)
        scaled = torch.tensor(coordinates, dtype=torch.float32)  # (G,)
        G = scaled.shape[0]
        offsets = torch.zeros(G, G, POSE_SIZE)  # (G, G, 16): one per child position
        offsets[:, :, ROW_SLOT] = scaled[:, None]  # the row's coordinate
        offsets[:, :, COLUMN_SLOT] = scaled[None, :]  # the column's
        self.register_buffer("offsets", offsets.view(G * G, POSE_SIZE), persistent=False)

    def votes(self, poses: torch.Tensor) -> torch.Tensor:
        """V_ij = M_i W_type(i),j + coordinates: (B, G, G, T, 16) -> (B, J, G*G*T, 16)."""
        B, G, _, T, _ = poses.shape
        M = poses.reshape(B, G * G, T, POSE_SIDE, POSE_SIDE)  # (B, P, T, 4, 4)
        V = torch.einsum("bptxy,tjyz->bjptxz", M, self.W)  # (B, J, P, T, 4, 4)
        V = V.reshape(B, -1, G * G, T, POSE_SIZE) + self.offsets[:, None, :]  # (B, J, P, T, 16)
        return V.reshape(B, V.shape[1], G * G * T, POSE_SIZE)  # (B, 10, 144, 16)

    def forward(self, poses: torch.Tensor,
                activations: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Routed]:
        """The votes (B, J, I, 16), the children's activations (B, I) and their routing:
        poses (B, classes, 16), activations (B, classes)."""
        with torch.autocast(device_type=poses.device.type, enabled=False):
            poses, activations = full_precision(poses), full_precision(activations)
            V = self.votes(poses)  # (B, J, I, 16)
            a = activations.reshape(activations.shape[0], -1)  # (B, I)
            return V, a, self.router(V, a)
