"""docs/quickstart.ipynb and the tutorials in docs/tutorials/ (issue 78, item 3) run from top to bottom (nbclient, the
quickstart in a fresh kernel, the six tutorials one after the other in one kernel whose names are emptied between
them), so they cannot rot, and are committed with their outputs. The tutorials build their other models (timm,
transformers) with random weights in the notebook itself: no download, no network."""

import json
from pathlib import Path

import pytest
import yaml
from lazy_modules import lazy

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "docs" / "quickstart.ipynb"
# One tutorial per task: a model and its methods compared, the dense views, a VLM tower and its visual lens, a clip,
# SAE features, the benchmarks.
TUTORIALS = ("compare-methods", "dense-views", "vlm-lens", "video-clip", "sae-features", "benchmarks")
TUTORIAL_DIR = ROOT / "docs" / "tutorials"
MAX_TUTORIAL_BYTES = 300_000
nbformat = lazy("nbformat")  # each imported by the first test that reads it (tests/lazy_modules.py)
nbclient = lazy("nbclient")


def shown_text(notebook) -> str:
    return "\n".join(o.get("data", {}).get("text/plain", "") for cell in notebook.cells if cell.cell_type == "code"
                     for o in cell.outputs)


@pytest.mark.slow
def test_the_quickstart_notebook_runs_in_a_clones_docs_folder_without_an_error(monkeypatch):
    # The README's environment: the requirements installed, the project itself not (no PYTHONPATH either), and no
    # MPLBACKEND from an earlier test's ``import streamlit`` (see tutorials).
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.delenv("MPLBACKEND", raising=False)
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


def shown_by(notebook, source: str):
    """The value the code cell ``source`` shows, read back from its committed text (a dict or a list's repr)."""
    import ast

    [cell] = [cell for cell in notebook.cells if cell.cell_type == "code" and cell.source.strip() == source]
    [shown] = [o["data"]["text/plain"] for o in cell.outputs if "text/plain" in o.get("data", {})]
    return ast.literal_eval(shown)


def test_the_notebooks_committed_method_lists_are_the_registrys():
    """Issue 90, item 8: the quickstart's committed ``vit.methods()`` listed 10 methods where the registry has 31,
    and compare-methods' the shipped model's 17 of 24. Each list as committed is the registry's now: re-run the
    notebook (``nbclient``, as above) when a method is added."""
    import vit
    from vit import registry

    quickstart = shown_by(nbformat.read(NOTEBOOK, as_version=4), "vit.methods()")
    assert list(quickstart) == [m.name for m in registry.methods()] and quickstart == vit.methods()
    compare = nbformat.read(TUTORIAL_DIR / "compare-methods.ipynb", as_version=4)
    shipped = vit.load(vit.shipped("cifar10-cifar-s"))
    assert shown_by(compare, "list(vit.methods(checkpoint))") == list(vit.methods(shipped))


# What a tutorial finds of the one before it in the shared kernel: no name (IPython's %reset -f empties the
# namespace and its output history), the tutorials' folder as its working directory and the import path as the kernel
# started with it. What stays is what a process keeps of its imports (sys.modules: torch, timm, transformers and vit
# imported once, ~3-4 s of CPU a kernel, issue 112); that each tutorial still imports what it uses is checked by the
# names being gone, and the import cell that finds the clone's vit is one cell, the same in all six
# (test_the_tutorials_share_one_import_cell), run as a fresh kernel runs it by the first. The reset without the two
# full garbage collections IPython's runs (its displayhook's and the magic's own: ~0.5 s of CPU each over the
# libraries' object graph, 2.5-3 s for the five resets, issue 112): the names and history go all the same, and
# Python's own collector still frees what the earlier tutorial left in cycles.
RESET = """from unittest import mock
with mock.patch("gc.collect", return_value=0):
    get_ipython().run_line_magic("reset", "-f")
import os, sys
os.chdir({folder!r})
while {root!r} in sys.path:
    sys.path.remove({root!r})
del os, sys
"""


