"""What the first few hundred training steps of a CapsNet do, measured every few steps:
the loss terms, the class capsules' lengths, how spread the routing couplings are, how
active the primary capsules are, and the gradient norm of each layer.

    python benchmarks/first_steps.py --dataset folder --data-dir /tmp/study/fashion-colour
    python benchmarks/first_steps.py --dataset mnist --steps 200 --every 20

Prints one row per probe and, at the end, the validation accuracy after the last step.
``--config KEY=VALUE`` changes the model's config (e.g. ``input_norm=none``) so that one
ingredient can be switched at a time.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from capsnet.data.augment import random_shift, to_model_input  # noqa: E402
from capsnet.data.datasets import load_dataset  # noqa: E402
from capsnet.data.splits import stratified_split  # noqa: E402
from capsnet.losses import margin_loss, reconstruction_loss  # noqa: E402
from capsnet.models import build_model, make_config  # noqa: E402
from capsnet.routing_trace import routing_trace  # noqa: E402
from capsnet.tuning import SpeedPlan, apply_plan, conv_layers  # noqa: E402

PROBE_IMAGES = 64  # a fixed batch of training images the probes look at
LAYERS = ("conv1", "primary_caps", "digit_caps", "decoder")


def load(args) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Training images (N, [C,] H, W) uint8, labels (N,), class names."""
    options = {"image_size": args.image_size} if args.dataset == "folder" else {}
    train, _ = load_dataset(args.dataset, args.data_dir, **options)
    return train.images, train.labels, list(train.classes)


def parse_overrides(pairs: list[str]) -> dict:
    return {key: json.loads(value) if value[:1] in "0123456789-[{tfn\"" else value
            for key, value in (pair.split("=", 1) for pair in pairs)}


def layer_grad_norms(model: torch.nn.Module) -> dict[str, float]:
    norms = {}
    for name in LAYERS:
        module = getattr(model, name, None)
        if module is None:
            continue
        grads = [p.grad.norm() for p in module.parameters() if p.grad is not None]
        norms[name] = float(torch.stack(grads).norm()) if grads else 0.0
    return norms


