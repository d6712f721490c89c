"""Routing made visible: what each routing iteration did for a batch.

    >>> from capsnet.routing_trace import routing_trace
    >>> trace = routing_trace(model, images)  # images: (B, C, H, W) in [0, 1], or uint8
    >>> trace.couplings.shape  # (B, R, J, I): each iteration's couplings
    >>> trace.coupling_maps().shape  # (B, R, J, G, G): mean over the capsule types

The trace runs the model's own layers (``conv1``, ``primary_caps``,
``digit_caps.predictions`` and ``digit_caps.router``, whichever routing algorithm it is)
under ``torch.no_grad()`` in the model's compute precision, so its ``v`` and ``lengths``
are the model's outputs and its couplings the router's own (``Routed.couplings``: c_ij for
dynamic routing, r_ij for inverted-attention routing); the model itself is neither changed
nor slowed (training never calls this).

Primary capsules are indexed type-major, i = (type, row, column), as
:class:`capsnet.layers.PrimaryCaps` lays them out; ``on_grid`` undoes that flattening.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from capsnet.config import CapsNetConfig
from capsnet.data.augment import to_model_input
from capsnet.layers.squash import full_precision
from capsnet.models.precision import autocast_to


@dataclass(frozen=True)
class RoutingTrace:
    """Every routing iteration for a batch of B images; R iterations, J digit capsules,
    I = types * G * G primary capsules. All tensors float32."""

    couplings: torch.Tensor  # (B, R, J, I) used by iteration r (dynamic: iteration 1 is 1/J)
    # (B, R, J, I) u_hat . v after iteration r (the last is unused); None for a router
    # without such a quantity (Router.agreements)
    agreements: torch.Tensor | None
    v: torch.Tensor  # (B, J, D) output poses: the model's own
    lengths: torch.Tensor  # (B, J) the class scores (capsule lengths for dynamic routing)
    primary_lengths: torch.Tensor  # (B, types, G, G) lengths of the primary capsules
    u_hat_norms: torch.Tensor  # (B, J, I) |u_hat_j|i|, the length of each prediction
    routing: str = "dynamic"  # the router's name (capsnet.layers.router.ROUTERS)

    @property
    def iterations(self) -> int:
        return self.couplings.shape[1]

    @property
    def types(self) -> int:
        return self.primary_lengths.shape[1]

    @property
    def grid(self) -> int:
        return self.primary_lengths.shape[-1]

    def on_grid(self, per_capsule: torch.Tensor) -> torch.Tensor:
        """(..., I) over the primary capsules -> (..., types, G, G), type-major as laid out."""
        return per_capsule.unflatten(-1, (self.types, self.grid, self.grid))

    def contributions(self) -> torch.Tensor:
        """(B, R, J, I): |c_ij u_hat_j|i|, how much primary capsule i adds to s_j."""
        return self.couplings * self.u_hat_norms.unsqueeze(1)  # (B, R, J, I)

    def coupling_maps(self) -> torch.Tensor:
        """(B, R, J, G, G): couplings averaged over the capsule types (1/J everywhere in
        iteration 1; 1 where every type at a grid cell sends all its output to capsule j)."""
        return self.on_grid(self.couplings).mean(dim=-3)  # (B, R, J, G, G)

    def support_maps(self) -> torch.Tensor:
        """(B, R, J, G, G): contributions |c u_hat| summed over the capsule types: where
        capsule j's support comes from on the primary grid."""
        return self.on_grid(self.contributions()).sum(dim=-3)  # (B, R, J, G, G)

    def routed_shares(self) -> torch.Tensor:
        """(B, R, J): the share of the primary capsules' output (each weighted by its length)
        that iteration r routes to capsule j; sums to 1 over j, 1/J in iteration 1."""
        weights = self.primary_lengths.flatten(1)  # (B, I)
        routed = torch.einsum("brji,bi->brj", self.couplings, weights)  # (B, R, J)
        total = weights.sum(dim=-1).clamp_min(torch.finfo(weights.dtype).tiny)  # (B,)
        return routed / total[:, None, None]  # (B, R, J)


def receptive_fields(config: CapsNetConfig) -> tuple[list[float], int]:
    """Where the primary grid's cells look in the input: the centre (in input pixel
    coordinates, 0 = the first pixel's centre) of row/column g's receptive field for every
    g < G, and the field's side in pixels. No layer pads, so a cell of PrimaryCaps at g
    sees Conv1 rows g*stride .. g*stride + kernel - 1, Conv1 row r sees input rows
    r*conv1_stride .. r*conv1_stride + conv1_kernel - 1: centres 8, 10, ..., 18 and 17
    pixels for 28x28 (both at Conv1 stride 1)."""
    conv1_centre = (config.conv1_kernel - 1) / 2  # input offset of Conv1's first centre
    primary_centre = (config.primary_kernel - 1) / 2  # Conv1 offset of PrimaryCaps' first
    centres = [(g * config.primary_stride + primary_centre) * config.conv1_stride + conv1_centre
               for g in range(config.primary_grid)]
    side = (config.primary_kernel - 1) * config.conv1_stride + config.conv1_kernel
    return centres, side


@torch.no_grad()
def routing_trace(model: nn.Module, images: torch.Tensor) -> RoutingTrace:
    """Trace the routing of ``model`` (a CapsNet) for ``images``: float (B, C, H, W) in
    [0, 1] as the model takes them, or uint8 (B, H, W) / (B, C, H, W).

    Uses the model's layers in its ``compute_dtype`` (the convolutions under autocast as in
    ``CapsNet.forward``; predictions and routing in float32), so ``v`` and ``lengths`` equal
    the model's outputs for the same batch, whichever router ``model.digit_caps`` holds.
    Raises ValueError for a model without routing.
    """
    if not hasattr(model, "digit_caps") or not hasattr(model, "primary_caps"):
        raise ValueError(f"routing needs a CapsNet; this model is a {type(model).__name__}")
    device = next(model.parameters()).device
    x = images.to(device)
    if x.dtype == torch.uint8:
        x = to_model_input(x)  # (B, C, H, W) in [0, 1]
    B = x.shape[0]
    with autocast_to(device, getattr(model, "compute_dtype", None)):
        h = torch.relu(model.conv1(model.input_norm(x)))  # (B, 256, 20, 20)
        u = model.primary_caps(h)  # (B, I, 8) float32
    router = model.digit_caps.router
    with torch.autocast(device_type=device.type, enabled=False):
        u_hat = model.digit_caps.predictions(full_precision(u))  # (B, J, I, D)
        routed = router(u_hat)
        agreements = router.agreements(u_hat)  # R x (B, J, I), or None
    v = routed.poses  # (B, J, D)
    types, grid = model.primary_caps.types, model.config.primary_grid
    return RoutingTrace(
        couplings=torch.stack(routed.couplings, dim=1).float(),  # (B, R, J, I)
        agreements=None if agreements is None else torch.stack(agreements, dim=1).float(),
        v=v,
        lengths=routed.activations,  # (B, J)
        primary_lengths=torch.linalg.vector_norm(u, dim=-1).view(B, types, grid, grid).float(),
        u_hat_norms=torch.linalg.vector_norm(u_hat, dim=-1).float(),  # (B, J, I)
        routing=router.name,
    )
