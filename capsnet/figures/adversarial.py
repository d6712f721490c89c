"""Figures of `capsnet attack`: robust accuracy against eps, and the diagnosis view (a
clean and an adversarial image, their reconstructions from the true and the adversarial
class's capsule, and the class scores of both)."""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch
from matplotlib.figure import Figure

from capsnet.figures.common import (
    PERCENT,
    WRONG_COLOR,
    accuracy_chart,
    save_figure,
    score_bars,
    show_image,
)
from capsnet.inference import to_uint8

PANEL_INCHES = 1.6  # per panel of the diagnosis view
DIAGNOSIS_PANELS = 4  # image, reconstruction (true), reconstruction (adversarial), scores


def accuracy_eps_figure(rows: Sequence[dict], path: str | os.PathLike, title: str = "") -> Path:
    """Robust accuracy against eps, one line per model and attack (and loss), starting
    from the clean accuracy at eps 0."""
    fig, ax = accuracy_chart("eps (L-inf or L2, as the attack's norm)", "robust accuracy (%)",
                             title)
    curves: dict[str, list[dict]] = {}
    for r in rows:
        curves.setdefault(f"{r['model']}: {r['attack']} ({r['loss']})", []).append(r)
    for label, mine in curves.items():
        mine = sorted(mine, key=lambda r: r["eps"])
        eps = [0.0] + [r["eps"] for r in mine]  # eps 0: the clean accuracy
        accuracy = [mine[0]["clean_accuracy"]] + [r["robust_accuracy"] for r in mine]
        ax.plot(eps, [PERCENT * a for a in accuracy], marker="o", label=label)
    ax.legend(fontsize="small")
    return save_figure(fig, path)


def diagnosis_figure(view: dict[str, torch.Tensor], path: str | os.PathLike,
                     count: int = 4, title: str = "") -> Path:
    """For each of ``count`` examples of a :func:`capsnet.attacks.capsule.diagnosis` view,
    two rows (clean, adversarial): the image, its reconstructions from the true and the
    adversarial class's capsule, and its class scores as bars."""
    count = min(count, len(view["labels"]))
    fig = Figure(figsize=(PANEL_INCHES * (DIAGNOSIS_PANELS), PANEL_INCHES * 2 * count))
    axes = fig.subplots(2 * count, DIAGNOSIS_PANELS, squeeze=False)
    for i in range(count):
        true, adv = int(view["labels"][i]), int(view["adversarial_class"][i])
        for k, name in enumerate(("clean", "adversarial")):
            row = axes[2 * i + k]
            show_image(row[0], to_uint8(view[name][i]), f"{name} (true {true})",
                       WRONG_COLOR if name == "adversarial" and adv != true else "black")
            for col, which, cls in ((1, "true", true), (2, "adversarial", adv)):
                recon = view.get(f"{name}_reconstruction_{which}")
                if recon is None:
                    row[col].axis("off")
                    continue
                show_image(row[col], to_uint8(recon[i]), f"recon. as {cls}")
            score_bars(row[3], view[f"{name}_scores"][i].cpu().numpy())
            row[3].tick_params(labelsize=6)
            if i == 0 and k == 0:
                row[3].set_title("class scores", fontsize=8)
    fig.subplots_adjust(hspace=0.45)
    return save_figure(fig, path, title)
