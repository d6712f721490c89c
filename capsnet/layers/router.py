"""One contract for every routing algorithm: votes and child activations in, parent poses,
parent activations and the couplings of every iteration out.

A routing algorithm decides how much of each child capsule's vote reaches each parent
capsule. Every algorithm in capsnet is a :class:`Router` (an ``nn.Module``) whose
``forward(votes, activations)`` returns a :class:`Routed`; a model holds one and never
asks which it is. Routers are registered by name in :data:`ROUTERS`, so a config field
(``CapsNetConfig.routing``) and ``--routing NAME`` choose one, and ``routing_trace``,
``capsnet routing`` and the web panel read the couplings of whichever the model uses. A
model builds its router with ``router_class(config.routing).from_config(config,
children=I, parents=J, pose_dim=D)``; importing :mod:`capsnet.layers` registers them all.

Shapes (B batch, J parents, I children seen by each parent, D pose size):

- ``votes``: (B, J, I, D), child i's prediction of parent j's pose (u_hat in Sabour et
  al. 2017, V_ij in Hinton et al. 2018), laid out parent-major.
- ``activations``: (B, I) the children's activations, or None where the algorithm has
  none (dynamic routing: a capsule's length is its activation and is inside its vote).
- ``children``: None when every parent sees the same I children (a fully connected
  capsule layer); otherwise a (J, I) long tensor naming, for each parent's slot i, the
  global index of the child in it (a convolutional capsule layer, where parents at
  different positions see overlapping windows and must compete for the children they
  share), with ``num_children`` the number of distinct children.

``Routed.couplings`` holds one (B, J, I) tensor per iteration: the share of child i's vote
that parent j received in that iteration (for dynamic routing c_ij; for EM routing the
assignment R_ij; for attention routing the attention weights).
"""
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
    """Base class of routing algorithms. Subclasses set :attr:`name` (the registry key and
    the ``--routing`` choice) and implement :meth:`from_config` and :meth:`forward`;
    :meth:`agreements` is optional (for traces and figures only)."""

    name: ClassVar[str] = ""
    # How traces and figures name the couplings (Routed.couplings): a symbol and a line on
    # what they are for this algorithm.
    coupling_symbol: ClassVar[str] = "c"
    coupling_meaning: ClassVar[str] = "the share of each child's vote that each parent received"

    @classmethod
    def from_config(cls, config, *, children: int, parents: int,
                    pose_dim: int) -> Router:  # pragma: no cover - abstract
        """The router of a capsule layer with ``children`` inputs and ``parents`` outputs
        of ``pose_dim`` numbers each, its options read from ``config`` (a
        :class:`capsnet.config.CapsNetConfig`: ``routing_iterations``, ...)."""
        raise NotImplementedError

    def forward(self, votes: torch.Tensor, activations: torch.Tensor | None = None,
                children: torch.Tensor | None = None,
                num_children: int | None = None) -> Routed:  # pragma: no cover - abstract
        raise NotImplementedError

    def agreements(self, votes: torch.Tensor,
                   activations: torch.Tensor | None = None) -> tuple[torch.Tensor, ...] | None:
        """Per iteration, (B, J, I) how well child i's vote agreed with the pose parent j
        got in that iteration, for traces and figures (training never calls this); None
        (the default) where the algorithm has no such quantity."""
        return None


def uniform_couplings(votes: torch.Tensor, share: float,
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(B, J, I) couplings all equal to ``share`` (e.g. a first iteration's 1/J) for
    ``votes`` (B, J, I, D), as a view of one number: nothing is allocated per child, so
    reporting them costs nothing."""
    B, J, I = votes.shape[:3]  # noqa: E741 (the paper's name for the children)
    return torch.full((1, 1, 1), share, dtype=dtype, device=votes.device).expand(B, J, I)


def fully_connected_only(router: Router, children: torch.Tensor | None) -> None:
    """ValueError unless every parent sees the same children (``children`` is None)."""
    if children is not None:
        raise ValueError(f"{router.name} routing is implemented for fully connected capsule "
                         f"layers only (children=None)")


ROUTERS: dict[str, type[Router]] = {}


def register_router(cls: type[Router]) -> type[Router]:
    """Class decorator: make ``cls`` choosable by its :attr:`Router.name`."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    if cls.name in ROUTERS and ROUTERS[cls.name] is not cls:
        raise ValueError(f"two routers named {cls.name!r}")
    ROUTERS[cls.name] = cls
    return cls


def router_class(name: str) -> type[Router]:
    """The router registered as ``name``; a ValueError naming the choices otherwise."""
    if name not in ROUTERS:
        raise ValueError(f"unknown routing {name!r}; choose from {', '.join(sorted(ROUTERS))}")
    return ROUTERS[name]


def capsnet_routers() -> list[str]:
    """The routers CapsNet's DigitCaps can hold (those that build from a CapsNet config),
    by name: the ``--routing`` choices. EM routing routes matrix capsules (``--model em``)."""
    return sorted(name for name, cls in ROUTERS.items()
                  if cls.from_config.__func__ is not Router.from_config.__func__)
