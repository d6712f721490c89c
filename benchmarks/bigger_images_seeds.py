"""The bigger-images study over seeds: each (set, model)'s test accuracy per seed, their mean
and standard deviation, from the JSON files `python -m benchmarks.bigger_images` wrote (one
--out-dir per seed):

    python -m benchmarks.bigger_images_seeds runs/bi-s0 runs/bi-s1 runs/bi-s2 \\
        --out results/bigger-images/seeds"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from capsnet.atomic import write_json, write_text
from capsnet.writers import markdown_table

STUDY_JSON = "bigger_images.json"


def accuracies(out_dirs: list[Path]) -> dict[tuple[str, str], dict[int, float]]:
    """(set, model) -> {seed: test accuracy} over every run that finished."""
    found: dict[tuple[str, str], dict[int, float]] = {}
    for out_dir in out_dirs:
        record = json.loads((out_dir / STUDY_JSON).read_text())
        for dataset, table in record["datasets"].items():
            for row in table["rows"]:
                if row["complete"] and row["test_accuracy"] is not None:
                    found.setdefault((dataset, row["variant"]), {})[record["seed"]] = \
                        row["test_accuracy"]
    return found


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dirs", nargs="+", type=Path)
    p.add_argument("--out", type=Path, default=None, help="write seeds.md and seeds.json here")
    args = p.parse_args(argv)
    found = accuracies(args.out_dirs)
    rows, record = [], []
    for (dataset, model), by_seed in sorted(found.items()):
        values = [by_seed[s] for s in sorted(by_seed)]
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        rows.append([dataset, model, ", ".join(f"{100 * v:.1f}%" for v in values),
                     f"**{100 * statistics.mean(values):.1f}%** ± {100 * spread:.1f}"])
        record.append({"dataset": dataset, "model": model, "seeds": sorted(by_seed),
                       "test_accuracy": values})
    table = markdown_table(["set", "model", "test accuracy per seed", "mean ± sd"], rows)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        write_text(args.out / "seeds.md", table + "\n")
        write_json(args.out / "seeds.json", record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
