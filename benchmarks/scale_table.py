"""Parameters, peak RSS and images/s of one training step of the capsule head ('capshead')
at 64, 96, 128 and 224 px with 10, 100 and 1,000 classes (RGB, batch 16, Adam), each in a
fresh process so that its peak RSS is its own; the older models' parameter counts beside it
(counted on the meta device, nothing allocated: most of the large ones cannot be built).

    python -m benchmarks.scale_table --out results/bigger-images [--threads 2]"""
from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

SIZES = (64, 96, 128, 224)
CLASSES = (10, 100, 1000)
OLD_MODELS = ("capsnet", "efficient", "em", "cnn")
BATCH = 16
STEPS = 3  # the first warms up; images/s is the best of the others


def one_step(model_name: str, size: int, classes: int, batch: int, threads: int) -> dict:
    """Train ``STEPS`` steps in this process; parameters, images/s and peak RSS (GiB)."""
    import torch

    from capsnet import create_model
    from capsnet.losses import model_loss
    from capsnet.models import count_parameters

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = create_model(model_name, image_size=size, in_channels=3, num_classes=classes,
                         input_norm="image")
    optimizer = torch.optim.Adam(model.parameters(), 1e-3)
    images, labels = torch.rand(batch, 3, size, size), torch.randint(0, classes, (batch,))
    seconds = []
    for _ in range(STEPS):
        start = time.perf_counter()
        loss = model_loss(model(images, labels), images, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        seconds.append(time.perf_counter() - start)
    return {"model": model_name, "image_size": size, "classes": classes, "batch": batch,
            "threads": threads, "parameters": count_parameters(model),
            "images_per_second": batch / min(seconds[1:]),
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20}


def old_parameters(size: int, classes: int) -> dict:
    """The older models' parameter counts (paper presets, CapsNet's Conv1 at stride 1)."""
    from capsnet.models import make_config
    from capsnet.models.sizing import parameter_count
    return {name: parameter_count(make_config(name, image_size=size, in_channels=3,
                                              num_classes=classes)) for name in OLD_MODELS}


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else the platform's machine type."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def millions(n: int) -> str:
    return f"{n / 1e6:,.1f}M"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("results/bigger-images"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--model", default="capshead")
    p.add_argument("--one", nargs=2, type=int, metavar=("SIZE", "CLASSES"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(one_step(args.model, *args.one, BATCH, args.threads)))
        return 0
    import warnings
    warnings.simplefilter("ignore")
    rows = []
    for size in SIZES:
        for classes in CLASSES:
            out = subprocess.run([sys.executable, "-m", "benchmarks.scale_table", "--model",
                                  args.model, "--threads", str(args.threads), "--one",
                                  str(size), str(classes)], capture_output=True, text=True)
            if out.returncode:
                raise SystemExit(out.stderr)
            row = json.loads(out.stdout.splitlines()[-1]) | {"old": old_parameters(size, classes)}
            rows.append(row)
            print(row, flush=True)
    machine = f"{cpu_name()}, {args.threads} thread(s)"
    heads = ["size", "classes", f"{args.model} parameters", "peak RSS (GiB)", "train img/s",
             *(f"{name} parameters" for name in OLD_MODELS)]
    lines = ["| " + " | ".join(heads) + " |", "|" + " --- |" * len(heads)]
    for r in rows:
        lines.append("| " + " | ".join([
            str(r["image_size"]), f"{r['classes']:,}", millions(r["parameters"]),
            f"{r['peak_rss_gib']:.2f}", f"{r['images_per_second']:.1f}",
            *(millions(r["old"][name]) for name in OLD_MODELS)]) + " |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scale.json").write_text(json.dumps({"machine": machine, "batch": BATCH,
                                                     "rows": rows}, indent=2) + "\n")
    text = (f"One training step, batch {BATCH}, RGB, Adam; {machine}; `python -m "
            f"benchmarks.scale_table --threads {args.threads}`\n\n" + "\n".join(lines))
    (args.out / "scale.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
