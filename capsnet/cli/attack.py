"""`capsnet attack`: robust accuracy of checkpoints under adversarial attacks (models x
attacks x eps on a seeded test subset), with detection, out-of-distribution and sanity
columns on request; rows are resumable."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from capsnet import attacks
from capsnet.atomic import write_json, write_text
from capsnet.attacks.capsule import diagnosis
from capsnet.attacks.detection import DETECTION_FPR
from capsnet.attacks.objectives import ENSEMBLE_LOSSES, LOSS_CHOICES
from capsnet.attacks.ood import CORRUPTIONS, ood_markdown, ood_row
from capsnet.attacks.registry import DEFAULT_SETTINGS
from capsnet.attacks.runner import ROWS_DIR
from capsnet.checkpoint import load_model
from capsnet.cli import args as cli_args
from capsnet.data.datasets import load_split
from capsnet.data.image_dataset import stratified_split, to_model_input
from capsnet.data.model_view import fit_to_model
from capsnet.data.sources import DataNotFoundError
from capsnet.devices import pick_device
from capsnet.experiments.robustness import named_models
from capsnet.training.settings import validation_size

# The other dataset each digit-like dataset is shown for the out-of-distribution rows.
OOD_PARTNER = {"mnist": "fashion-mnist", "fashion-mnist": "mnist"}
DIAGNOSIS_EXAMPLES = 4


def comma_list(kind):
    def parse(text: str):
        try:
            return [kind(part) for part in text.split(",") if part]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}") \
                from None
    return parse


def add_attack(subparsers) -> None:
    s = DEFAULT_SETTINGS  # the defaults, for the help texts
    p = subparsers.add_parser(
        "attack", help="robust accuracy under adversarial attacks, with detectors",
        description="Attack checkpoints (default: the shipped CapsNet) on a seeded subset of "
        "their test set: every model x attack x eps, in float32 with autocast off. Writes "
        "one JSON file per row under OUT_DIR/rows (a rerun skips the rows there), "
        "results.json, table.md and accuracy-eps.png. Attacks: " + ", ".join(
            f"{name} ({spec.description})" for name, spec in attacks.ATTACKS.items()) + ".")
    p.add_argument("checkpoints", nargs="*", metavar="CHECKPOINT",
                   help=".pt checkpoints or .safetensors weights (default: the shipped model)")
    p.add_argument("--labels", nargs="+", default=None, help="names of the models, in order")
    p.add_argument("--attack", type=comma_list(str), default=["fgsm", "pgd"],
                   metavar="NAME[,NAME]",
                   help=f"attacks: {', '.join(attacks.ATTACKS)} (default: fgsm,pgd)")
    p.add_argument("--eps", type=comma_list(float), default=[0.1, 0.3], metavar="E[,E]",
                   help="radii, in the attack's norm (default: 0.1,0.3)")
    p.add_argument("--steps", type=int, default=s.steps, help="gradient steps (default: 40)")
    p.add_argument("--restarts", type=int, default=s.restarts, help="PGD random restarts")
    p.add_argument("--loss", default=s.loss, choices=list(LOSS_CHOICES),
                   help=f"what the attack maximises (default: {attacks.DEFAULT_LOSS}: per "
                        f"image, the first of {', '.join(ENSEMBLE_LOSSES)} that fools it, each "
                        "run on the images the earlier left; logodds-*: on log(L / (1 - L)) "
                        "of the capsule lengths L, a CNN's logits; dlr: AutoAttack's difference "
                        "of logits ratio; Square uses logodds-cw, C&W cw)")
    p.add_argument("--reconstruction-weights", type=comma_list(float),
                   default=list(s.reconstruction_weights), metavar="W[,W]",
                   help="the reconstructive attacks' grid of weights of the reconstruction "
                        "error; each image keeps the fooling image with the smallest error "
                        f"(default: {','.join(f'{w:g}' for w in s.reconstruction_weights)})")
    p.add_argument("--targeted", action="store_true",
                   help="aim at a seeded random other class instead of any wrong class")
    p.add_argument("--routing-gradient", default="full", choices=["full", "last"],
                   help="gradients through every routing iteration (full, the default) or "
                        "through the last only, as dynamic routing trains (last: to see what "
                        "the detached path hides from an attack)")
    p.add_argument("--queries", type=int, default=s.queries, help="Square's queries per image")
    p.add_argument("--n", type=int, default=100, help="test images attacked (seeded subset)")
    p.add_argument("--seed", type=int, default=0, help="seed of the subset, starts and targets")
    p.add_argument("--source", default=None, metavar="CHECKPOINT",
                   help="transfer attack: craft the adversarial images on this model")
    p.add_argument("--detector", action="store_true",
                   help="detection columns (S_d, TPR, AUROC) with thresholds at "
                        f"{100 * DETECTION_FPR:g}%% FPR fit on clean validation images")
    p.add_argument("--val-n", type=int, default=1000,
                   help="validation images the thresholds are fit on")
    p.add_argument("--split-seed", type=int, default=0,
                   help="seed of the training run's validation split (capsnet train --seed)")
    p.add_argument("--val-size", type=int, default=None,
                   help="size of the training run's validation split (capsnet train "
                        "--val-size; default: the same default)")
    p.add_argument("--ood", action="store_true",
                   help="out-of-distribution AUROCs: the partner dataset (MNIST <-> "
                        f"Fashion-MNIST) and corruptions ({', '.join(CORRUPTIONS)})")
    p.add_argument("--sanity", action="store_true",
                   help="the evaluation sanity checks (Carlini et al. 2019) at the largest eps")
    p.add_argument("--figure", action="store_true",
                   help="diagnosis.png: clean and adversarial images with reconstructions "
                        "and class scores (first attack, largest eps)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON on stdout")
    p.add_argument("--out-dir", default="runs/attack", help="where rows, tables and plots go")
    cli_args.add_data_args(p, model_default=True)
    cli_args.add_device_arg(p)
    p.set_defaults(func=run_attack_grid)


def _validation_images(args, config, device) -> torch.Tensor:
    """--val-n clean validation images (the training run's split) as the model sees them."""
    train = load_split(args.dataset or config.dataset, "train", args.data_dir, args.download)
    _, val_idx = stratified_split(train.labels, validation_size(args.val_size, len(train)),
                                  args.split_seed)
    val = fit_to_model(train.subset(val_idx), config)
    pick = attacks.seeded_subset(len(val), args.val_n, args.seed)
    return to_model_input(val.images[pick]).to(device)


def _shifted_sets(args, config, x: torch.Tensor, device) -> dict[str, torch.Tensor]:
    generator = torch.Generator(device=x.device).manual_seed(args.seed)
    sets = {name: fn(x, generator) for name, fn in CORRUPTIONS.items()}
    partner = OOD_PARTNER.get((args.dataset or config.dataset).lower())
    if partner:
        try:
            other = fit_to_model(load_split(partner, "test", None, args.download), config)
        except DataNotFoundError as exc:
            print(f"capsnet: {partner} not found, its OOD rows are left out ({exc})",
                  file=sys.stderr)
            return sets
        pick = attacks.seeded_subset(len(other), len(x), args.seed)
        sets[partner] = to_model_input(other.images[pick]).to(device)
    return sets


def run_attack_grid(args: argparse.Namespace, argv: list[str]) -> int:
    log = (lambda text: print(text, file=sys.stderr)) if args.json else print
    device = pick_device(args.device)
    sources = args.checkpoints or [None]
    full_graph = args.routing_gradient == "full"
    models = [attacks.prepare_for_attack(load_model(path, device), full_graph)
              for path in sources]
    named = named_models([path or "weights/shipped" for path in sources], models, args.labels)
    config = models[0].config
    test = cli_args.load_cli_test_set(args, config)
    pick = attacks.seeded_subset(len(test), args.n, args.seed)
    x, y = to_model_input(test.images[pick]).to(device), test.labels[pick].to(device)
    settings = attacks.AttackSettings(
        steps=args.steps, restarts=args.restarts, loss=args.loss, targeted=args.targeted,
        seed=args.seed, queries=args.queries, routing_gradient=args.routing_gradient,
        reconstruction_weights=tuple(args.reconstruction_weights))
    source = None
    if args.source:
        source = (Path(args.source).resolve().parent.name,
                  attacks.prepare_for_attack(load_model(args.source, device), full_graph))
    detectors = None
    out = Path(args.out_dir)
    if args.detector or args.ood:
        val = _validation_images(args, config, device)
        detectors = {m.label: attacks.fit_detectors(m.model, val) for m in named}
    rows = attacks.run_grid([(m.label, m.model) for m in named], args.attack, args.eps, x, y,
                            settings, out, detectors if args.detector else None, source, log)
    ood = sanity = None
    if args.ood:
        shifted = _shifted_sets(args, config, x, device)
        ood = [ood_row(m.label, m.model, detectors[m.label], x, name, images)
               for m in named for name, images in shifted.items()]
    if args.sanity:
        source_model = source[1] if source else None
        sanity = {m.label: attacks.sanity_checks(m.model, x, y, max(args.eps), settings,
                                                 source_model) for m in named}
    # the folder's results: every row under rows/ and the OOD and sanity results of earlier
    # commands into it, so that several commands build one table and lose nothing
    results = _folder_results(out, "capsnet " + " ".join(argv), ood, sanity)
    results.update(n=len(y), seed=args.seed, settings=vars(settings))
    write_json(out / "results.json", results)
    write_text(out / "table.md", _tables(results) + "\n")
    _figures(args, named, results["rows"], x, y, settings, out)
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        print(_tables({**results, "rows": rows, "ood": ood, "sanity": sanity}))
        print(f"wrote {out / 'results.json'}, {out / 'table.md'}, {out / 'accuracy-eps.png'}")
    return 0


def _folder_results(out: Path, command: str, ood: list | None, sanity: dict | None) -> dict:
    """results.json's content for ``out``: all rows in ``out/rows`` (this command's and
    earlier ones'), the commands so far, and the OOD rows and sanity checks, this command's
    replacing an earlier command's for the same model (and shift)."""
    try:
        earlier = json.loads((out / "results.json").read_text())
    except (OSError, ValueError):
        earlier = {}
    commands = earlier.get("commands") or ([earlier["command"]] if "command" in earlier else [])
    results = {"command": command, "commands": [*commands, command],
               "rows": [json.loads(f.read_text())
                        for f in sorted((out / ROWS_DIR).glob("*.json"))]}
    new_shifts = {(r["model"], r["shift"]) for r in ood or ()}
    kept_ood = [r for r in earlier.get("ood") or () if (r["model"], r["shift"]) not in new_shifts]
    if kept_ood or ood:
        results["ood"] = kept_ood + (ood or [])
    if earlier.get("sanity") or sanity:
        results["sanity"] = {**(earlier.get("sanity") or {}), **(sanity or {})}
    return results


def _tables(results: dict) -> str:
    """The rows' table, then the OOD table and the sanity checks where there are any."""
    parts = [attacks.markdown_table(results["rows"])]
    if results.get("ood"):
        parts.append(ood_markdown(results["ood"]))
    if results.get("sanity"):
        parts.append("\n".join(f"- {label}: {r['check']}: {'pass' if r['passed'] else 'FAIL'} "
                               f"{json.dumps(r['detail'])}"
                               for label, checks in results["sanity"].items() for r in checks))
    return "\n\n".join(parts)


def _figures(args, named, rows, x, y, settings, out: Path) -> None:
    from capsnet.figures import accuracy_eps_figure, diagnosis_figure

    accuracy_eps_figure(rows, out / "accuracy-eps.png",
                        f"{len(y)} test images, {settings.steps} steps, loss {settings.loss}")
    if args.figure:
        model = named[0].model
        shown = slice(0, DIAGNOSIS_EXAMPLES)
        x_adv, _ = attacks.run_attack(args.attack[0], model, x[shown], y[shown], max(args.eps),
                                      settings)
        diagnosis_figure(diagnosis(model, x[shown], x_adv, y[shown]), out / "diagnosis.png",
                         DIAGNOSIS_EXAMPLES, f"{named[0].label}: {args.attack[0]} at eps "
                         f"{max(args.eps):g}")
