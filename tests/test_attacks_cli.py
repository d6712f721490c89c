"""`capsnet attack` end to end in-process on a tiny trained model and fake digits: the JSON
rows, resumed rows, detection, OOD and sanity columns, figures and the errors."""
from __future__ import annotations

import json

import pytest

from capsnet.checkpoint import save_checkpoint
from capsnet.cli.main import main
from tests.attack_models import trained
from tests.conftest import last_error_line


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("attack_model") / "tiny.pt"
    save_checkpoint(path, trained("capsnet"))
    return path


def attack(args, data_dir, out_dir):
    return main(["attack", *args, "--data-dir", str(data_dir), "--no-download",
                 "--out-dir", str(out_dir), "--device", "cpu"])


def test_json_rows_then_resumed(checkpoint, tiny_mnist_dir, tmp_path, capsys):
    args = [str(checkpoint), "--attack", "fgsm,pgd", "--eps", "0.1,0.3", "--steps", "3",
            "--n", "8", "--json", "--labels", "tiny"]
    assert attack(args, tiny_mnist_dir, tmp_path) == 0
    first = json.loads(capsys.readouterr().out)
    rows = first["rows"]
    assert [(r["attack"], r["eps"]) for r in rows] == [("fgsm", 0.1), ("fgsm", 0.3),
                                                       ("pgd", 0.1), ("pgd", 0.3)]
    for r in rows:
        assert {"model", "attack", "eps", "robust_accuracy", "loss"} <= set(r)
        assert r["model"] == "tiny" and r["loss"] == "worst" and r["n"] == 8
    assert len(list((tmp_path / "rows").glob("*.json"))) == 4
    assert (tmp_path / "accuracy-eps.png").stat().st_size > 0
    assert attack(args, tiny_mnist_dir, tmp_path) == 0
    captured = capsys.readouterr()
    assert captured.err.count("already there, skipped") == 4
    assert json.loads(captured.out)["rows"] == rows


def test_detector_ood_sanity_and_figure(checkpoint, tiny_mnist_dir, tmp_path, capsys):
    args = [str(checkpoint), "--attack", "pgd,vote-detect", "--eps", "0.3", "--steps", "3",
            "--n", "8", "--detector", "--ood", "--sanity", "--figure", "--val-n", "50",
            "--queries", "20"]
    assert attack(args, tiny_mnist_dir, tmp_path) == 0
    out = capsys.readouterr().out
    assert "reconstruction S_d %" in out and "more restarts never help the defence" in out
    assert "reconstruction test FPR %" in out
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["rows"][0]["detection"]) == {"reconstruction", "class-reconstruction",
                                                    "length", "margin"}
    assert {r["shift"] for r in results["ood"]} >= {"noise", "blur", "contrast"}
    assert (tmp_path / "diagnosis.png").stat().st_size > 0


def test_commands_into_one_folder_build_one_table_and_keep_each_others_results(
        checkpoint, tiny_mnist_dir, tmp_path, capsys):
    """A second command into the same folder adds its rows to results.json and table.md and
    keeps the first one's OOD rows and sanity checks."""
    common = [str(checkpoint), "--steps", "2", "--n", "8", "--val-n", "50", "--queries", "10"]
    assert attack([*common, "--attack", "fgsm", "--eps", "0.3", "--ood", "--sanity"],
                  tiny_mnist_dir, tmp_path) == 0
    first = json.loads((tmp_path / "results.json").read_text())
    assert attack([*common, "--attack", "pgd", "--eps", "0.1"], tiny_mnist_dir, tmp_path) == 0
    printed = capsys.readouterr().out.split("\n\n")[-1]  # the second command's own table
    results = json.loads((tmp_path / "results.json").read_text())
    assert [(r["attack"], r["eps"]) for r in results["rows"]] == [("fgsm", 0.3), ("pgd", 0.1)]
    assert results["ood"] == first["ood"] and results["sanity"] == first["sanity"]
    assert len(results["commands"]) == 2 and results["command"] == results["commands"][-1]
    table = (tmp_path / "table.md").read_text()
    assert "| fgsm |" in table and "| pgd |" in table and "more restarts never help" in table
    assert "| fgsm |" not in printed


def test_unknown_attack_is_one_line_naming_the_choices(checkpoint, tiny_mnist_dir, tmp_path,
                                                       capsys):
    assert attack([str(checkpoint), "--attack", "deepfool", "--n", "4"], tiny_mnist_dir,
                  tmp_path) == 1
    assert "unknown attack 'deepfool'; choose from fgsm, bim, pgd" in last_error_line(capsys)


def test_help_names_every_attack(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["attack", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("fgsm", "pgd-l2", "cw-l2", "square", "vote-detect"))
