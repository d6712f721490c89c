"""The memory estimate `capsnet train` prints before training against the run's measured peak,
for each CPU preset, in one run.

    python -m benchmarks.memory_estimate [--data-dir DIR] [--cases capsnet:small,em:small]

Each case is a short real run in a subprocess (one epoch of SUBSET images at the preset's
batch, validation and the whole test set): its results.json holds the estimate it printed
(``memory_estimate_bytes``: resident memory before the first step plus a fake-tensor trace
of a training step and an evaluation batch, capsnet.models.sizing.peak_estimate), the part of
it the tensors alive at once take (``memory_tensors_bytes``) and the process's measured peak
resident memory over the whole run (``memory_peak_bytes``): what it holds beyond the tensors
is the heap's fragments.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from capsnet.devices import cpu_info

GIB = 2**30
CASES = ("capsnet:paper", "capsnet:small", "efficient:small", "em:small", "capshead:small")
SUBSET, VAL_SIZE, BATCH = 512, 500, 128


def run_case(model: str, preset: str, data_dir: str | None, out: Path) -> dict:
    """One short run of ``model`` at ``preset``; its results.json."""
    command = [sys.executable, "-m", "capsnet", "train", "--model", model, "--preset", preset,
               "--epochs", "1", "--subset", str(SUBSET), "--val-size", str(VAL_SIZE),
               "--batch-size", str(BATCH), "--device", "cpu", "--no-progress",
               "--out-dir", str(out)]
    if data_dir:
        command += ["--data-dir", data_dir, "--no-download"]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "results.json").read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--cases", default=",".join(CASES), help="model:preset, comma-separated")
    args = parser.parse_args(argv)
    print(f"CPU: {cpu_info()[0]}; one epoch of {SUBSET} MNIST images at batch {BATCH}, "
          f"{VAL_SIZE} validation, the 10,000 test images; each case its own process")
    print(f"{'case':<18} {'estimate GiB':>12} {'tensors GiB':>11} {'measured GiB':>12} "
          f"{'ratio':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases.split(","):
            model, preset = case.split(":")
            results = run_case(model, preset, args.data_dir, Path(tmp) / case.replace(":", "-"))
            estimate, peak = results["memory_estimate_bytes"], results["memory_peak_bytes"]
            tensors = results["memory_tensors_bytes"]
            print(f"{case:<18} {estimate / GIB:>12.2f} {tensors / GIB:>11.2f} "
                  f"{peak / GIB:>12.2f} {estimate / peak:>6.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