@torch.no_grad()
def probe(model, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """Capsule and routing statistics of a probe batch x (P, C, H, W), labels (P,)."""
    trace = routing_trace(model, x)
    true = trace.lengths.gather(1, y[:, None]).squeeze(1)  # (P,)
    others = (trace.lengths.sum(1) - true) / (trace.lengths.shape[1] - 1)  # (P,)
    c = trace.couplings[:, -1]  # (P, J, I) the last iteration's couplings
    J = c.shape[1]
    entropy = -(c.clamp_min(1e-12) * c.clamp_min(1e-12).log()).sum(1)  # (P, I)
    primary = trace.primary_lengths.flatten(1)  # (P, I)
    return {"len_true": float(true.mean()), "len_other": float(others.mean()),
            "c_max": float(c.max(1).values.mean()),
            "c_entropy": float(entropy.mean() / torch.log(torch.tensor(float(J)))),
            "prim_len": float(primary.mean()),
            "prim_active": float((primary > 0.5).float().mean())}


def input_normaliser(kind: str, train_x: torch.Tensor):
    """x (B, C, H, W) in [0, 1] -> the model's input: unchanged ('none'), standardised
    per channel with the training set's statistics ('dataset') or per image ('image')."""
    if kind == "dataset":
        mean = train_x.mean(dim=(0, 2, 3), keepdim=True)[0]  # (C, 1, 1)
        std = train_x.std(dim=(0, 2, 3), keepdim=True)[0]
        return lambda x: (x - mean) / std
    if kind == "image":
        return lambda x: ((x - x.mean(dim=(2, 3), keepdim=True))
                          / x.std(dim=(2, 3), keepdim=True).clamp_min(1e-3))
    return lambda x: x


def train_and_probe(args) -> None:
    torch.manual_seed(args.seed)
    images, labels, classes = load(args)
    train_idx, val_idx = stratified_split(labels, args.val_size, args.seed)
    sample = to_model_input(images[:1])
    config = make_config("capsnet", args.preset, image_size=sample.shape[-1],
                         in_channels=sample.shape[1], num_classes=len(classes),
                         dataset=args.dataset, **parse_overrides(args.config))
    model = build_model(config)
    apply_plan(model, SpeedPlan(args.precision, {name: args.conv_impl
                                                 for name, _ in conv_layers(model)}))
    if hasattr(model, "fit_input_statistics"):
        model.fit_input_statistics(images[train_idx])
    if args.conv1_bn:  # probe only: a BatchNorm on Conv1's output
        model.conv1 = torch.nn.Sequential(model.conv1, torch.nn.BatchNorm2d(
            config.conv1_channels))
    normalise = input_normaliser(args.input_norm, to_model_input(images[train_idx]))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    warmup = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / max(args.warmup_steps, 1)))
    generator = torch.Generator().manual_seed(args.seed)
    probe_x = to_model_input(images[train_idx[:PROBE_IMAGES]])
    probe_y = labels[train_idx[:PROBE_IMAGES]]
    print(f"{args.dataset} {args.data_dir or ''}: {len(train_idx)} training images, "
          f"{len(classes)} classes, input {tuple(sample.shape[1:])}; config overrides "
          f"{parse_overrides(args.config)}")
    header = ("step", "margin", "recon_w", "len_true", "len_other", "c_max", "c_entropy",
              "prim_len", "prim_active", *[f"g_{n}" for n in LAYERS], "batch_acc")
    print(" ".join(f"{h:>11}" for h in header))
    order = train_idx[torch.randperm(len(train_idx), generator=generator)]
    for step in range(1, args.steps + 1):
        start = (step - 1) * args.batch_size % len(order)
        idx = order[start:start + args.batch_size]
        x = random_shift(to_model_input(images[idx]), 2, generator)
        y = labels[idx]
        model.train()
        out = model(normalise(x), y)
        margin = margin_loss(out.lengths, y)
        recon = (args.reconstruction_weight * reconstruction_loss(out.reconstructions, x)
                 if out.reconstructions is not None else torch.zeros(()))
        optimizer.zero_grad(set_to_none=True)
        (margin + recon).backward()
        grads = layer_grad_norms(model)
        optimizer.step()
        warmup.step()
        if step == 1 or step % args.every == 0:
            model.eval()
            stats = probe(model, normalise(probe_x), probe_y)
            accuracy = float((out.lengths.argmax(1) == y).float().mean())
            row = (step, margin.item(), recon.item(), *stats.values(),
                   *[grads.get(n, 0.0) for n in LAYERS], accuracy)
            print(" ".join(f"{v:>11d}" if isinstance(v, int) else f"{v:>11.4f}" for v in row),
                  flush=True)
    model.eval()
    with torch.no_grad():
        x_val = normalise(to_model_input(images[val_idx]))
        predicted = torch.cat([model(chunk).lengths.argmax(1) for chunk in x_val.split(250)])
    accuracy = float((predicted == labels[val_idx]).float().mean())
    print(f"validation accuracy after {args.steps} steps: {accuracy:.4f} "
          f"({len(val_idx)} images)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="folder")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--image-size", type=int, default=None)
    parser.add_argument("--preset", default="paper")
    parser.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--reconstruction-weight", type=float, default=0.0005)
    parser.add_argument("--val-size", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--input-norm", default="none", choices=("none", "dataset", "image"))
    parser.add_argument("--warmup-steps", type=int, default=0)
    parser.add_argument("--conv1-bn", action="store_true")
    parser.add_argument("--precision", default="bf16", choices=("fp32", "bf16"))
    parser.add_argument("--conv-impl", default="gemm", choices=("gemm", "native",
                                                                 "channels_last"))
    train_and_probe(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
