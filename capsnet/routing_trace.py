"""Routing made visible: what each routing iteration did for a batch.

    >>> from capsnet.routing_trace import routing_trace
    >>> trace = routing_trace(model, images)  # images: (B, C, H, W) in [0, 1], or uint8
    >>> trace.couplings.shape  # (B, R, J, I): each iteration's couplings
    >>> trace.coupling_maps().shape  # (B, R, J, G, G): mean over the capsule types

The trace follows the routing into a model's class capsules, whichever model and router:

- CapsNet (``--model capsnet``, any ``--routing``): primary capsules -> DigitCaps; the
  couplings are the router's own (c_ij for dynamic routing, r_ij for inverted attention, C_ij
  for self-attention);
- Efficient-CapsNet (``--model efficient``): its primary capsules -> class capsules by
  self-attention routing, C_ij (one pass: one "iteration");
- matrix capsules with EM routing (``--model em``): ConvCaps2's capsules -> class capsules,
  the assignments R_ij of each M-step. The convolutional capsule layers below route too;
  the trace shows the class-capsule layer's, where the classes compete.

:func:`class_layer` takes each model to what the trace needs (one small function per model,
registered by the model's class): the votes for the class capsules, the children's
activations where the router takes them, their strengths, the router and where the children
sit (:class:`Children`: types on a grid, receptive fields). The trace runs the model's own
layers under ``torch.no_grad()`` in the model's compute precision, so its ``v`` and
``scores`` are the model's outputs and its couplings the router's own
(``Routed.couplings``); the model itself is neither changed nor slowed (training never
calls this).

Children are indexed as the model lays them out: CapsNet's primary capsules type-major,
i = (type, row, column); Efficient-CapsNet's and the EM model's position-major, i = (row,
column, type). ``on_grid`` undoes either flattening to (types, G, G).
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from capsnet.config import CapsNetConfig
from capsnet.data.augment import to_model_input
from capsnet.layers.squash import full_precision
from capsnet.models import CapsNet, EfficientCapsNet, EMCapsNet, unwrap
from capsnet.models.precision import autocast_to
from capsnet.routing import Router

TYPE_MAJOR, POSITION_MAJOR = "type-major", "position-major"


@dataclass(frozen=True)
class Children:
    """The children of a model's class-capsule layer: ``types`` capsule types on a G x G
    grid, flattened ``order`` (TYPE_MAJOR or POSITION_MAJOR), each grid row/column's
    receptive-field centre in input pixels and the field's side, the layer's name and
    what a child's strength is ('length' of a vector capsule or 'activation')."""

    types: int
    grid: int
    order: str
    centres: list[float]
    field: int
    name: str  # "primary" (CapsNet, Efficient-CapsNet) or "ConvCaps2" (EM)
    strength: str  # "length" or "activation"

    def on_grid(self, per_child: torch.Tensor) -> torch.Tensor:
        """(..., I) over the children -> (..., types, G, G)."""
        if self.order == TYPE_MAJOR:
            return per_child.unflatten(-1, (self.types, self.grid, self.grid))
        return per_child.unflatten(-1, (self.grid, self.grid, self.types)).movedim(-1, -3)


