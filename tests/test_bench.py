"""benchmarks/bench.py runs every CPU case end to end (tiny batch: a smoke test, no timings
asserted), and the danielhavir-style reference computes what capsnet computes."""
from __future__ import annotations

import json

import pytest
import torch

from benchmarks import bench
from benchmarks.broadcast_reference import BroadcastCapsNet
from capsnet.models import CapsNet, CapsNetConfig


@pytest.mark.slow
def test_bench_runs_every_cpu_case_and_writes_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    cases = bench.cases_for(torch.device("cpu"))
    assert {"seed-style", "broadcast-style", "capsnet", "capsnet-fp32-gemm",
            "capsnet-bf16-native", "capsnet-fp32-channels_last"} <= set(cases)
    assert bench.main(["--device", "cpu", "--batch-size", "2", "--warmup", "0", "--repeats", "1",
                       "--cases", ",".join(cases), "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert set(record["cases"]) == set(cases) and "CPU" in record["device"]
    for result in record["cases"].values():
        assert result["train_images_per_s"] > 0 and result["infer_images_per_s"] > 0
        assert result["peak_mb"] > 0
    assert record["cases"]["capsnet-bf16-gemm"]["plan"]["precision"] == "bf16"
    printed = capsys.readouterr().out
    assert "capsnet's plan: precision" in printed and "x best path" in printed


def test_broadcast_reference_routes_like_capsnet():
    """Given the same primary capsules and W, the reference's prediction vectors and routing
    give capsnet's digit capsules: the two differ in style, not in arithmetic."""
    torch.manual_seed(0)
    ref = BroadcastCapsNet().double()
    model = CapsNet(CapsNetConfig()).double()
    with torch.no_grad():
        model.digit_caps.W.copy_(ref.digits.W[0].transpose(0, 1))  # (J, I, D, K) -> (I, J, D, K)
    x = torch.rand(2, 1, 28, 28, dtype=torch.float64)
    u = ref.primary(torch.relu(ref.conv1(x)))  # (B, 1152, 8)
    torch.testing.assert_close(model.digit_caps(u).poses, ref.digits(u))


def test_gpu_cases_run_only_the_precisions_the_gpu_computes_natively():
    assert bench.case_precisions("cuda", ["bf16"]) == ["fp32", "bf16"]  # A100, H100
    assert bench.case_precisions("cuda", ["fp16"]) == ["fp32", "fp16"]  # V100, T4: no bf16
    assert bench.case_precisions("cuda", []) == ["fp32"]
    assert bench.case_precisions("cpu", []) == ["fp32", "bf16"]  # emulated bf16, to compare
