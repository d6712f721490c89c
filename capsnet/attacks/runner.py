"""The evaluation of `capsnet attack`: the grid of models x attacks x eps on one seeded test
subset, each row computed once and written atomically as a small JSON file (a rerun skips
the rows already there), then gathered into one JSON list and one table; and the sanity
checks of Carlini et al. (2019), "On evaluating adversarial robustness"."""
from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

from capsnet import writers
from capsnet.atomic import write_json
from capsnet.attacks.detection import Detector, detection_metrics, image_scores
from capsnet.attacks.objectives import predict
from capsnet.attacks.registry import DEFAULT_SETTINGS, AttackSettings, attack_spec, run_attack

PERCENT = 100.0
ROWS_DIR = "rows"
ATTACK_BATCH = 100  # images attacked at once (memory: CapsNet's votes are 0.7 MB an image)
UNBOUNDED_EPS = 1.0  # pixels in [0, 1]: an L-inf ball of radius 1 holds every image
EXTRA_RESTARTS = 3


def seeded_subset(n_total: int, n: int, seed: int) -> torch.Tensor:
    """(min(n, n_total),) sorted indices of a seeded random subset."""
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(n_total, generator=g)[:n].sort().values


def row_file(out_dir: Path, model: str, attack: str, eps: float, settings: AttackSettings,
             n: int, source: str | None) -> Path:
    """Where the row lives: one file per model x attack x eps x settings."""
    parts = [model, attack, settings.loss, f"eps{eps:g}", f"k{settings.steps}",
             f"r{settings.restarts}", f"n{n}-seed{settings.seed}"]
    parts += ["targeted"] * settings.targeted + [f"from-{source}"] * bool(source)
    spec = attack_spec(attack)
    if attack == "square":
        parts.append(f"q{settings.queries}")
    if spec.reconstructive:
        parts.append("w" + "-".join(f"{w:g}" for w in settings.reconstruction_weights))
    if settings.routing_gradient != "full":
        parts.append(f"routing-gradient-{settings.routing_gradient}")
    slug = re.sub(r"[^A-Za-z0-9.+-]+", "_", "__".join(parts))
    return out_dir / ROWS_DIR / f"{slug}.json"


def attack_row(label: str, model: nn.Module, attack: str, eps: float, x: torch.Tensor,
               y: torch.Tensor, settings: AttackSettings, detectors: Sequence[Detector],
               source: nn.Module | None, source_label: str | None,
               minimal_norm_cache: dict) -> dict:
    """One row: robust accuracy of ``model`` on x (N, C, H, W), labels y (N,), under
    ``attack`` at ``eps``, with the detection columns of each detector."""
    start = time.perf_counter()
    adversarial, aims = [], []
    for i, (xb, yb) in enumerate(zip(x.split(ATTACK_BATCH), y.split(ATTACK_BATCH), strict=True)):
        batch_settings = dataclasses.replace(settings, seed=settings.seed + i)
        adv, aim = run_attack(attack, model, xb, yb, eps, batch_settings, source,
                              minimal_norm_cache.setdefault(i, {}))
        adversarial.append(adv)
        aims.append(aim)
    x_adv, aim = torch.cat(adversarial), torch.cat(aims)
    seconds = time.perf_counter() - start
    clean_scores, clean_pred = image_scores(model, x)
    adv_scores, adv_pred = image_scores(model, x_adv)
    attacked = clean_pred == y
    fooled = adv_pred == aim if settings.targeted else adv_pred != y
    success = attacked & fooled
    delta = (x_adv - x).flatten(1)
    row = {"model": label, "attack": attack, "norm": attack_spec(attack).norm, "eps": eps,
           "loss": settings.loss, "steps": settings.steps, "restarts": settings.restarts,
           "targeted": settings.targeted, "source": source_label, "n": len(y),
           "routing_gradient": settings.routing_gradient, "seed": settings.seed,
           "clean_accuracy": float(attacked.float().mean()),
           "robust_accuracy": float((adv_pred == y).float().mean()),
           "success_rate": float(success.sum()) / max(int(attacked.sum()), 1),
           "median_linf": float(delta[success].abs().amax(1).median()) if success.any() else None,
           "median_l2": float(delta[success].norm(dim=1).median()) if success.any() else None,
           "seconds": round(seconds, 2)}
    if detectors:
        row["detection"] = {d.name: detection_metrics(d, (clean_scores[d.name], clean_pred),
                                                      (adv_scores[d.name], adv_pred),
                                                      attacked, fooled) for d in detectors}
    return row


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
    source_label, source_model = source or (None, None)
    rows = []
    for label, model in models:
        minimal_norm_cache: dict = {}  # per batch: each minimal-norm attack's images
        for attack in attacks:
            for eps in eps_values:
                path = row_file(out_dir, label, attack, eps, settings, len(y), source_label)
                if path.is_file():
                    rows.append(json.loads(path.read_text()))
                    log(f"{path.name}: already there, skipped")
                    continue
                row = attack_row(label, model, attack, eps, x, y, settings,
                                 (detectors or {}).get(label, ()), source_model, source_label,
                                 minimal_norm_cache)
                write_json(path, row)
                rows.append(row)
                log(f"{label} {attack} eps {eps:g}: robust accuracy "
                    f"{PERCENT * row['robust_accuracy']:.1f}% ({row['seconds']:.1f} s)")
    return rows


def markdown_table(rows: Sequence[dict]) -> str:
    """The rows as a Markdown table: accuracies in %, and per detector S_d, TPR, the
    clean test images flagged (FPR; its threshold flags 5% of validation images) and
    AUROC."""
    detectors = sorted({d for r in rows for d in r.get("detection", {})})
    head = ["model", "attack", "loss", "eps", "steps", "n", "clean %", "robust %",
            "success %", "s"]
    head += [f"{d} {m}" for d in detectors for m in ("S_d %", "TPR %", "test FPR %", "AUROC")]
    lines = []
    for r in rows:
        cells = [r["model"], r["attack"] + (" (targeted)" if r["targeted"] else "")
                 + (f" from {r['source']}" if r["source"] else ""), r["loss"], f"{r['eps']:g}",
                 str(r["steps"]), str(r["n"]), f"{PERCENT * r['clean_accuracy']:.1f}",
                 f"{PERCENT * r['robust_accuracy']:.1f}", f"{PERCENT * r['success_rate']:.1f}",
                 f"{r['seconds']:.1f}"]
        for d in detectors:
            m = r.get("detection", {}).get(d)
            cells += ([f"{PERCENT * m['S_d']:.1f}", f"{PERCENT * m['tpr']:.1f}",
                       f"{PERCENT * m['test_fpr']:.1f}", f"{m['auroc']:.3f}"]
                      if m else ["", "", "", ""])
        lines.append(cells)
    return writers.markdown_table(head, lines)


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
    """The sanity checks at ``eps``, each a row {check, passed, detail}, named for what
    they require (the transfer check only with a ``source`` model)."""
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
