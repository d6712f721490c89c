"""benchmarks/routing_zoo.py: the protocol's settings for every row, --tiny end to end on the
fake MNIST (Efficient-CapsNet and the EM model), its table, and a second call that reads
everything back without training or measuring again."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import routing_zoo as zoo
from capsnet.checkpoint import model_from_checkpoint
from capsnet.models import count_parameters

COLUMNS = ("| model | routing | test acc | parameters | train img/s | infer img/s | "
           "epochs (min) | val>=20.0% | affine set |")


def run(tiny_mnist_dir, out, *extra) -> int:
    return zoo.main(["--tiny", "--device", "cpu", "--data-dir", str(tiny_mnist_dir),
                     "--no-download", "--out-dir", str(out), "--datasets", "mnist",
                     "--models", "efficient,em", "--subset", "60", "--target", "0.2", *extra])


def table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("| ")]


def test_tiny_zoo_trains_measures_and_reads_back(tiny_mnist_dir, tmp_path, capsys):
    out = tmp_path / "zoo"
    assert run(tiny_mnist_dir, out) == 0
    text = capsys.readouterr().out
    assert "### mnist" in text and "cpu:" in text and "1 epoch," in text
    lines = table_lines(text)
    assert lines[0] == COLUMNS and len(lines) == 4  # head, rule, two models
    report = json.loads((out / "routing_zoo.json").read_text())
    rows = report["datasets"]["mnist"]
    assert [(r["model"], r["routing"]) for r in rows] == [("efficient", "self-attention"),
                                                          ("em", "em, 2 iterations")]
    for row, line in zip(rows, lines[2:], strict=True):
        run_dir = out / "mnist" / row["model"]
        assert row["complete"] and row["epochs"] == 1 and row["test_error"] is not None
        assert row["train_images_per_second"] > 0 and row["target"] == 0.2
        measured = row["eval"]
        model = model_from_checkpoint(run_dir / "best.pt")
        assert measured["parameters"] == count_parameters(model)
        assert measured["inference"]["images_per_second"] > 0
        assert measured["inference"]["batch"] == 200  # the fake test set, one batch
        assert measured["affine"]["images"] == 200 and 0 <= measured["affine"]["accuracy"] <= 1
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[0] == row["model"] and cells[3] == f"{measured['parameters']:,}"
        assert cells[2].endswith("%") and cells[8].endswith("%")  # test, affine set
        assert cells[6] == f"1 ({row['minutes']:.1f})"
    settings = json.loads((out / "mnist" / "em" / "config.json").read_text())["settings"]
    assert (settings["model"], settings["preset"], settings["subset"]) == ("em", "small", 60)

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
    assert "| capsnet * | dynamic | - | - | - | - | - | - | - |" in text  # MNIST: affine too
    assert "| cnn * | - | - | - | - | - | - | - |" in text  # Fashion-MNIST: no affine set
    assert not (out / "mnist").exists()


def test_every_row_follows_one_protocol(tmp_path):
    args = zoo.parse_args(["--study-dir", str(tmp_path), "--datasets",
                           "mnist,fashion-mnist,mixed-20", "--epochs", "7", "--subset", "500",
                           "--target", "fashion-mnist=0.85", "--until-target"])
    assert args.models == list(zoo.DEFAULT_MODELS)
    assert args.targets == {"mnist": 0.99, "fashion-mnist": 0.85, "mixed-20": zoo.FOLDER_TARGET}
    runs = {key: zoo.run_settings(args, "mixed-20", key) for key in args.models}
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
    em3 = zoo.run_settings(args, "mnist", "em-3")
    assert (em3.model, em3.routing_iterations, em3.compile) == ("em", 3, True)
    assert runs["capsnet"].routing_iterations is None  # CapsNet keeps its preset's (3)
    assert runs["efficient"].augment == "efficient"  # its own recipe otherwise
    fashion = zoo.run_settings(args, "fashion-mnist", "cnn")
    assert (fashion.dataset, fashion.data_dir, fashion.target_accuracy) == ("fashion-mnist",
                                                                             None, 0.85)
    tiny = zoo.run_settings(zoo.parse_args(["--tiny", "--datasets", "mnist"]), "mnist", "capsnet")
    assert (tiny.preset, tiny.epochs, tiny.subset, tiny.precision) == ("small", 1, 300, "fp32")
    tiny_em = zoo.run_settings(zoo.parse_args(["--tiny", "--datasets", "mnist"]), "mnist", "em")
    assert not tiny_em.compile  # a smoke test does not wait a minute for a compile


@pytest.mark.parametrize("argv, words", [
    (["--models", "capsnet,capsule-forest"], "capsule-forest"),
    (["--datasets", "fashion-colour"], "--study-dir"),
    (["--datasets", "mnist", "--target", "high"], "--target 'high'"),
    (["--datasets", "mnist", "--target", "99"], "fractions in (0, 1]"),
])
def test_bad_arguments_are_refused(argv, words, capsys):
    with pytest.raises(SystemExit):
        zoo.parse_args(argv)
    assert words in capsys.readouterr().err