@dataclass(frozen=True)
class RoutingTrace:
    """Every routing iteration of the class-capsule layer for a batch of B images; R
    iterations, J class capsules, I = types * G * G children. All tensors float32."""

    couplings: torch.Tensor  # (B, R, J, I) used by iteration r (Routed.couplings)
    # (B, R, J, I) u_hat . v after iteration r (the last is unused); None for a router
    # without such a quantity (Router.agreements)
    agreements: torch.Tensor | None
    v: torch.Tensor  # (B, J, D) output poses: the model's own
    scores: torch.Tensor  # (B, J) the class scores (capsule lengths, EM activations)
    strengths: torch.Tensor  # (B, I) the children's lengths (vector capsules) or activations
    u_hat_norms: torch.Tensor  # (B, J, I) |u_hat_j|i|, the length of each vote
    # (B, J, I) what a vote weighs in its parent besides its coupling: its length |u_hat|
    # for vector capsules, the child's activation a_i for EM (r_ij = R_ij a_i)
    vote_weights: torch.Tensor
    children: Children
    routing: str = "dynamic"  # the router's name (capsnet.routing.ROUTERS)
    coupling_symbol: str = "c"  # Router.coupling_symbol
    coupling_meaning: str = ""  # Router.coupling_meaning

    @property
    def iterations(self) -> int:
        return self.couplings.shape[1]

    @property
    def types(self) -> int:
        return self.children.types

    @property
    def grid(self) -> int:
        return self.children.grid

    @property
    def primary_lengths(self) -> torch.Tensor:
        """(B, types, G, G) the children's strengths on their grid (CapsNet: the primary
        capsules' lengths)."""
        return self.on_grid(self.strengths)

    def on_grid(self, per_child: torch.Tensor) -> torch.Tensor:
        """(..., I) over the children -> (..., types, G, G)."""
        return self.children.on_grid(per_child)

    @property
    def support_label(self) -> str:
        """How figures name :meth:`contributions`: |c·û| for vector capsules, R·a for EM."""
        symbol = self.coupling_symbol
        if self.children.strength == "activation":
            return f"{symbol}\u00b7a"
        return f"|{symbol}\u00b7\u00fb|"

    def contributions(self) -> torch.Tensor:
        """(B, R, J, I): coupling times vote weight, how much child i adds to capsule j
        (|c_ij u_hat_j|i| for vector capsules; r_ij = R_ij a_i for EM)."""
        return self.couplings * self.vote_weights.unsqueeze(1)  # (B, R, J, I)

    def coupling_maps(self) -> torch.Tensor:
        """(B, R, J, G, G): couplings averaged over the capsule types (1/J everywhere in
        a uniform first iteration; 1 where every type at a grid cell sends all its output
        to capsule j)."""
        return self.on_grid(self.couplings).mean(dim=-3)  # (B, R, J, G, G)

    def support_maps(self) -> torch.Tensor:
        """(B, R, J, G, G): contributions summed over the capsule types: where capsule j's
        support comes from on the children's grid."""
        return self.on_grid(self.contributions()).sum(dim=-3)  # (B, R, J, G, G)

    def type_maps(self) -> torch.Tensor:
        """(B, R, J, T): couplings averaged over the grid positions, per capsule type."""
        return self.on_grid(self.couplings).mean(dim=(-2, -1))  # (B, R, J, T)

    def type_support(self) -> torch.Tensor:
        """(B, R, J, T): contributions summed over the grid positions, per capsule type."""
        return self.on_grid(self.contributions()).sum(dim=(-2, -1))  # (B, R, J, T)

    def routed_shares(self) -> torch.Tensor:
        """(B, R, J): the share of the children's output (each weighted by its strength)
        that iteration r routes to capsule j; sums to 1 over j (1/J where uniform)."""
        weights = self.strengths  # (B, I)
        routed = torch.einsum("brji,bi->brj", self.couplings, weights)  # (B, R, J)
        total = weights.sum(dim=-1).clamp_min(torch.finfo(weights.dtype).tiny)  # (B,)
        return routed / total[:, None, None]  # (B, R, J)


def stack_fields(layers: Sequence[tuple[int, int]], grid: int) -> tuple[list[float], int]:
    """Where the cells of the last of a stack of unpadded layers ((kernel, stride), input
    first) look in the input: the centre (input pixel coordinates, 0 = the first pixel's
    centre) of row/column g's receptive field for every g < ``grid``, and its side."""
    centres = []
    for g in range(grid):
        centre = float(g)
        for kernel, stride in reversed(layers):
            centre = centre * stride + (kernel - 1) / 2  # in the layer's input
        centres.append(centre)
    side = 1
    for kernel, stride in reversed(layers):
        side = (side - 1) * stride + kernel
    return centres, side


def receptive_fields(config: CapsNetConfig) -> tuple[list[float], int]:
    """CapsNet's primary grid in the input: centres 8, 10, ..., 18 and 17 pixels for 28x28
    (both at Conv1 stride 1; :func:`stack_fields` over Conv1 and PrimaryCaps)."""
    layers = ((config.conv1_kernel, config.conv1_stride),
              (config.primary_kernel, config.primary_stride))
    return stack_fields(layers, config.primary_grid)


class ClassLayer(NamedTuple):
    """What a trace needs of a model's class-capsule layer for a batch."""

    votes: torch.Tensor  # (B, J, I, D) float32
    activations: torch.Tensor | None  # (B, I) the children's, where the router takes them
    strengths: torch.Tensor  # (B, I) the children's lengths or activations
    router: Router
    children: Children


@functools.singledispatch
def class_layer(model: nn.Module, x: torch.Tensor) -> ClassLayer:
    """The class-capsule layer of ``model`` for float images ``x`` (B, C, H, W) in [0, 1]:
    one implementation per model class (registered below). Convolutions run under the
    model's autocast, votes in float32 as in its forward."""
    raise ValueError(f"routing needs a CapsNet (capsnet, efficient or em); this model is a "
                     f"{type(model).__name__}")


