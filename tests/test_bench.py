"""benchmarks/bench.py runs every CPU case end to end (tiny batch: a smoke test, no timings asserted)."""
from __future__ import annotations

import json

from benchmarks import bench


def test_bench_runs_every_cpu_case_and_writes_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    cases = bench.cases_for(bench.pick_device("cpu"), skip_reference=False)
    assert {"naive", "capsnet", "capsnet-onednn", "convs", "convs-onednn"} <= set(cases)
    assert bench.main(["--device", "cpu", "--batch-size", "2", "--warmup", "0", "--repeats", "1",
                       "--cases", ",".join(cases), "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    assert set(results) == set(cases)
    for case in ("naive", "capsnet", "capsnet-onednn"):
        assert results[case]["train_images_per_s"] > 0 and results[case]["infer_images_per_s"] > 0
    printed = capsys.readouterr().out
    assert "GFLOP/s matmul timed in turns" in printed and "capsnet-onednn" in printed
