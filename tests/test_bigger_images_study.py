"""The bigger-images study's seed summary reads each seed's JSON and averages per set and model."""
from __future__ import annotations

import json

from benchmarks import bigger_images_seeds


def test_seed_summary_averages_finished_runs(tmp_path, capsys):
    for seed, accuracy in ((0, 0.8), (1, 0.9)):
        rows = [{"variant": "capshead", "complete": True, "test_accuracy": accuracy},
                {"variant": "stemcnn", "complete": False, "test_accuracy": None}]
        folder = tmp_path / f"s{seed}"
        folder.mkdir()
        (folder / "bigger_images.json").write_text(json.dumps(
            {"seed": seed, "datasets": {"translated-60": {"rows": rows}}}))
    assert bigger_images_seeds.main([str(tmp_path / "s0"), str(tmp_path / "s1"),
                                     "--out", str(tmp_path / "out")]) == 0
    table = capsys.readouterr().out
    assert "| translated-60 | capshead | 80.0%, 90.0% | **85.0%** ± 7.1 |" in table
    assert "stemcnn" not in table and (tmp_path / "out" / "seeds.md").is_file()
