"""benchmarks/routing_zoo.py: --tiny end to end on the fake MNIST (Efficient-CapsNet and the
EM model): its table's columns, the measurements kept beside each run and read back by a
second call; missing runs as dashes; the protocol's settings for every row."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import routing_zoo as zoo
from benchmarks import sweep
from capsnet.checkpoint import model_from_checkpoint
from capsnet.models import count_parameters

COLUMNS = ("| variant | routing | test acc | best val (epoch) | epochs (min) | train img/s | "
           "val>=20.0% | parameters | infer img/s | affine set |")


def run(tiny_mnist_dir, out, *extra) -> int:
    return zoo.main(["--tiny", "--device", "cpu", "--data-dir", str(tiny_mnist_dir),
                     "--no-download", "--out-dir", str(out), "--datasets", "mnist",
                     "--models", "efficient,em", "--subset", "60", "--target", "0.2", *extra])


def table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("| ")]


@pytest.mark.slow
def test_tiny_zoo_trains_measures_and_reads_back(tiny_mnist_dir, tmp_path, capsys):
    out = tmp_path / "zoo"
    assert run(tiny_mnist_dir, out) == 0
    text = capsys.readouterr().out
    assert "### mnist" in text and text.count("measuring inference speed and the affine") == 2
    lines = table_lines(text)
    assert lines[0] == COLUMNS and len(lines) == 4  # head, rule, two models
    rows = json.loads((out / "routing_zoo.json").read_text())["datasets"]["mnist"]["rows"]
    assert [(r["variant"], r["note"]) for r in rows] == [("efficient", "self-attention"),
                                                         ("em", "em, 2 iterations")]
    for row, line in zip(rows, lines[2:], strict=True):
        measured = row["eval"]
        model = model_from_checkpoint(out / "mnist" / row["variant"] / "best.pt")
        assert measured["parameters"] == count_parameters(model)
        assert measured["inference"]["images_per_second"] > 0
        assert measured["inference"]["batch"] == 200  # the fake test set, one batch
        assert measured["affine"]["images"] == 200
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[:2] == [row["variant"], row["note"]] and cells[3].endswith("(1)")
        assert cells[7] == f"{measured['parameters']:,}"
        assert cells[9] == f"{100 * measured['affine']['accuracy']:.2f}%"
    settings = json.loads((out / "mnist" / "em" / "config.json").read_text())["settings"]
    assert (settings["model"], settings["preset"], settings["subset"]) == ("em", "small", 60)
    assert not settings["compile"]  # a smoke test does not wait a minute for a compile

    kept = {p: p.stat().st_mtime_ns for p in out.glob("mnist/*/*")
            if p.name in ("last.pt", zoo.EVAL_FILE)}
    assert len(kept) == 4
    assert run(tiny_mnist_dir, out) == 0  # again: read back, nothing trained or measured
    again = capsys.readouterr().out
    assert again.count("not trained again") == 2 and "measuring" not in again
    assert {p: p.stat().st_mtime_ns for p in kept} == kept
    assert table_lines(again) == lines


def test_report_only_shows_missing_runs_as_dashes(tmp_path, capsys):
    out = tmp_path / "empty"
    assert zoo.main(["--report-only", "--out-dir", str(out), "--datasets", "mnist,fashion-mnist",
                     "--models", "capsnet,cnn", "--device", "cpu"]) == 0
    text = capsys.readouterr().out
    assert "| capsnet * | dynamic |" + " - |" * 8 in text  # MNIST: the affine set too
    assert "| cnn * | - |" + " - |" * 7 + "\n" in text  # Fashion-MNIST: no affine set
    assert not (out / "mnist").exists()


def test_every_row_follows_one_protocol(tmp_path):
    args = sweep.parse_args(zoo.STUDY, [
        "--study-dir", str(tmp_path), "--datasets", "mnist,fashion-mnist,mixed-20",
        "--epochs", "7", "--subset", "500", "--target", "fashion-mnist=0.85", "--until-target"])
    assert args.variants == list(zoo.STUDY.default_variants)
    assert args.targets == {"mnist": (0.99,), "fashion-mnist": (0.85,),
                            "mixed-20": (zoo.FOLDER_TARGET,)}
    runs = {key: sweep.run_settings(zoo.STUDY, args, "mixed-20", key)[0] for key in args.variants}
    for key, s in runs.items():
        assert (s.seed, s.epochs, s.subset, s.val_size, s.target_accuracy) == (1, 7, 500, None,
                                                                                0.8)
        assert (s.dataset, s.data_dir, s.image_size) == ("folder", str(tmp_path / "mixed-20"), 32)
        assert s.out_dir == str(Path("runs/routing-zoo") / "mixed-20" / key)
    assert [runs[k].routing for k in ("capsnet", "capsnet-inverted-attention",
                                      "capsnet-self-attention")] == [
        "dynamic", "inverted-attention", "self-attention"]
    assert (runs["em"].model, runs["em"].preset, runs["em"].compile) == ("em", "small", True)
    assert not any(s.compile for key, s in runs.items() if key != "em")
    assert runs["em"].routing_iterations == 2  # the paper's 3 learn far more slowly
    em3 = sweep.run_settings(zoo.STUDY, args, "mnist", "em-3")[0]
    assert (em3.model, em3.routing_iterations, em3.compile, em3.target_accuracy) == (
        "em", 3, True, 0.99)
    assert runs["capsnet"].routing_iterations is None  # CapsNet keeps its preset's (3)
    assert runs["efficient"].augment == "efficient"  # its own recipe otherwise
    fashion = sweep.run_settings(zoo.STUDY, args, "fashion-mnist", "cnn")[0]
    assert (fashion.dataset, fashion.data_dir, fashion.target_accuracy) == ("fashion-mnist",
                                                                             None, 0.85)
    tiny_args = sweep.parse_args(zoo.STUDY, ["--tiny", "--datasets", "mnist"])
    tiny = sweep.run_settings(zoo.STUDY, tiny_args, "mnist", "capsnet")[0]
    assert (tiny.preset, tiny.epochs, tiny.subset, tiny.precision) == ("small", 1, 300, "fp32")
