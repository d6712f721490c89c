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

from dataclasses import dataclass

from capsnet.routing.base import Routed, Router, fully_connected_only, uniform_couplings
from capsnet.routing.dynamic import DynamicRouter
from capsnet.routing.em import EMRouter
from capsnet.routing.inverted_attention import InvertedAttentionRouter
from capsnet.routing.self_attention import SelfAttentionRouter

ROUTERS: dict[str, type[Router]] = {cls.name: cls for cls in (
    DynamicRouter, InvertedAttentionRouter, SelfAttentionRouter, EMRouter)}


def router_class(name: str) -> type[Router]:
    """The router named ``name``; a ValueError naming the choices otherwise."""
    if name not in ROUTERS:
        raise ValueError(f"unknown routing {name!r}; choose from {', '.join(sorted(ROUTERS))}")
    return ROUTERS[name]


@dataclass(frozen=True)
class RouterOptions:
    """The router options a model config carries, for a router built outside a model."""

    routing_iterations: int = 3
    routing_full_graph: bool = False
    none_of_the_above: bool = False


def make_router(name: str, *, children: int, parents: int, pose_dim: int,
                iterations: int = 3, **options) -> Router:
    """A router by name for a layer of ``children`` inputs and ``parents`` outputs of
    ``pose_dim`` numbers (EM: one beta pair per parent); ``options`` as
    :class:`RouterOptions` (``routing_full_graph``, ``none_of_the_above``)."""
    cls = router_class(name)
    if cls is EMRouter:
        return EMRouter(parents, iterations)
    config = RouterOptions(iterations, **options)
    return cls.from_config(config, children=children, parents=parents, pose_dim=pose_dim)


def capsnet_routers() -> list[str]:
    """The routers CapsNet's DigitCaps can hold, by name: the ``--routing`` choices."""
    return sorted(name for name, cls in ROUTERS.items()
                  if cls.from_config.__func__ is not Router.from_config.__func__)


__all__ = ["ROUTERS", "DynamicRouter", "EMRouter", "InvertedAttentionRouter", "Routed",
           "Router", "RouterOptions", "SelfAttentionRouter", "capsnet_routers",
           "fully_connected_only", "make_router", "router_class", "uniform_couplings"]
