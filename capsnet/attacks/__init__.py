"""Adversarial attacks, detectors and out-of-distribution scores for every model.

- :mod:`~capsnet.attacks.objectives`: the losses an attack maximises (margin, C&W, CE);
- :mod:`~capsnet.attacks.threat`: the :class:`Objective` (white-box, surrogate, targeted);
- :mod:`~capsnet.attacks.gradient`: FGSM, BIM, PGD (L-inf, L2; random start, restarts);
- :mod:`~capsnet.attacks.cw`: Carlini & Wagner L2, minimal norm;
- :mod:`~capsnet.attacks.square`: the gradient-free Square attack;
- :mod:`~capsnet.attacks.capsule`: the vote attack's surrogate (Gu et al. 2021);
- :mod:`~capsnet.attacks.registry`: every attack by name and :func:`run_attack`;
- :mod:`~capsnet.attacks.detection`: detector scores, thresholds on validation, metrics;
- :mod:`~capsnet.attacks.ood`: corruptions and out-of-distribution AUROC;
- :mod:`~capsnet.attacks.sanity`: the evaluation sanity checks (Carlini et al. 2019);
- :mod:`~capsnet.attacks.runner`: the resumable models x attacks x eps grid.
"""
from capsnet.attacks.detection import DETECTORS, Detector, auroc, fit_detectors, image_scores
from capsnet.attacks.objectives import ATTACK_LOSSES, DEFAULT_LOSS, attack_loss
from capsnet.attacks.registry import ATTACKS, AttackSettings, run_attack
from capsnet.attacks.runner import markdown_table, run_grid, seeded_subset
from capsnet.attacks.sanity import sanity_checks
from capsnet.attacks.threat import Objective, predict, prepare_for_attack

__all__ = ["ATTACKS", "ATTACK_LOSSES", "DEFAULT_LOSS", "DETECTORS", "AttackSettings",
           "Detector", "Objective", "attack_loss", "auroc", "fit_detectors", "image_scores",
           "markdown_table", "predict", "prepare_for_attack", "run_attack", "run_grid",
           "sanity_checks", "seeded_subset"]
