"""CapsNet against a plain small CNN on own-data study sets, side by side: both trained the
same number of epochs (5) on the same images, validation-selected, tested once.

    python benchmarks/make_study_sets.py --out /tmp/study
    python benchmarks/own_data_study.py --study-dir /tmp/study --out-dir runs/study

CapsNet runs with capsnet's defaults (``capsnet train --dataset folder``); the CNN is
``--model cnn --preset tiny`` (two 5x5 convolutions with max-pooling, FC 64; Adam 1e-3) at
batch 64. ``--capsnet-option`` passes options to the CapsNet runs only (e.g.
``--capsnet-option=--input-norm=none`` for the paper's raw pixels, the "before" column).
Fashion-MNIST grey is read as IDX files (--sets fashion-grey). Each run lives in
--out-dir/<set>/<model>; calling again reads finished runs back instead of training them.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from capsnet.cli.main import main as capsnet_main  # noqa: E402
from capsnet.tuning.hardware import cpu_info  # noqa: E402

EPOCHS = 5
CNN_BATCH = 64  # the plain CNN's usual batch; CapsNet keeps its own default (128)
FASHION_GREY_SUBSET = 3000  # Fashion-MNIST grey: a small set like the folders


def set_options(name: str, study_dir: Path) -> tuple[str, ...]:
    """`capsnet train` options that read study set ``name``."""
    if name == "fashion-grey":
        return ("--dataset", "fashion-mnist", "--subset", str(FASHION_GREY_SUBSET),
                "--val-size", str(FASHION_GREY_SUBSET // 10))
    options = ("--dataset", "folder", "--data-dir", str(study_dir / name))
    return options + (("--image-size", "32") if name == "mixed-20" else ())


def train_once(run_dir: Path, argv: list[str]) -> dict:
    """results.json of the run in ``run_dir``, training it first unless it finished."""
    results = run_dir / "results.json"
    if not (results.is_file() and json.loads(results.read_text()).get("complete", True)):
        code = capsnet_main(["train", *argv, "--out-dir", str(run_dir), "--no-progress"])
        if code != 0:
            raise SystemExit(f"capsnet train failed for {run_dir} (exit {code})")
    return json.loads(results.read_text())


def tested(results: dict) -> float:
    """Test accuracy of the validation-selected model (the final one without validation)."""
    return results.get("best", results["final"])["accuracy"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study-dir", required=True, help="where make_study_sets.py wrote")
    parser.add_argument("--out-dir", default="runs/study")
    parser.add_argument("--sets", nargs="+",
                        default=["fashion-colour", "mixed-20", "large-48", "fashion-grey",
                                 "textured"])
    parser.add_argument("--models", nargs="+", default=["capsnet", "cnn"])
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--capsnet-option", action="append", default=[],
                        help="an option for the CapsNet runs only (repeatable)")
    parser.add_argument("--label", default="capsnet", help="run folder name of the CapsNet runs")
    args = parser.parse_args(argv)
    rows = []
    for name in args.sets:
        data = [*set_options(name, Path(args.study_dir)), "--epochs", str(args.epochs)]
        row = {"set": name}
        if "capsnet" in args.models:
            row[args.label] = tested(train_once(Path(args.out_dir) / name / args.label,
                                                [*data, *args.capsnet_option]))
        if "cnn" in args.models:
            row["cnn-tiny"] = tested(train_once(
                Path(args.out_dir) / name / "cnn-tiny",
                [*data, "--model", "cnn", "--preset", "tiny", "--batch-size", str(CNN_BATCH)]))
        rows.append(row)
    model_name, flags = cpu_info()
    bf16 = "AVX512-BF16" if "avx512_bf16" in flags else "no AVX512-BF16"
    print(f"\n{args.epochs} epochs each, test accuracy of the validation-selected epoch; "
          f"CPU: {model_name or 'unknown'} ({bf16})")
    columns = [c for c in (args.label, "cnn-tiny") if any(c in r for r in rows)]
    print("| set | " + " | ".join(columns) + " |")
    print("| --- |" + " --- |" * len(columns))
    for row in rows:
        print(f"| {row['set']} | " + " | ".join(
            f"{100 * row[c]:.2f}%" if c in row else "" for c in columns) + " |")
    (Path(args.out_dir) / f"study-{args.label}.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
