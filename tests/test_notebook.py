"""docs/quickstart.ipynb runs from top to bottom (nbclient, in a fresh kernel), so it cannot rot."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")


@pytest.mark.slow
def test_the_quickstart_notebook_runs_without_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # vit importable in the kernel, as after pip install
    notebook = nbformat.read(ROOT / "docs" / "quickstart.ipynb", as_version=4)
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()  # another folder: no ./vit
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs)  # an Explanation shows itself
