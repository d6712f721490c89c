"""Adversarial attacks (objectives -> methods, capsule -> registry), detectors and
out-of-distribution scores (detection, ood) for every model, and the resumable evaluation
grid with its sanity checks (runner)."""
from capsnet.attacks.detection import fit_detectors
from capsnet.attacks.objectives import (
    ATTACK_LOSSES,
    DEFAULT_LOSS,
    Objective,
    attack_loss,
    predict,
    prepare_for_attack,
)
from capsnet.attacks.registry import ATTACKS, AttackSettings, run_attack
from capsnet.attacks.runner import markdown_table, run_grid, sanity_checks, seeded_subset

__all__ = ["ATTACKS", "ATTACK_LOSSES", "DEFAULT_LOSS", "AttackSettings", "Objective",
           "attack_loss", "fit_detectors", "markdown_table", "predict", "prepare_for_attack",
           "run_attack", "run_grid", "sanity_checks", "seeded_subset"]
