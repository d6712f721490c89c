"""The grid of `capsnet attack`: models x attacks x eps on one seeded test subset, each row
computed once and written atomically as a small JSON file (a rerun skips the rows already
there), then gathered into one JSON list and one table."""
from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

from capsnet.atomic import atomic_write
from capsnet.attacks.detection import Detector, detection_metrics, image_scores
from capsnet.attacks.registry import AttackSettings, attack_spec, run_attack
from capsnet.attacks.threat import predict

PERCENT = 100.0
ROWS_DIR = "rows"
ATTACK_BATCH = 100  # images attacked at once (memory: CapsNet's votes are 0.7 MB an image)


def seeded_subset(n_total: int, n: int, seed: int) -> torch.Tensor:
    """(min(n, n_total),) sorted indices of a seeded random subset."""
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(n_total, generator=g)[:n].sort().values


def row_file(out_dir: Path, model: str, attack: str, eps: float, settings: AttackSettings,
             n: int, source: str | None) -> Path:
    """Where the row lives: one file per model x attack x eps x settings."""
    parts = [model, attack, settings.loss, f"eps{eps:g}", f"k{settings.steps}",
             f"r{settings.restarts}", f"n{n}-seed{settings.seed}"]
    parts += ["targeted"] * settings.targeted + ([f"from-{source}"] if source else [])
    parts += [f"routing-gradient-{settings.routing_gradient}"] * (settings.routing_gradient
                                                                  != "full")
    slug = re.sub(r"[^A-Za-z0-9.+-]+", "_", "__".join(parts))
    return out_dir / ROWS_DIR / f"{slug}.json"


def attack_row(label: str, model: nn.Module, attack: str, eps: float, x: torch.Tensor,
               y: torch.Tensor, settings: AttackSettings, detectors: Sequence[Detector] = (),
               source: nn.Module | None = None, source_label: str | None = None,
               minimal_norm_cache: dict | None = None) -> dict:
    """One row: robust accuracy of ``model`` on x (N, C, H, W), labels y (N,), under
    ``attack`` at ``eps``, with the detection columns of each detector."""
    start = time.perf_counter()
    adversarial, aims = [], []
    for i, (xb, yb) in enumerate(zip(x.split(ATTACK_BATCH), y.split(ATTACK_BATCH), strict=True)):
        batch_settings = dataclasses.replace(settings, seed=settings.seed + i)
        cache = None if minimal_norm_cache is None else minimal_norm_cache.setdefault(i, {})
        adv, aim = run_attack(attack, model, xb, yb, eps, batch_settings, source, cache)
        adversarial.append(adv)
        aims.append(aim)
    x_adv, aim = torch.cat(adversarial), torch.cat(aims)
    seconds = time.perf_counter() - start
    clean_pred, adv_pred = predict(model, x), predict(model, x_adv)
    attacked = clean_pred == y
    fooled = adv_pred == aim if settings.targeted else adv_pred != y
    success = attacked & fooled
    delta = (x_adv - x).flatten(1)
    row = {"model": label, "attack": attack, "norm": attack_spec(attack).norm, "eps": eps,
           "loss": settings.loss, "steps": settings.steps, "restarts": settings.restarts,
           "targeted": settings.targeted, "source": source_label, "n": len(y),
           "routing_gradient": settings.routing_gradient,
           "seed": settings.seed,
           "clean_accuracy": float(attacked.float().mean()),
           "robust_accuracy": float((adv_pred == y).float().mean()),
           "success_rate": float(success.sum()) / max(int(attacked.sum()), 1),
           "median_linf": float(delta[success].abs().amax(1).median()) if success.any() else None,
           "median_l2": float(delta[success].norm(dim=1).median()) if success.any() else None,
           "seconds": round(seconds, 2)}
    if detectors:
        clean_scores, _ = image_scores(model, x)
        adv_scores, _ = image_scores(model, x_adv)
        row["detection"] = {d.name: detection_metrics(d, (clean_scores[d.name], clean_pred),
                                                      (adv_scores[d.name], adv_pred),
                                                      attacked, fooled) for d in detectors}
    return row


def write_json(obj, path: Path) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    atomic_write(path, lambda f: f.write((json.dumps(obj, indent=1) + "\n").encode()))


def run_grid(models: Sequence[tuple[str, nn.Module]], attacks: Sequence[str],
             eps_values: Sequence[float], x: torch.Tensor, y: torch.Tensor,
             settings: AttackSettings, out_dir: str | Path,
             detectors: dict[str, list[Detector]] | None = None,
             source: tuple[str, nn.Module] | None = None,
             log: Callable[[str], None] = print) -> list[dict]:
    """Every model x attack x eps row (computed, or read back when its file exists)."""
    out_dir = Path(out_dir)
    for name in attacks:
        attack_spec(name)  # unknown names fail before any work
    rows = []
    for label, model in models:
        cache: dict = {}
        for attack in attacks:
            for eps in eps_values:
                path = row_file(out_dir, label, attack, eps, settings, len(y),
                                source[0] if source else None)
                if path.is_file():
                    rows.append(json.loads(path.read_text()))
                    log(f"{path.name}: already there, skipped")
                    continue
                row = attack_row(label, model, attack, eps, x, y, settings,
                                 (detectors or {}).get(label, ()),
                                 source[1] if source else None, source[0] if source else None,
                                 cache.setdefault(attack, {}))
                write_json(row, path)
                rows.append(row)
                log(f"{label} {attack} eps {eps:g}: robust accuracy "
                    f"{PERCENT * row['robust_accuracy']:.1f}% ({row['seconds']:.1f} s)")
    return rows


def markdown_table(rows: Sequence[dict]) -> str:
    """The rows as a Markdown table: accuracies in %, and S_d / AUROC per detector."""
    detectors = sorted({d for r in rows for d in r.get("detection", {})})
    head = ["model", "attack", "loss", "eps", "steps", "n", "clean %", "robust %",
            "success %", "s"]
    head += [f"{d} {m}" for d in detectors for m in ("S_d %", "TPR %", "AUROC")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["model"], r["attack"] + (" (targeted)" if r["targeted"] else "")
                 + (f" from {r['source']}" if r["source"] else ""), r["loss"], f"{r['eps']:g}",
                 str(r["steps"]), str(r["n"]), f"{PERCENT * r['clean_accuracy']:.1f}",
                 f"{PERCENT * r['robust_accuracy']:.1f}", f"{PERCENT * r['success_rate']:.1f}",
                 f"{r['seconds']:.1f}"]
        for d in detectors:
            m = r.get("detection", {}).get(d)
            cells += ([f"{PERCENT * m['S_d']:.1f}", f"{PERCENT * m['tpr']:.1f}",
                       f"{m['auroc']:.3f}"] if m else ["", "", ""])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
