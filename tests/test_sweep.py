"""benchmarks/sweep.py, the one driver of the routing zoo, time to accuracy and own-data
study: a tiny sweep on the fake MNIST learns, is stopped by a time limit, resumes and reads
back; its table has one row per variant with the sweep's columns; the first epoch at a
threshold by hand; the studies' declarations become the right `capsnet train` settings."""
from __future__ import annotations

import json

import pytest

from benchmarks import own_data_study, sweep
from benchmarks import time_to_accuracy as tta
from capsnet.checkpoint import load_checkpoint
from capsnet.training.metrics_log import read_metrics

CHANCE = 0.1  # ten classes
HEAD = ("| variant | test acc | best val (epoch) | epochs (min) | train img/s | val>=10.0% | "
        "val>=99.9% |")


def test_first_reaching_counts_epochs_and_their_seconds():
    rows = [{"epoch": 1, "epoch_seconds": 60.0, "val_accuracy": 0.98},
            {"epoch": 2, "epoch_seconds": 90.0, "val_accuracy": 0.991},
            {"epoch": 3, "epoch_seconds": 30.0, "val_accuracy": 0.989},
            {"epoch": 3, "epoch_seconds": 30.0, "val_accuracy": 0.996}]  # resumed: the last
    assert sweep.first_reaching(rows, 0.99) == {"epoch": 2, "minutes": 2.5}
    assert sweep.first_reaching(rows, 0.995) == {"epoch": 3, "minutes": 3.0}
    assert sweep.first_reaching(rows, 0.999) is None
    assert sweep.first_reaching([], 0.99) is None


def test_targets_for_every_data_set_or_by_name():
    default = {"mnist": (0.99,), "textured": (0.8,)}.get
    datasets = ["mnist", "textured"]
    assert sweep.parse_targets(None, datasets, default) == {"mnist": (0.99,), "textured": (0.8,)}
    assert sweep.parse_targets("0.5,0.6", datasets, default) == {"mnist": (0.5, 0.6),
                                                                 "textured": (0.5, 0.6)}
    assert sweep.parse_targets("textured=0.7", datasets, default) == {"mnist": (0.99,),
                                                                      "textured": (0.7,)}


def run(tiny_mnist_dir, out, *extra) -> int:
    return tta.main(["--tiny", "--device", "cpu", "--data-dir", str(tiny_mnist_dir),
                     "--no-download", "--out-dir", str(out), "--target", "0.1,0.999", *extra])


def table_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")]
            for line in text.splitlines() if line.startswith("| ")]


def test_tiny_sweep_learns_resumes_and_reads_back(tiny_mnist_dir, tmp_path, capsys):
    out = tmp_path / "tta"
    assert run(tiny_mnist_dir, out, "--time-limit", "0.05") == 0  # paper: 1 epoch, then out
    assert [r["epoch"] for r in read_metrics(out / "mnist" / "paper")] == [1]
    assert not (out / "mnist" / "fast").exists()  # no time left for the second recipe
    assert "| paper * |" in capsys.readouterr().out  # not finished
    assert run(tiny_mnist_dir, out) == 0  # resumes paper, trains fast
    text = capsys.readouterr().out
    assert "resuming" in text and "CPU" in text
    [head, _, *cells] = table_rows(text)
    assert "| " + " | ".join(head) + " |" == HEAD
    assert [row[0] for row in cells] == ["paper", "fast"]
    rows = json.loads((out / "time_to_accuracy.json").read_text())["datasets"]["mnist"]["rows"]
    for row, line in zip(rows, cells, strict=True):
        assert row["complete"] and row["epochs"] == 2
        assert line[1] == f"{100 * row['test_accuracy']:.2f}%" and line[3].startswith("2 (")
        assert row["reached"]["0.999"] is None and line[6] == "-"  # 99.9% on noisy data: never
    fast = rows[1]
    assert fast["test_accuracy"] > 2.5 * CHANCE  # the bars of the fake digits are learnt
    assert fast["reached"]["0.100"]["epoch"] in (1, 2) and line[5].startswith("ep ")
    assert (out / "time_to_accuracy.md").read_text().count("| fast |") == 1
    settings = load_checkpoint(out / "mnist" / "fast" / "last.pt")["train_settings"]
    assert (settings["recipe"], settings["preset"], settings["subset"]) == ("fast", "small", 300)
    assert (out / "mnist" / "fast" / "command.txt").read_text().startswith(
        "capsnet train --dataset mnist")

    written = {r: (out / "mnist" / r / "last.pt").stat().st_mtime_ns for r in ("paper", "fast")}
    assert run(tiny_mnist_dir, out) == 0  # again: both complete, nothing trained
    assert {r: (out / "mnist" / r / "last.pt").stat().st_mtime_ns for r in written} == written
    again = capsys.readouterr().out
    assert again.count("not trained again") == 2 and table_rows(again) == [head, _, *cells]


def test_study_declarations_become_capsnet_train_settings(tmp_path):
    args = sweep.parse_args(own_data_study.STUDY, [
        "--study-dir", str(tmp_path), "--datasets", "mixed-20,fashion-grey",
        "--models", "capsnet,capsnet-paper-pixels,capsnet-stride-1,cnn-tiny"])
    assert args.seed == 0 and args.targets["mixed-20"] == (own_data_study.TARGET,)
    runs = {v: sweep.run_settings(own_data_study.STUDY, args, "mixed-20", v)[0]
            for v in args.variants}
    for s in runs.values():
        assert (s.dataset, s.data_dir, s.image_size, s.epochs, s.seed) == (
            "folder", str(tmp_path / "mixed-20"), 32, 5, 0)
    assert (runs["capsnet"].input_norm, runs["capsnet-paper-pixels"].input_norm) == ("auto",
                                                                                     "none")
    assert runs["capsnet-stride-1"].conv1_stride == 1
    cnn = runs["cnn-tiny"]
    assert (cnn.model, cnn.preset, cnn.batch_size) == ("cnn", "tiny", own_data_study.CNN_BATCH)
    grey, options = sweep.run_settings(own_data_study.STUDY, args, "fashion-grey", "capsnet")
    assert (grey.dataset, grey.subset, grey.val_size) == ("fashion-mnist", 3000, 300)
    assert "--out-dir" in options and grey.out_dir.endswith("fashion-grey/capsnet")
    paper = sweep.run_settings(tta.STUDY, sweep.parse_args(tta.STUDY, []), "mnist", "paper")[0]
    fast = sweep.run_settings(tta.STUDY, sweep.parse_args(tta.STUDY, []), "mnist", "fast")[0]
    assert (paper.epochs, fast.epochs, fast.recipe) == (tta.PAPER_EPOCHS, 15, "fast")


@pytest.mark.parametrize("argv, words", [
    (["--recipes", "paper,slow"], "'slow'"),
    (["--datasets", "mnist,imagenet"], "'imagenet'"),
    (["--datasets", "textured"], "--study-dir"),
    (["--target", "high"], "--target 'high'"),
    (["--target", "99"], "fractions in (0, 1]"),
])
def test_bad_arguments_are_refused(argv, words, capsys):
    with pytest.raises(SystemExit):
        sweep.parse_args(tta.STUDY, argv)
    assert words in capsys.readouterr().err
