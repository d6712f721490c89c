"""Routing algorithms: one contract, one module per algorithm, one registry by name.

Every algorithm is a :class:`Router` whose ``forward(u_hat, activations)`` returns a
:class:`Routed`; :data:`ROUTERS` names them for ``CapsNetConfig.routing`` / ``--routing``.
A model builds one with ``router_class(name).from_config(config, children=I, parents=J,
pose_dim=D)``: ``dynamic`` (Sabour et al. 2017), ``inverted-attention`` (Tsai et al. 2020),
``self-attention`` (Mazzia et al. 2021), ``em`` (Hinton et al. 2018).

Shapes (B batch, J parents, I children seen by each parent, D pose size):
``u_hat`` (B, J, I, D) child i's prediction of parent j; ``activations`` (B, I) or None;
``children`` None when every parent sees the same I children, else (J, I) global child
indices (convolutional capsule layers); ``Routed.couplings`` one (B, J, I) per iteration."""
from __future__ import annotations

from typing import ClassVar, NamedTuple

import torch
from torch import nn


class Routed(NamedTuple):
    """What every router returns."""

    poses: torch.Tensor  # (B, J, D) parent poses (vectors; flattened 4x4 matrices for EM)
    activations: torch.Tensor  # (B, J) parent activations in [0, 1] (lengths for vectors)
    couplings: tuple[torch.Tensor, ...]  # per iteration, (B, J, I) child i's share to parent j


class Router(nn.Module):
    """Base class: subclasses set :attr:`name` and implement :meth:`from_config` and
    :meth:`forward`; :meth:`agreements` is optional (traces only)."""

    name: ClassVar[str] = ""
    # How traces and figures name the couplings (Routed.couplings): a symbol and a line on
    # what they are for this algorithm.
    coupling_symbol: ClassVar[str] = "c"
    coupling_meaning: ClassVar[str] = ("the share of each child's prediction that each parent "
                                       "received")

    @classmethod
    def from_config(cls, config, *, children: int, parents: int,
                    pose_dim: int) -> Router:  # pragma: no cover - abstract
        """The router of a layer of ``children`` inputs and ``parents`` outputs of ``pose_dim``."""
        raise NotImplementedError

    def forward(self, u_hat: torch.Tensor, activations: torch.Tensor | None = None,
                children: torch.Tensor | None = None,
                num_children: int | None = None) -> Routed:  # pragma: no cover - abstract
        raise NotImplementedError

    def agreements(self, u_hat: torch.Tensor,
                   activations: torch.Tensor | None = None) -> tuple[torch.Tensor, ...] | None:
        """Per iteration, (B, J, I) how well child i agreed with parent j; None where undefined."""
        return None


def uniform_couplings(u_hat: torch.Tensor, share: float,
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(B, J, I) couplings all equal to ``share``, a view of one number."""
    B, J, I = u_hat.shape[:3]
    return torch.full((1, 1, 1), share, dtype=dtype, device=u_hat.device).expand(B, J, I)


def fully_connected_only(router: Router, children: torch.Tensor | None) -> None:
    """ValueError unless every parent sees the same children (``children`` is None)."""
    if children is not None:
        raise ValueError(f"{router.name} routing is implemented for fully connected capsule "
                         f"layers only (children=None)")


# The algorithms import the contract above, so they are imported after it.
from capsnet.routing.dynamic import DynamicRouter  # noqa: E402
from capsnet.routing.em import EMRouter  # noqa: E402
from capsnet.routing.inverted_attention import InvertedAttentionRouter  # noqa: E402
from capsnet.routing.self_attention import SelfAttentionRouter  # noqa: E402

ROUTERS: dict[str, type[Router]] = {cls.name: cls for cls in (
    DynamicRouter, InvertedAttentionRouter, SelfAttentionRouter, EMRouter)}


def router_class(name: str) -> type[Router]:
    """The router named ``name``; a ValueError naming the choices otherwise."""
    if name not in ROUTERS:
        raise ValueError(f"unknown routing {name!r}; choose from {', '.join(sorted(ROUTERS))}")
    return ROUTERS[name]


def capsnet_routers() -> list[str]:
    """The routers CapsNet's DigitCaps can hold, by name: the ``--routing`` choices."""
    return sorted(name for name, cls in ROUTERS.items()
                  if cls.from_config.__func__ is not Router.from_config.__func__)


__all__ = ["ROUTERS", "DynamicRouter", "EMRouter", "InvertedAttentionRouter", "Routed",
           "Router", "SelfAttentionRouter", "capsnet_routers", "fully_connected_only",
           "router_class", "uniform_couplings"]
