"""The routing contract every algorithm implements: :class:`Router` and what it returns,
:class:`Routed` (shapes in :mod:`capsnet.routing`)."""
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
    # Whether forward needs the children's activations (EM); a capsnet.layers.CapsuleLayer
    # given none passes the input capsules' lengths.
    needs_activations: ClassVar[bool] = False
    # How traces and figures name the couplings (Routed.couplings): a symbol and a line on
    # what they are for this algorithm.
    coupling_symbol: ClassVar[str] = "c"
    coupling_meaning: ClassVar[str] = ("the share of each child's prediction that each parent "
                                       "received")

    @classmethod
    def from_config(cls, config, *, children: int, parents: int,
                    pose_dim: int) -> Router:  # pragma: no cover - abstract
        """The router of a capsule layer with ``children`` inputs and ``parents`` outputs
        of ``pose_dim`` numbers each, its options read from ``config`` (a
        :class:`capsnet.config.CapsNetConfig`: ``routing_iterations``, ...)."""
        raise NotImplementedError

    def forward(self, u_hat: torch.Tensor, activations: torch.Tensor | None = None,
                children: torch.Tensor | None = None,
                num_children: int | None = None) -> Routed:  # pragma: no cover - abstract
        raise NotImplementedError

    def agreements(self, u_hat: torch.Tensor,
                   activations: torch.Tensor | None = None) -> tuple[torch.Tensor, ...] | None:
        """Per iteration, (B, J, I) how well child i's prediction agreed with the pose
        parent j got in that iteration, for traces and figures (training never calls this);
        None (the default) where the algorithm has no such quantity."""
        return None


def uniform_couplings(u_hat: torch.Tensor, share: float,
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(B, J, I) couplings all equal to ``share`` (e.g. a first iteration's 1/J) for
    ``u_hat`` (B, J, I, D), as a view of one number: nothing is allocated per child, so
    reporting them costs nothing."""
    B, J, I = u_hat.shape[:3]
    return torch.full((1, 1, 1), share, dtype=dtype, device=u_hat.device).expand(B, J, I)


def fully_connected_only(router: Router, children: torch.Tensor | None) -> None:
    """ValueError unless every parent sees the same children (``children`` is None)."""
    if children is not None:
        raise ValueError(f"{router.name} routing is implemented for fully connected capsule "
                         f"layers only (children=None)")
