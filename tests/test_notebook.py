"""docs/quickstart.ipynb runs from top to bottom (nbclient, in a fresh kernel), so it cannot rot, and is committed
with its outputs."""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "docs" / "quickstart.ipynb"
nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")


def shown_text(notebook) -> str:
    return "\n".join(o.get("data", {}).get("text/plain", "") for cell in notebook.cells if cell.cell_type == "code"
                     for o in cell.outputs)


@pytest.mark.slow
def test_the_quickstart_notebook_runs_in_a_clones_docs_folder_without_an_error(monkeypatch):
    # The README's environment: the requirements installed, the project itself not (no PYTHONPATH either).
    monkeypatch.delenv("PYTHONPATH", raising=False)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs)  # an Explanation shows itself
    # The first demo's sample is one the shipped model gets right (samples.json: "dog", p = 0.9455).
    assert "[('dog', 0.94" in shown_text(notebook)


def test_the_quickstart_notebook_is_committed_executed_and_small():
    assert NOTEBOOK.stat().st_size < 1_000_000
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.execution_count for cell in code)  # every cell run, in order
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1))
    assert sum(bool(cell.outputs) for cell in code) == len(code) - 1  # all but the import show something
    assert not [o for cell in code for o in cell.outputs if o.output_type == "error"]
    shipped = json.loads((ROOT / "checkpoints" / "samples" / "cifar10-cifar-s" / "samples.json").read_text())
    dog = next(s for s in shipped if s["file"] == "dog_1.png")
    assert dog["predicted"] == dog["label"] == "dog" and f"[('dog', {dog['probability']:.4f}" in shown_text(notebook)
