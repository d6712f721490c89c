"""Capsules on a grid with weights shared across positions, so that parameters do not grow
with the image's area:

- :class:`ConvCapsules` (SegCaps' locally constrained routing, DeepCaps, EM's ConvCaps): each
  output position routes the kernel x kernel x T_in capsules of its window to its T_out
  parent types; one transformation per (kernel slot, input type, output type).
- :class:`SharedClassCapsules` (EM's class capsules): every capsule of the grid votes for
  every class with its type's matrix, plus its scaled position (Coordinate Addition).

A capsule grid is poses (B, H, W, T, D) and activations (B, H, W, T); the routers are
:mod:`capsnet.routing`'s, each window routed as one fully connected layer."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from capsnet.config import conv_output_size
from capsnet.layers.routed_caps import W_INIT_STD
from capsnet.routing import DynamicRouter, Routed, Router
from capsnet.routing.base import uniform_couplings
from capsnet.routing.dynamic import couplings, uniform_share
from capsnet.squashing import full_precision, squash

GRID_NDIM = 5  # (B, H, W, T, D)
# Coordinate Addition: the vote entries that get the child's scaled row and column.
ROW_ENTRY, COLUMN_ENTRY = 0, 1


def child_activations(poses: torch.Tensor, activations: torch.Tensor | None,
                      router: Router) -> torch.Tensor | None:
    """The activations a router is given: as passed, the poses' lengths for a router that
    needs them (EM) and got none, else None."""
    if activations is not None or not router.needs_activations:
        return activations
    return torch.linalg.vector_norm(poses, dim=-1).clamp(0, 1)


def check_grid(layer: nn.Module, poses: torch.Tensor, types: int, dim: int) -> None:
    """ValueError in one line unless poses is a (B, H, W, types, dim) capsule grid."""
    if poses.dim() != GRID_NDIM or tuple(poses.shape[-2:]) != (types, dim):
        raise ValueError(f"{type(layer).__name__} expects a capsule grid (B, H, W, {types}, "
                         f"{dim}), got {tuple(poses.shape)}")


class ConvCapsules(nn.Module):
    """(B, H, W, T_in, d_in) poses [and (B, H, W, T_in) activations] -> poses
    (B, H', W', T_out, d_out) and activations (B, H', W', T_out), H' as an ``nn.Conv2d`` with
    this kernel, stride and zero padding. W (k*k, T_in, T_out, d_out, d_in), shared across
    positions; padded cells are zero capsules (length and activation 0)."""

    def __init__(self, in_types: int, in_dim: int, out_types: int, out_dim: int, router: Router,
                 kernel: int = 3, stride: int = 1, padding: int = 0,
                 init_std: float = W_INIT_STD):
        super().__init__()
        self.in_types, self.in_dim, self.out_types = in_types, in_dim, out_types
        self.kernel, self.stride, self.padding = kernel, stride, padding
        self.W = nn.Parameter(init_std * torch.randn(kernel * kernel, in_types, out_types,
                                                     out_dim, in_dim))
        self.router = router

    def out_grid(self, height: int, width: int) -> tuple[int, int]:
        return (conv_output_size(height + 2 * self.padding, self.kernel, self.stride),
                conv_output_size(width + 2 * self.padding, self.kernel, self.stride))

    def windows(self, grid: torch.Tensor) -> torch.Tensor:
        """(B, H, W, T, C) -> each output position's window (B, P, k*k, T, C)."""
        B, H, W, T, C = grid.shape
        maps = grid.permute(0, 3, 4, 1, 2).reshape(B, T * C, H, W)  # (B, T*C, H, W)
        cols = F.unfold(maps, self.kernel, padding=self.padding, stride=self.stride)
        cols = cols.view(B, T, C, self.kernel * self.kernel, -1)  # (B, T, C, k*k, P)
        return cols.permute(0, 4, 3, 1, 2)  # (B, P, k*k, T, C)

    def votes(self, poses: torch.Tensor) -> torch.Tensor:
        """(B, H, W, T_in, d_in) -> u_hat (B*P, T_out, k*k*T_in, d_out), children (slot, type)."""
        u = self.windows(poses)  # (B, P, k*k, T_in, d_in)
        B, P, S, T, _ = u.shape
        u_hat = torch.einsum("stjed,bpstd->bpjste", self.W, u)  # (B, P, T_out, k*k, T_in, D)
        return u_hat.reshape(B * P, self.out_types, S * T, -1)  # (B*P, T_out, K, D)

    def forward(self, poses: torch.Tensor,
                activations: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        check_grid(self, poses, self.in_types, self.in_dim)
        B, H, W = poses.shape[:3]
        rows, columns = self.out_grid(H, W)
        with torch.autocast(device_type=poses.device.type, enabled=False):
            poses = full_precision(poses)
            a = child_activations(poses, activations, self.router)  # (B, H, W, T_in) or None
            if a is not None:
                a = self.windows(full_precision(a).unsqueeze(-1))  # (B, P, k*k, T_in, 1)
                a = a.reshape(B * rows * columns, -1)  # (B*P, K)
            routed = self.router(self.votes(poses), a)  # (B*P, T_out, D), (B*P, T_out)
        return (routed.poses.view(B, rows, columns, self.out_types, -1),  # (B, H', W', T, D)
                routed.activations.view(B, rows, columns, self.out_types))  # (B, H', W', T)


def scaled_coordinates(size: int, device: torch.device | None = None) -> torch.Tensor:
    """Cell centres of a grid side scaled to [0, 1]: (g + 0.5) / size, (size,)."""
    return (torch.arange(size, device=device, dtype=torch.float32) + 0.5) / size


class SharedClassCapsules(nn.Module):
    """A capsule grid (B, H, W, T, d_in) [and activations (B, H, W, T)] -> the votes
    u_hat (B, J, H*W*T, d_out) (children position-major, type fastest) and their Routed:
    poses (B, J, d_out), activations (B, J). One W (T, J, d_out, d_in) per child type, shared
    across positions; with ``coordinate_addition`` each vote's entries 0 and 1 get the child's
    scaled row and column (Hinton et al. 2018), so position is not lost, times a learned
    ``coordinate_scale`` that starts at a vote entry's size (init_std sqrt(d_in)): a routed
    sum of I/J votes would otherwise be all coordinates at the start."""

    def __init__(self, in_types: int, in_dim: int, num_classes: int, out_dim: int,
                 router: Router, coordinate_addition: bool = True,
                 init_std: float = W_INIT_STD):
        super().__init__()
        self.in_types, self.in_dim = in_types, in_dim
        self.coordinate_addition = coordinate_addition
        self.W = nn.Parameter(init_std * torch.randn(in_types, num_classes, out_dim, in_dim))
        self.coordinate_scale = nn.Parameter(torch.tensor(init_std * math.sqrt(in_dim)))
        self.router = router

    def votes(self, poses: torch.Tensor) -> torch.Tensor:
        """(B, H, W, T, d_in) -> u_hat (B, J, H*W*T, d_out)."""
        B, H, W, T, _ = poses.shape
        u_hat = torch.einsum("tjed,bhwtd->bjhwte", self.W, poses)  # (B, J, H, W, T, D)
        if self.coordinate_addition:
            offsets = torch.zeros(H, W, 1, u_hat.shape[-1], device=poses.device,
                                  dtype=u_hat.dtype)  # (H, W, 1, D)
            offsets[..., ROW_ENTRY] = scaled_coordinates(H, poses.device)[:, None, None]
            offsets[..., COLUMN_ENTRY] = scaled_coordinates(W, poses.device)[None, :, None]
            u_hat = u_hat + self.coordinate_scale * offsets  # (B, J, H, W, T, D)
        return u_hat.reshape(B, u_hat.shape[1], H * W * T, -1)  # (B, J, I, D)

    def route(self, poses: torch.Tensor,
              activations: torch.Tensor | None = None) -> tuple[torch.Tensor, Routed]:
        """The votes (B, J, I, D) and their routing."""
        check_grid(self, poses, self.in_types, self.in_dim)
        with torch.autocast(device_type=poses.device.type, enabled=False):
            poses = full_precision(poses)
            a = child_activations(poses, activations, self.router)  # (B, H, W, T) or None
            if a is not None:
                a = full_precision(a).reshape(poses.shape[0], -1)  # (B, I)
            u_hat = self.votes(poses)  # (B, J, I, D)
            return u_hat, self.router(u_hat, a)

    def coordinates(self, H: int, W: int, T: int, device: torch.device) -> torch.Tensor:
        """Each child's (row, column) coordinate, children position-major: (H*W*T, 2)."""
        rows = scaled_coordinates(H, device)[:, None].expand(H, W)  # (H, W)
        columns = scaled_coordinates(W, device)[None, :].expand(H, W)  # (H, W)
        grid = torch.stack([rows, columns], dim=-1)  # (H, W, 2)
        return grid[:, :, None].expand(H, W, T, 2).reshape(H * W * T, 2)

    def dynamic_routing(self, poses: torch.Tensor) -> Routed:
        """Procedure 1 without the votes: as ``self.router`` (a DynamicRouter) on
        :meth:`votes`, but W is applied after the coupling-weighted sum over positions and
        to v before the agreements, so memory and time grow with B J I d_in, not with the
        B J I d_out of u_hat (16x less for 1,000 classes at 7x7)."""
        router: DynamicRouter = self.router
        B, H, W, T, d = poses.shape
        J = self.W.shape[1]
        u = poses.reshape(B, H * W, T, d)  # (B, P, T, d)
        xy = (self.coordinates(H, W, T, poses.device).to(poses.dtype) if self.coordinate_addition
              else None)  # (I, 2)
        share = uniform_share(J, router.none_of_the_above)

        def parts(last: bool):
            detach = not (last or router.full_graph)
            pick = (lambda t: t.detach()) if detach else (lambda t: t)
            return pick(u), pick(self.W), pick(self.coordinate_scale)

        b, c_all = None, []
        for r in range(router.iterations):
            last = r == router.iterations - 1
            u_r, W_r, scale_r = parts(last)
            if b is None:
                c = None
                U = u_r.sum(dim=1).unsqueeze(1) * share  # (B, 1, T, d)
                s = torch.einsum("tjed,bxtd->bje", W_r, U)  # (B, J, D)
                if xy is not None:
                    s = s + F.pad(scale_r * share * xy.sum(dim=0), (0, s.shape[-1] - 2))
            else:
                c = couplings(b, router.none_of_the_above)  # (B, J, I)
                U = torch.einsum("bjpt,bptd->bjtd", c.view(B, J, H * W, T), u_r)  # (B,J,T,d)
                s = torch.einsum("tjed,bjtd->bje", W_r, U)  # (B, J, D)
                if xy is not None:
                    s = s + F.pad(scale_r * (c @ xy), (0, s.shape[-1] - 2))  # (B, J, D)
            v = squash(s)  # (B, J, D)
            c_all.append(c)
            if not last:
                w = torch.einsum("tjed,bje->bjtd", W_r, v)  # (B, J, T, d): W^T v
                agreement = torch.einsum("bptd,bjtd->bjpt", u_r, w).reshape(B, J, -1)
                if xy is not None:
                    agreement = agreement + scale_r * (v[..., :2] @ xy.T)  # (B, J, I)
                b = agreement if b is None else b + agreement
        c_all[0] = uniform_couplings(poses.new_empty(B, J, H * W * T, 0), share, v.dtype)
        return Routed(v, torch.linalg.vector_norm(v, dim=-1), tuple(c_all))

    def forward(self, poses: torch.Tensor, activations: torch.Tensor | None = None) -> Routed:
        """Routed class capsules; dynamic routing without materialising the votes."""
        if type(self.router) is not DynamicRouter:
            return self.route(poses, activations)[1]
        check_grid(self, poses, self.in_types, self.in_dim)
        with torch.autocast(device_type=poses.device.type, enabled=False):
            return self.dynamic_routing(full_precision(poses))
