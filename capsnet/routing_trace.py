"""Routing made visible: what each routing iteration did for a batch.

    >>> trace = routing_trace(model, images)  # images: (B, C, H, W) in [0, 1], or uint8
    >>> trace.couplings.shape  # (B, R, J, I): each iteration's couplings
    >>> trace.coupling_maps().shape  # (B, R, J, G, G): mean over the capsule types

The trace follows the routing into the class capsules (CapsNet's from its primary capsules
with any router, Efficient-CapsNet's from its primary capsules, the EM model's from
ConvCaps2) by the model's own ``forward_routing`` under no_grad; the registry entry's
``routing_view`` says where the children sit, ``on_grid`` lays them out (types, G, G)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from capsnet.data.image_dataset import to_model_input
from capsnet.models import entry_of, unwrap
from capsnet.models.base import Children


@dataclass(frozen=True)
class RoutingTrace:
    """Every routing iteration of the class-capsule layer for B images: R iterations, J
    classes, I = types * G * G children; float32."""

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
        """(B, R, J, I): coupling times vote weight (|c_ij u_hat_j|i|; r_ij for EM)."""
        return self.couplings * self.vote_weights.unsqueeze(1)  # (B, R, J, I)

    def coupling_maps(self) -> torch.Tensor:
        """(B, R, J, G, G): couplings averaged over the capsule types."""
        return self.on_grid(self.couplings).mean(dim=-3)  # (B, R, J, G, G)

    def support_maps(self) -> torch.Tensor:
        """(B, R, J, G, G): contributions summed over the capsule types."""
        return self.on_grid(self.contributions()).sum(dim=-3)  # (B, R, J, G, G)

    def type_maps(self) -> torch.Tensor:
        """(B, R, J, T): couplings averaged over the grid positions, per capsule type."""
        return self.on_grid(self.couplings).mean(dim=(-2, -1))  # (B, R, J, T)

    def type_support(self) -> torch.Tensor:
        """(B, R, J, T): contributions summed over the grid positions, per capsule type."""
        return self.on_grid(self.contributions()).sum(dim=(-2, -1))  # (B, R, J, T)

    def routed_shares(self) -> torch.Tensor:
        """(B, R, J): the share of the children's output routed to each j (sums to 1)."""
        weights = self.strengths  # (B, I)
        routed = torch.einsum("brji,bi->brj", self.couplings, weights)  # (B, R, J)
        total = weights.sum(dim=-1).clamp_min(torch.finfo(weights.dtype).tiny)  # (B,)
        return routed / total[:, None, None]  # (B, R, J)


def receptive_fields(config) -> tuple[list[float], int]:
    """The centre in input pixels of each grid row/column of the children, and the field's side."""
    children = entry_of(config).routing_view(config)
    return children.centres, children.field


def has_routing(model: nn.Module) -> bool:
    """Whether the model's registry entry has a routing view."""
    config = getattr(unwrap(model), "config", None)
    try:
        return entry_of(config).routing_view is not None
    except TypeError:
        return False


@torch.no_grad()
def routing_trace(model: nn.Module, images: torch.Tensor) -> RoutingTrace:
    """Trace the routing into ``model``'s class capsules for ``images``, float (B, C, H, W)
    in [0, 1] or uint8; ValueError for a model without routing."""
    model = unwrap(model)
    if not has_routing(model):
        raise ValueError(f"routing needs a CapsNet (capsnet, efficient or em); this model is a "
                         f"{type(model).__name__}")
    children = entry_of(model.config).routing_view(model.config)
    device = next(model.parameters()).device
    x = images.to(device)
    if x.dtype == torch.uint8:
        x = to_model_input(x)  # (B, C, H, W) in [0, 1]
    step = model.forward_routing(x)
    votes, activations, routed, router = step.votes, step.activations, step.routed, step.router
    with torch.autocast(device_type=device.type, enabled=False):
        agreements = router.agreements(votes, activations)  # R x (B, J, I), or None
    norms = torch.linalg.vector_norm(votes, dim=-1).float()  # (B, J, I)
    weights = norms if activations is None else activations[:, None].expand_as(norms)
    strengths = (torch.linalg.vector_norm(step.children, dim=-1)
                 if children.strength == "length" else step.children)  # (B, I)
    return RoutingTrace(
        couplings=torch.stack(routed.couplings, dim=1).float(),  # (B, R, J, I)
        agreements=None if agreements is None else torch.stack(agreements, dim=1).float(),
        v=routed.poses,  # (B, J, D)
        scores=routed.activations,  # (B, J)
        strengths=strengths.float(),  # (B, I)
        u_hat_norms=norms,
        vote_weights=weights.float(),
        children=children,
        routing=router.name,
        coupling_symbol=router.coupling_symbol,
        coupling_meaning=router.coupling_meaning,
    )
