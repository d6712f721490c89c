"""Evaluation sanity checks (Carlini et al. 2019, "On evaluating adversarial robustness"),
each a row {check, passed, detail} computed on the given images:

- iterative: PGD leaves no more accuracy than FGSM at the same eps;
- monotone: accuracy does not rise as eps grows (up to one image);
- unbounded: PGD at eps 1 (the whole image space) fools every image;
- transfer: an attack crafted on another model fools no more than the white-box one;
- gradient-free: Square fools no more than PGD (else gradient masking is suspected);
- restarts: more PGD restarts never raise the accuracy.
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from capsnet.attacks.registry import DEFAULT_SETTINGS, AttackSettings, run_attack
from capsnet.attacks.threat import predict

UNBOUNDED_EPS = 1.0  # pixels in [0, 1]: an L-inf ball of radius 1 holds every image
EXTRA_RESTARTS = 3


def accuracy_under(attack: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                   eps: float, settings: AttackSettings, source: nn.Module | None = None) -> float:
    """Accuracy of ``model`` on x (N, C, H, W) attacked (untargeted) at ``eps``."""
    x_adv, _ = run_attack(attack, model, x, y, eps, settings, source)
    return float((predict(model, x_adv) == y).float().mean())


def _check(name: str, passed: bool, **detail) -> dict:
    return {"check": name, "passed": bool(passed), "detail": detail}


def sanity_checks(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float,
                  settings: AttackSettings = DEFAULT_SETTINGS,
                  source: nn.Module | None = None) -> list[dict]:
    """Every check above at ``eps`` (the transfer check only with a ``source`` model)."""
    s = dataclasses.replace(settings, targeted=False)
    one_image = 1.0 / len(y)
    pgd = accuracy_under("pgd", model, x, y, eps, s)
    fgsm = accuracy_under("fgsm", model, x, y, eps, s)
    rows = [_check("iterative <= single step", pgd <= fgsm, pgd=pgd, fgsm=fgsm)]
    ladder = [eps / 2, eps, min(2 * eps, UNBOUNDED_EPS), UNBOUNDED_EPS]
    accuracies = [accuracy_under("pgd", model, x, y, e, s) for e in ladder]
    pairs = zip(accuracies, accuracies[1:], strict=False)
    rows.append(_check("accuracy falls as eps grows", all(b <= a + one_image for a, b in pairs),
                       eps=ladder, accuracy=accuracies))
    rows.append(_check("unbounded attack reaches 100%", accuracies[-1] == 0.0,
                       eps=UNBOUNDED_EPS, accuracy=accuracies[-1]))
    if source is not None:
        transfer = accuracy_under("pgd", model, x, y, eps, s, source)
        rows.append(_check("transfer <= white-box", transfer >= pgd, transfer=transfer, pgd=pgd))
    square = accuracy_under("square", model, x, y, eps, s)
    rows.append(_check("gradient-free no stronger than PGD (else masking)",
                       square >= pgd - one_image, square=square, pgd=pgd))
    more = accuracy_under("pgd", model, x, y, eps,
                          dataclasses.replace(s, restarts=s.restarts + EXTRA_RESTARTS))
    rows.append(_check("more restarts never help the defence", more <= pgd,
                       restarts=[s.restarts, s.restarts + EXTRA_RESTARTS], accuracy=[pgd, more]))
    return rows