@class_layer.register
def _capsnet(model: CapsNet, x: torch.Tensor) -> ClassLayer:
    with autocast_to(x.device, model.compute_dtype):
        h = torch.relu(model.conv1(model.input_norm(x)))  # (B, 256, 20, 20)
        u = model.primary_caps(h)  # (B, I, 8) float32, type-major
    with torch.autocast(device_type=x.device.type, enabled=False):
        u_hat = model.digit_caps.predictions(full_precision(u))  # (B, J, I, D)
    children = Children(model.primary_caps.types, model.config.primary_grid, TYPE_MAJOR,
                        *receptive_fields(model.config), "primary", "length")
    return ClassLayer(u_hat, None, torch.linalg.vector_norm(u, dim=-1),
                      model.digit_caps.router, children)


@class_layer.register
def _efficient(model: EfficientCapsNet, x: torch.Tensor) -> ClassLayer:
    cfg = model.config
    with autocast_to(x.device, model.compute_dtype):
        u = model.primary_caps(model.features(x))  # (B, I, 8) float32, position-major
    with torch.autocast(device_type=x.device.type, enabled=False):
        u_hat = model.class_caps.predictions(full_precision(u))  # (B, J, I, D)
    layers = [*zip(cfg.conv_kernels, cfg.conv_strides, strict=True), (cfg.primary_kernel, 1)]
    children = Children(cfg.conv_channels[-1] // cfg.primary_dim, cfg.primary_grid,
                        POSITION_MAJOR, *stack_fields(layers, cfg.primary_grid), "primary",
                        "length")
    return ClassLayer(u_hat, None, torch.linalg.vector_norm(u, dim=-1),
                      model.class_caps.router, children)


@class_layer.register
def _em(model: EMCapsNet, x: torch.Tensor) -> ClassLayer:
    cfg = model.config
    with autocast_to(x.device, model.compute_dtype):
        h = torch.relu(model.conv1(model.input_norm(x)))  # (B, A, 12, 12)
        poses, a = model.primary_caps(h)  # (B, 12, 12, B_types, 16), (B, 12, 12, B_types)
        poses, a = model.conv_caps1(poses, a)  # (B, 5, 5, C, 16), (B, 5, 5, C)
        poses, a = model.conv_caps2(poses, a)  # (B, 3, 3, D, 16), (B, 3, 3, D)
    with torch.autocast(device_type=x.device.type, enabled=False):
        votes = model.class_caps.votes(full_precision(poses))  # (B, J, I, 16)
    a = full_precision(a).flatten(1)  # (B, I) position-major
    children = Children(cfg.caps2_types, cfg.caps2_grid, POSITION_MAJOR,
                        *stack_fields(cfg.layers, cfg.caps2_grid), "ConvCaps2", "activation")
    return ClassLayer(votes, a, a, model.class_caps.router, children)


def has_routing(model: nn.Module) -> bool:
    """Whether :func:`routing_trace` can follow ``model``'s routing (a :func:`class_layer`
    is registered for its class)."""
    return class_layer.dispatch(type(unwrap(model))) is not class_layer.dispatch(object)


@torch.no_grad()
def routing_trace(model: nn.Module, images: torch.Tensor) -> RoutingTrace:
    """Trace the routing into the class capsules of ``model`` (CapsNet with any router,
    Efficient-CapsNet or the EM model) for ``images``: float (B, C, H, W) in [0, 1] as the
    model takes them, or uint8 (B, H, W) / (B, C, H, W).

    ``v`` and ``scores`` equal the model's outputs for the same batch. Raises ValueError
    for a model without routing.
    """
    model = unwrap(model)
    device = next(model.parameters()).device
    x = images.to(device)
    if x.dtype == torch.uint8:
        x = to_model_input(x)  # (B, C, H, W) in [0, 1]
    layer = class_layer(model, x)
    router = layer.router
    with torch.autocast(device_type=device.type, enabled=False):
        routed = router(layer.votes, layer.activations)
        agreements = router.agreements(layer.votes, layer.activations)  # R x (B, J, I), or None
    norms = torch.linalg.vector_norm(layer.votes, dim=-1).float()  # (B, J, I)
    weights = norms if layer.activations is None else layer.activations[:, None].expand_as(norms)
    return RoutingTrace(
        couplings=torch.stack(routed.couplings, dim=1).float(),  # (B, R, J, I)
        agreements=None if agreements is None else torch.stack(agreements, dim=1).float(),
        v=routed.poses,  # (B, J, D)
        scores=routed.activations,  # (B, J)
        strengths=layer.strengths.float(),  # (B, I)
        u_hat_norms=norms,
        vote_weights=weights.float(),
        children=layer.children,
        routing=router.name,
        coupling_symbol=router.coupling_symbol,
        coupling_meaning=router.coupling_meaning,
    )
