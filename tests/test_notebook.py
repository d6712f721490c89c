"""examples/*.ipynb: committed without outputs, and run top to bottom without an error."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "examples").glob("*.ipynb"))
RUN_LIMIT_S = 600  # one cell; the whole quick start takes about two minutes on 2 cores


def test_there_is_a_quick_start_notebook():
    assert REPO / "examples" / "quickstart.ipynb" in NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_without_outputs(path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    dirty = [i for i, cell in enumerate(cells) if cell["cell_type"] == "code"
             and (cell.get("outputs") or cell.get("execution_count") is not None)]
    assert not dirty, (f"{path.name}: code cells {dirty} hold outputs or execution counts; "
                       "clear them before committing (Kernel > Restart and clear outputs)")


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_top_to_bottom(path, mnist_dir, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    # the kernel is a new process: it finds this checkout and MNIST through its environment
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [
        str(REPO), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("CAPSNET_DATA_DIR", str(mnist_dir))
    notebook = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    nbclient.NotebookClient(notebook, timeout=RUN_LIMIT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = [output for cell in notebook.cells for output in cell.get("outputs", [])
              if output.get("output_type") == "error"]
    assert not errors
    print(f"{path.name}: ran in {time.perf_counter() - start:.0f} s")
