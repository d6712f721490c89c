"""The one table writer and the one JSON writer."""
from __future__ import annotations

import json

from capsnet.atomic import write_json
from capsnet.writers import markdown_table


def test_a_markdown_table_has_its_head_its_rule_and_a_line_per_row():
    assert markdown_table(["model", "acc %"], [["capsnet", 99.67], ["cnn", "-"]]) == (
        "| model | acc % |\n| --- | --- |\n| capsnet | 99.67 |\n| cnn | - |")


def test_json_is_written_whole_with_a_final_newline(tmp_path):
    path = tmp_path / "new" / "results.json"
    write_json(path, {"accuracy": 0.9967})
    text = path.read_text()
    assert text.endswith("}\n") and json.loads(text) == {"accuracy": 0.9967}
    assert [p.name for p in path.parent.iterdir()] == ["results.json"]  # no temporary left
