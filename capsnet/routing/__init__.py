"""Routing algorithms: one contract, one module per algorithm, one registry by name.

A routing algorithm decides how much of each child capsule's prediction reaches each parent
capsule. Every algorithm is a :class:`Router` (an ``nn.Module``) whose
``forward(u_hat, activations)`` returns a :class:`Routed`; a model holds one and never asks
which it is. :data:`ROUTERS` names them, so a config field (``CapsNetConfig.routing``) and
``--routing NAME`` choose one, and ``routing_trace``, ``capsnet routing`` and the web panel
read the couplings of whichever the model uses. A model builds its router with
``router_class(config.routing).from_config(config, children=I, parents=J, pose_dim=D)``.

- ``dynamic`` (:mod:`~capsnet.routing.dynamic`): Sabour, Frosst & Hinton 2017, Procedure 1;
- ``inverted-attention`` (:mod:`~capsnet.routing.inverted_attention`): Tsai et al. 2020;
- ``self-attention`` (:mod:`~capsnet.routing.self_attention`): Mazzia et al. 2021
  (Efficient-CapsNet);
- ``em`` (:mod:`~capsnet.routing.em`): Hinton, Sabour & Frosst 2018 (matrix capsules).

Shapes (B batch, J parents, I children seen by each parent, D pose size):

- ``u_hat``: (B, J, I, D), child i's prediction of parent j's pose (u_hat_j|i in Sabour et
  al. 2017; the votes V_ij of Hinton et al. 2018), laid out parent-major.
- ``activations``: (B, I) the children's activations, or None where the algorithm has
  none (dynamic routing: a capsule's length is its activation and is inside its prediction).
- ``children``: None when every parent sees the same I children (a fully connected
  capsule layer); otherwise a (J, I) long tensor naming, for each parent's slot i, the
  global index of the child in it (a convolutional capsule layer, where parents at
  different positions see overlapping windows and must compete for the children they
  share), with ``num_children`` the number of distinct children.

``Routed.couplings`` holds one (B, J, I) tensor per iteration: the share of child i's
prediction that parent j received in that iteration (for dynamic routing c_ij; for EM
routing the assignment R_ij; for attention routing the attention weights).
"""
from __future__ import annotations

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


def capsnet_routers() -> list[str]:
    """The routers CapsNet's DigitCaps can hold (those that build from a CapsNet config),
    by name: the ``--routing`` choices. EM routing routes matrix capsules (``--model em``)."""
    return sorted(name for name, cls in ROUTERS.items()
                  if cls.from_config.__func__ is not Router.from_config.__func__)


__all__ = ["ROUTERS", "DynamicRouter", "EMRouter", "InvertedAttentionRouter", "Routed",
           "Router", "SelfAttentionRouter", "capsnet_routers", "fully_connected_only",
           "router_class", "uniform_couplings"]
