"""benchmarks/gpu_campaign.py: every stage end to end with --tiny on the fake MNIST, a second
call that trains nothing again, resumes of runs stopped by the time limit or given more
epochs, --finish, and an import that pulls in no web framework (the GPU image has no Flask)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from benchmarks import campaign_runs, gpu_campaign
from benchmarks.campaign_health import health_check, print_health
from benchmarks.campaign_runs import Budget
from capsnet.training.metrics_log import read_metrics
from capsnet.training.settings import TrainSettings

REPO = Path(__file__).resolve().parents[1]
STAGE_FILES = [f"{stage}.json" for stage in gpu_campaign.STAGES]


def campaign(tiny_mnist_dir, out, work, *args) -> int:
    return gpu_campaign.main([*args, "--tiny", "--device", "cpu", "--data-dir",
                              str(tiny_mnist_dir), "--out", str(out), "--work", str(work)])


def records(out) -> dict:
    return {name: json.loads((out / name).read_text()) for name in STAGE_FILES}


def checkpoint_times(work) -> dict:
    return {str(p): p.stat().st_mtime_ns for p in sorted(work.rglob("*.pt"))}


def epochs_logged(run_dir) -> list[int]:
    return [row["epoch"] for row in read_metrics(run_dir)]


def test_importing_the_campaign_pulls_in_no_flask():
    """The device image has python3, torch, numpy, pillow, matplotlib, safetensors and tqdm
    only: no Flask, ONNX, SciPy or Playwright may be imported on the way."""
    code = ("import sys; import benchmarks.gpu_campaign; "
            "absent = {'flask', 'onnx', 'onnxruntime', 'scipy', 'playwright'}; "
            "assert not absent & set(sys.modules), absent & set(sys.modules)")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, check=True, timeout=120)


def test_help_explains_the_stages_and_the_budget(capsys):
    with pytest.raises(SystemExit) as exit_info:
        gpu_campaign.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for word in [*gpu_campaign.STAGES, "all", "--minutes", "--out", "--work", "--data-dir",
                 "--device", "--epochs", "--seeds", "--tiny", "--finish"]:
        assert word in text


def test_the_health_check_names_the_device_plan_step_and_memory(capsys):
    settings = TrainSettings(preset="small", precision="fp32")
    record = health_check(torch.device("cpu"), settings, batch=4, steps=1)
    assert record["name"] and record["threads"] >= 1 and record["precision"] == "fp32"
    assert record["step_ms"] > 0 and record["memory_measured_by"] == "live CPU tensors"
    assert 0.75 <= record["estimate_over_measured"] <= 1.25
    print_health(record)
    out = capsys.readouterr().out
    assert out.count("health: ") == 3 and "memory estimate" in out


def test_a_failed_compile_case_leaves_the_rerun_to_a_call_with_time(tmp_path, monkeypatch):
    """torch.compile failing late in a call: its error is kept and the other cases wait for
    the next call instead of overrunning this one; that call runs them without it."""
    runs = []

    def fake_bench(argv):
        cases = argv[argv.index("--cases") + 1].split(",")
        runs.append(cases)
        if gpu_campaign.COMPILE_CASE in cases:
            raise RuntimeError("no Triton")
        (tmp_path / "cases.json").write_text(json.dumps({"cases": dict.fromkeys(cases, {})}))

    monkeypatch.setattr(gpu_campaign.bench, "main", fake_bench)
    monkeypatch.setattr(gpu_campaign.bench, "cases_for",
                        lambda device: ["capsnet", gpu_campaign.COMPILE_CASE])
    args = gpu_campaign.parse_args(["--out", str(tmp_path), "--data-dir", str(tmp_path)])
    c = gpu_campaign.Campaign(args, torch.device("cpu"), tmp_path, tmp_path, [])
    record = {}
    no_time = Budget(time.monotonic() + 10.0)
    assert gpu_campaign.bench_cases(c, tmp_path, no_time, record) is None
    assert record["compile_error"].startswith("RuntimeError: no Triton")
    time_left = Budget(time.monotonic() + 3600.0)
    done = gpu_campaign.bench_cases(c, tmp_path, time_left, record)
    assert set(done["cases"]) == {"capsnet"} and "compile_error" in done
    assert runs == [["capsnet", gpu_campaign.COMPILE_CASE], ["capsnet"]]


def test_a_budget_leaves_room_for_setup_an_epoch_and_the_test():
    budget = Budget(time.monotonic() + 100.0, setup=10.0, final=20.0, unknown_epoch=60.0)
    assert budget.fits(None) and budget.fits(65.0) and not budget.fits(75.0)
    assert 69.0 < budget.time_limit() <= 70.0
    assert 59.0 < budget.capped(1.0).left() <= 60.0 and budget.capped(None) is budget
    assert Budget(time.monotonic() - 1.0).time_limit() == 0.0


@pytest.mark.slow
def test_tiny_campaign_runs_every_stage_then_skips_and_resumes(tiny_mnist_dir, tmp_path):
    work = tmp_path / "work"
    assert campaign(tiny_mnist_dir, tmp_path / "out1", work) == 0
    first = records(tmp_path / "out1")
    for name, record in first.items():
        assert record["complete"] is True and record["tiny"] is True, name
        assert "error" not in record, record.get("error")
    bench = first["bench.json"]
    assert {"capsnet", "capsnet-fp32-gemm", "capsnet-bf16-gemm"} <= set(bench["cases"]["cases"])
    assert bench["epoch"]["epoch_seconds"] > 0 and "skipped" in bench["cuda_graphs"]
    assert bench["epoch"]["epoch"] == 2 and bench["epoch"]["first_epoch_seconds"] > 0
    health = json.loads((tmp_path / "out1" / "health.json").read_text())
    assert health["complete"] and health["step_ms"] > 0 and health["precision"] == "fp32"
    assert 0.75 <= health["estimate_over_measured"] <= 1.25
    assert "health: one training step" in (tmp_path / "out1" / "campaign.log").read_text()
    paper = first["paper.json"]
    assert [run["epochs_done"] for run in paper["seeds"]] == [1, 1, 1]
    assert all("best" in run["test"] for run in paper["seeds"])
    assert paper["summary"]["seeds"] == [1, 2, 3] and paper["summary"]["ensemble_size"] == 3
    assert paper["weights"]["file"] == "paper-capsnet.safetensors"
    assert (tmp_path / "out1" / "paper-capsnet.safetensors").stat().st_size <= 16 * 2**20
    assert first["cnn.json"]["run"]["test"]["best"]["accuracy"] >= 0
    affnist = first["affnist.json"]
    assert [row["model"] for row in affnist["comparison"]] == ["capsnet", "cnn"]
    for row in affnist["comparison"]:  # matched: each at or above the level both reached
        assert row["epoch"] >= 1 and row["val_accuracy"] >= row["matched_val_accuracy"]
    assert all(run["val_accuracy_at_stop"] is not None for run in affnist["runs"])
    assert 0 <= first["multimnist.json"]["test_error"] <= 1
    assert first["multimnist.json"]["test_pairs"] == gpu_campaign.TINY_TEST

    # a second call trains nothing: every run and part is done
    before = checkpoint_times(work)
    assert campaign(tiny_mnist_dir, tmp_path / "out2", work) == 0
    assert checkpoint_times(work) == before
    second = records(tmp_path / "out2")
    assert second["paper.json"]["summary"] == paper["summary"]
    assert set(second["paper.json"]["actions"].values()) == {"done before this call (skipped)"}
    assert second["bench.json"]["cases"] == bench["cases"]

    # more epochs: each seed resumes from epoch 1, the summary is made again
    assert campaign(tiny_mnist_dir, tmp_path / "out3", work, "paper", "--epochs", "2") == 0
    third = json.loads((tmp_path / "out3" / "paper.json").read_text())
    assert [run["epochs_done"] for run in third["seeds"]] == [2, 2, 2] and third["summary"]
    assert epochs_logged(work / "paper" / "seed-1") == [1, 2]
    assert "--epochs 2" in (work / "paper" / "seed-1" / "command.txt").read_text()


def test_a_run_stopped_by_the_time_limit_resumes_and_finish_tests_it(tiny_mnist_dir, tmp_path,
                                                                     monkeypatch):
    """With no time for a second epoch, a run stops after its first, untested; --finish
    tests it where it stands; a later call with time trains it on to its epochs."""
    work, run_dir = tmp_path / "work", tmp_path / "work" / "cnn" / "seed-1"
    with monkeypatch.context() as m:
        m.setattr(campaign_runs.Budget, "time_limit", lambda self: 0.0)
        assert campaign(tiny_mnist_dir, tmp_path / "out1", work, "cnn", "--epochs", "3") == 0
        stopped = json.loads((tmp_path / "out1" / "cnn.json").read_text())
        assert stopped["complete"] is False and stopped["run"]["epochs_done"] == 1
        assert "time limit" in stopped["actions"]["seed 1"] and "test" not in stopped["run"]
        assert campaign(tiny_mnist_dir, tmp_path / "out2", work, "cnn", "--epochs", "3",
                        "--finish") == 0
    finished = json.loads((tmp_path / "out2" / "cnn.json").read_text())
    assert finished["complete"] is True and finished["run"]["epochs_done"] == 2
    assert "finished at epoch 2" in finished["actions"]["seed 1"]
    assert campaign(tiny_mnist_dir, tmp_path / "out3", work, "cnn", "--epochs", "3") == 0
    assert json.loads((tmp_path / "out3" / "cnn.json").read_text())["run"]["epochs_done"] == 3
    assert epochs_logged(run_dir) == [1, 2, 3]
