"""The example notebook runs top to bottom in a fresh kernel: a datasets folder in, accuracy by depth out."""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "datasets_to_depth_plot.ipynb"


@pytest.mark.slow  # about 50 s: the whole notebook
def test_the_example_notebook_runs(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("datasets")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    shown = [o for o in outputs if o.get("output_type") == "execute_result"]
    assert any("depth" in str(o.get("data", {}).get("text/plain", "")) for o in shown)  # the table by depth
