"""Attacks aimed at capsules: the vote attack (Gu, Wu & Tresp, ICLR 2021) and the
reconstructive attack on reconstruction-based detectors (Qin et al., ICLR 2020).

The vote attack replaces the routing by the mean of the primary capsules' votes u_hat,
squashed, as the surrogate output: its gradient does not pass through the routing
iterations, which can hide (mask) the gradient of the true output. The votes come from the
model's own forward (``forward_routing``, then ``forward_head``), so any router works
unchanged. The detection-aware vote attack adds the reconstructive term (its reconstruction
is the real model's, as the detector sees it)."""
from __future__ import annotations

import torch
from torch import nn

from capsnet.models import ModelOutput, class_scores
from capsnet.squashing import squash

# The reconstructive attacks' weights per unit of summed squared pixel error, a grid from
# the plain attack (0) to one that mostly lowers the error; each image keeps its best.
RECONSTRUCTIVE_WEIGHTS = (0.0, 0.01, 0.05, 0.25, 1.0)


def primary_votes(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, object]:
    """The votes u_hat (B, J, I, D) of the primary capsules of x (B, C, H, W) and the
    model's output, from one forward of the model: its ``forward_routing`` (up to the class
    capsules), then its ``forward_head``."""
    routing = model.forward_routing(x)
    output = model.forward_head(routing)
    if routing.activations is not None:  # EM's children have activations besides poses
        raise ValueError("the vote attack needs vector capsules; EM's matrix capsules have "
                         "activations, not lengths")
    return routing.votes, output  # (B, J, I, D) float32


def vote_output(model: nn.Module, x: torch.Tensor) -> ModelOutput:
    """The vote attack's surrogate output: v_j = squash(sum_i u_hat_j|i / J) (B, J, D), its
    lengths (B, J), and the real model's reconstructions (what a detector reads).

    The votes' mean is taken at the scale of the first routing iteration (uniform
    couplings c_ij = 1/J, so s_j = (I / J) mean_i u_hat_j|i): a positive factor changes no
    prediction, but the plain mean of the shipped CapsNet's 1152 votes has lengths near
    1e-4, too small beside the reconstructive term of the detection-aware attack."""
    u_hat, output = primary_votes(model, x)  # (B, J, I, D)
    J = u_hat.shape[1]
    v = squash(u_hat.sum(dim=2) / J)  # (B, J, D)
    return ModelOutput(v.norm(dim=-1), v, output.reconstructions)


class VoteSurrogate:
    """x -> :func:`vote_output` of ``model``: the ``surrogate`` of an Objective."""

    def __init__(self, model: nn.Module):
        if not hasattr(model, "forward_head"):  # fail early, with the reason
            raise ValueError(f"the vote attack needs a capsule model (capsnet with any "
                             f"router, or efficient); {type(model).__name__} has no class "
                             f"capsules")
        self.model = model

    def __call__(self, x: torch.Tensor) -> ModelOutput:
        return vote_output(self.model, x)


@torch.no_grad()
def diagnosis(model: nn.Module, x: torch.Tensor, x_adv: torch.Tensor,
              labels: torch.Tensor) -> dict[str, torch.Tensor]:
    """What the "diagnosis" view shows for clean images x and their adversarial versions
    x_adv (B, C, H, W), true labels (B,): each image's class scores (B, J), its predicted
    class (B,), and its reconstructions (B, C, H, W) from the true class's capsule and from
    the adversarial prediction's capsule (None for models without a decoder), and the
    images themselves."""
    adv_class = class_scores_of(model, x_adv).argmax(-1)  # (B,)
    view = {"labels": labels, "adversarial_class": adv_class, "clean": x, "adversarial": x_adv}
    for name, images in (("clean", x), ("adversarial", x_adv)):
        view[f"{name}_scores"] = class_scores_of(model, images)
        for which, classes in (("true", labels), ("adversarial", adv_class)):
            output = model(images, classes)
            view[f"{name}_reconstruction_{which}"] = getattr(output, "reconstructions", None)
    return view


def class_scores_of(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(B, J) class scores of images x (B, C, H, W)."""
    return class_scores(model(x)).float()