@pytest.fixture(scope="module")
def tutorials() -> dict:
    """{name: the executed notebook, or the CellExecutionError it raised} of each tutorial, run from its own folder
    as a clone's reader runs it: the README's environment (requirements installed, the project not, no PYTHONPATH)
    and one torch thread, as the suite's. No MPLBACKEND: ``import streamlit`` sets it to Agg in the process (every
    app test in a worker does), and the kernel would inherit it instead of Jupyter's inline backend, so no figure
    would show. One kernel for the six, started fresh by the first (``RESET`` between them)."""
    from nbclient.exceptions import CellExecutionError

    run, client = {}, None
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("PYTHONPATH", raising=False)
        patch.delenv("MPLBACKEND", raising=False)
        patch.setenv("OMP_NUM_THREADS", "1")
        try:
            for name in TUTORIALS:
                notebook = nbformat.read(TUTORIAL_DIR / f"{name}.ipynb", as_version=4)
                reset = client is not None
                if reset:
                    notebook.cells.insert(0, nbformat.v4.new_code_cell(RESET.format(folder=str(TUTORIAL_DIR),
                                                                                    root=str(ROOT))))
                client = nbclient.NotebookClient(notebook, km=client.km if client else None, timeout=300,
                                                 kernel_name="python3",
                                                 resources={"metadata": {"path": str(TUTORIAL_DIR)}})
                try:
                    client.execute(cleanup_kc=False)
                    run[name] = notebook
                except CellExecutionError as error:
                    run[name] = error
                if reset:
                    notebook.cells.pop(0)
        finally:
            if client is not None and client.km is not None:
                client._cleanup_kernel()
    return run


def outputs(notebook) -> list:
    return [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]


@pytest.mark.slow
@pytest.mark.timeout(900)  # the module's one kernel runs the six in the first test's setup
@pytest.mark.parametrize("name", TUTORIALS)
def test_each_tutorial_runs_in_a_clones_docs_folder_without_an_error(name, tutorials):
    """Long for the first tutorial (~25 s of CPU) because its setup runs all six in their one kernel (``tutorials``),
    each building its models and checking them against the library's; the other five read what it ran."""
    # Each notebook checks its model against the library's own (timm's logits, transformers' lens scores and
    # probabilities) or by hand with an assert: a mismatch is an error output here.
    notebook = tutorials[name]
    if isinstance(notebook, Exception):
        pytest.fail(str(notebook)[-3000:])
    assert [f"{o.ename}: {o.evalue}" for o in outputs(notebook) if o.output_type == "error"] == []
    assert any("image/png" in o.get("data", {}) for o in outputs(notebook))


def test_the_tutorials_share_one_import_cell():
    """What the shared kernel leans on: every tutorial finds the clone's vit by the same first code cell (the first
    tutorial runs it in a fresh kernel), and imports the rest of what it uses itself."""
    firsts = {next(c for c in nbformat.read(TUTORIAL_DIR / f"{name}.ipynb", as_version=4).cells
                   if c.cell_type == "code").source for name in TUTORIALS}
    assert len(firsts) == 1 and "sys.path.insert(0, str(Path.cwd().parents[1]))" in firsts.pop()


@pytest.mark.parametrize("name", TUTORIALS)
def test_each_tutorial_is_committed_executed_small_and_quiet(name):
    path = TUTORIAL_DIR / f"{name}.ipynb"
    assert path.stat().st_size < MAX_TUTORIAL_BYTES
    notebook = nbformat.read(path, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1))  # every cell run, in order
    assert not [o for o in outputs(notebook) if o.output_type == "error"]
    # no warning, progress bar or machine path in what the docs site shows
    assert not [o.text for o in outputs(notebook) if o.output_type == "stream" and o.name == "stderr"]
    assert "/tmp/" not in json.dumps([o.get("text", "") for o in outputs(notebook)])
    assert any("image/png" in o.get("data", {}) for o in outputs(notebook))
    assert notebook.cells[0].cell_type == "markdown" and notebook.cells[0].source.startswith("# ")


def test_the_tutorials_folder_holds_the_six_and_the_sites_nav_lists_each():
    assert sorted(p.stem for p in TUTORIAL_DIR.glob("*.ipynb")) == sorted(TUTORIALS)
    site = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    [tutorials] = [entry["Tutorials"] for entry in site["nav"] if isinstance(entry, dict) and "Tutorials" in entry]
    listed = [page for entry in tutorials for page in entry.values()]
    assert listed == ["quickstart.ipynb", *(f"tutorials/{name}.ipynb" for name in TUTORIALS)]
