"""Recipes: the paper's run unchanged, the fast recipe's settings, its EMA as the model that
is validated, saved and tested, and resumes that continue schedule and EMA bit-exactly."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from capsnet.checkpoint import load_checkpoint, model_from_checkpoint
from capsnet.cli.args import settings_from_args
from capsnet.cli.main import build_parser, main
from capsnet.export import export_weights
from capsnet.training import TrainSettings, fit
from capsnet.training.fit import ClassifyTask
from capsnet.training.loop import evaluate
from capsnet.training.metrics_log import read_metrics
from capsnet.training.settings import FAST_RECIPE, PAPER_RECIPE

FIXED_KERNELS = {"precision": "fp32"}
QUIET = {"log": lambda _: None}


def test_the_paper_recipe_is_the_default_and_unchanged():
    s = TrainSettings()
    assert (s.recipe, s.epochs, s.batch_size, s.lr, s.lr_decay, s.max_shift) == (
        "paper", 10, 128, 1e-3, 0.96, 2)
    assert (s.schedule, s.warmup_epochs, s.ema_decay) == ("exp", 0.0, 0.0)


def test_the_fast_recipe_fills_what_is_not_given():
    s = TrainSettings(recipe="fast")
    assert (s.epochs, s.batch_size, s.schedule, s.warmup_epochs, s.min_lr, s.ema_decay,
            s.ema_warmup, s.max_shift) == (
        FAST_RECIPE["epochs"], FAST_RECIPE["batch_size"], FAST_RECIPE["schedule"],
        FAST_RECIPE["warmup_epochs"], FAST_RECIPE["min_lr"], FAST_RECIPE["ema_decay"],
        FAST_RECIPE["ema_warmup"], FAST_RECIPE["max_shift"])
    assert s.lr == pytest.approx(FAST_RECIPE["lr_scale"] * 1e-3)
    assert TrainSettings(recipe="fast", model="cnn").lr == pytest.approx(
        FAST_RECIPE["lr_scale"] * 1e-4)  # the wide CNN's own rate, scaled alike
    given = TrainSettings(recipe="fast", epochs=4, lr=1e-3, ema_decay=0.0, schedule="exp")
    assert (given.epochs, given.lr, given.ema_decay, given.schedule) == (4, 1e-3, 0.0, "exp")
    assert PAPER_RECIPE["epochs"] == 10


def test_settings_saved_before_recipes_load_as_the_paper_recipe():
    old = {k: v for k, v in TrainSettings().to_dict().items()
           if k not in ("recipe", "schedule", "warmup_epochs", "min_lr", "ema_decay",
                        "ema_warmup")}
    assert TrainSettings.from_dict(old) == TrainSettings()


@pytest.mark.parametrize("bad, match", [
    ({"recipe": "slow"}, "unknown recipe"), ({"schedule": "step"}, "unknown schedule"),
    ({"ema_decay": 1.0}, "ema_decay"), ({"warmup_epochs": -1.0}, "warmup_epochs"),
    ({"warmup_epochs": 11.0}, "warmup_epochs"), ({"epochs": 0}, "epochs must be at least 1"),
    ({"schedule": "onecycle"}, "choose from exp, cosine"),
    ({"cuda_graph": True, "precision": "fp16"}, "cuda_graph"),
])
def test_unworkable_schedules_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        TrainSettings(**bad)


def test_cli_options_switch_one_ingredient_at_a_time():
    args = build_parser().parse_args(["train", "--recipe", "fast", "--ema-decay", "0",
                                      "--schedule", "exp", "--warmup-epochs", "2.5",
                                      "--no-ema-warmup", "--batch-size", "64"])
    s = settings_from_args(args)
    assert (s.recipe, s.ema_decay, s.schedule, s.warmup_epochs, s.ema_warmup, s.batch_size) == (
        "fast", 0.0, "exp", 2.5, False, 64)
    assert s.epochs == FAST_RECIPE["epochs"] and s.min_lr == FAST_RECIPE["min_lr"]
    repeat = settings_from_args(build_parser().parse_args(["repeat", "--recipe", "fast"]))
    assert repeat.recipe == "fast" and repeat.ema_decay == FAST_RECIPE["ema_decay"]
    paper = settings_from_args(build_parser().parse_args(["train"]))
    assert paper == TrainSettings(out_dir=paper.out_dir)


def tiny(data_dir, out_dir, **extra) -> TrainSettings:
    values = dict(preset="small", data_dir=str(data_dir), download=False, subset=100,
                  val_size=50, batch_size=20, out_dir=str(out_dir), progress=False,
                  **FIXED_KERNELS)
    return TrainSettings(**{**values, **extra})


def test_a_paper_run_trains_as_before_recipes(tiny_mnist_dir, tmp_path):
    """Losses and weights of a paper-recipe run on the same fake digits, pinned: those of the
    code before recipes, per-step schedules and the EMA (commit 6c7eb20), pinned again when
    the shifts came to be drawn for a whole epoch at its start (capsnet.data.augment_shift)."""
    fit(tiny(tiny_mnist_dir, tmp_path, epochs=2, seed=3), **QUIET)
    rows = read_metrics(tmp_path)
    assert [r["lr"] for r in rows] == pytest.approx([1e-3, 0.96e-3], rel=1e-12)
    assert [r["train_loss"] for r in rows] == pytest.approx([0.7699219512939454,
                                                             0.6065558624267579], rel=1e-5)
    weights = load_checkpoint(tmp_path / "last.pt")
    assert float(weights["state_dict"]["conv1.weight"].double().sum()) == pytest.approx(
        8.529879675916163, rel=1e-5)
    assert float(weights["state_dict"]["digit_caps.W"].double().abs().sum()) == pytest.approx(
        3050.4005199846943, rel=1e-5)
    assert not {"raw_state_dict", "ema"} & set(weights)  # the paper's checkpoint, as before


def test_fast_run_validates_saves_and_tests_the_ema(tiny_mnist_dir, tmp_path):
    settings = tiny(tiny_mnist_dir, tmp_path, recipe="fast", epochs=2)
    results = fit(settings, **QUIET)
    last = load_checkpoint(tmp_path / "last.pt")
    assert last["ema"]["updates"] == 2 * 5  # 100 images in batches of 20, two epochs
    ema, raw = last["state_dict"], last["raw_state_dict"]
    assert not torch.equal(ema["conv1.weight"], raw["conv1.weight"])
    # the validation accuracy logged is the EMA's (the checkpoint's model) ...
    data = ClassifyTask(settings)
    data.prepare(torch.device("cpu"))
    val = evaluate(model_from_checkpoint(tmp_path / "last.pt"), *data.validation())
    assert val.accuracy == pytest.approx(read_metrics(tmp_path)[-1]["val_accuracy"])
    # ... and beside it the trained weights' own, so one run ablates the average
    raw_model = model_from_checkpoint(tmp_path / "last.pt")
    raw_model.load_state_dict(raw)
    raw_val = evaluate(raw_model, *data.validation())
    assert raw_val.accuracy == pytest.approx(read_metrics(tmp_path)[-1]["val_accuracy_raw"])
    # ... and the tested model is the checkpoint's (what evaluate, predict, export load)
    best = model_from_checkpoint(tmp_path / "best.pt")
    test = evaluate(best, data.test.images, data.test.labels)
    assert test.accuracy == pytest.approx(results["best"]["accuracy"])
    # the float16 export carries the EMA too
    exported = load_file(export_weights(tmp_path / "best.pt", tmp_path / "best.safetensors"))
    saved = load_checkpoint(tmp_path / "best.pt")["state_dict"]
    assert all(torch.equal(exported[k], v.half()) for k, v in saved.items())


def test_fast_cli_run_stopped_and_resumed_equals_an_uninterrupted_one(tiny_mnist_dir, tmp_path):
    """Stopped after epoch 1 of 2 by its time limit, resumed without --epochs (the run's own
    two): weights, EMA, optimiser, schedule and losses as if never stopped."""
    common = ["train", "--recipe", "fast", "--preset", "small", "--data-dir",
              str(tiny_mnist_dir), "--no-download", "--subset", "100", "--val-size", "50",
              "--batch-size", "20", "--epochs", "2", "--no-progress", "--precision", "fp32"]
    full, part = tmp_path / "full", tmp_path / "part"
    assert main([*common, "--out-dir", str(full)]) == 0
    assert main([*common, "--out-dir", str(part), "--time-limit", "1e-9"]) == 0
    assert json.loads((part / "results.json").read_text())["complete"] is False
    assert main(["train", "--resume", str(part), "--no-progress"]) == 0
    resumed, uninterrupted = (load_checkpoint(d / "last.pt") for d in (part, full))
    assert resumed["epoch"] == uninterrupted["epoch"] == 2
    for key in ("state_dict", "raw_state_dict"):
        for name, tensor in uninterrupted[key].items():
            torch.testing.assert_close(resumed[key][name], tensor, rtol=0, atol=0)
    for i, state in uninterrupted["optimizer"]["state"].items():
        torch.testing.assert_close(resumed["optimizer"]["state"][i]["exp_avg"],
                                   state["exp_avg"], rtol=0, atol=0)
    assert resumed["scheduler"] == uninterrupted["scheduler"]
    assert resumed["ema"] == uninterrupted["ema"]
    assert ([(r["lr"], r["train_loss"], r["val_accuracy"]) for r in read_metrics(part)]
            == [(r["lr"], r["train_loss"], r["val_accuracy"]) for r in read_metrics(full)])
    assert json.loads((part / "results.json").read_text())["complete"] is True


def test_a_finished_cosine_run_resumed_with_more_epochs_follows_the_longer_schedule(
        tiny_mnist_dir, tmp_path, capsys):
    """A 1-epoch cosine run resumed with --epochs 2 says its schedule was re-planned, and its
    second epoch starts at the rate a 2-epoch run has there, not at the 1-epoch run's floor."""
    common = ["train", "--preset", "small", "--data-dir", str(tiny_mnist_dir), "--no-download",
              "--subset", "100", "--val-size", "50", "--batch-size", "20", "--no-progress",
              "--precision", "fp32", "--schedule", "cosine",
              "--warmup-epochs", "0", "--min-lr", "1e-5"]
    full, extended = tmp_path / "full", tmp_path / "extended"
    assert main([*common, "--epochs", "2", "--out-dir", str(full)]) == 0
    assert main([*common, "--epochs", "1", "--out-dir", str(extended)]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(extended), "--epochs", "2", "--no-progress"]) == 0
    assert ("the cosine schedule planned to end after epoch 1 now ends after epoch 2"
            in capsys.readouterr().out)
    second_epoch_rate = read_metrics(full)[1]["lr"]
    assert 1e-5 < second_epoch_rate < 1e-3
    assert read_metrics(extended)[1]["lr"] == pytest.approx(second_epoch_rate)
