"""The Analyse page's faithfulness benchmarks: the table it shows is the command's report for the same input."""

import json
import shutil
from pathlib import Path

from streamlit.testing.v1 import AppTest

from tests.test_app import dirs  # noqa: F401  (fixture)
from tests.test_faithfulness_chefer import tiny_model_and_images

APP = str(Path(__file__).resolve().parent.parent / "app.py")


def benchmark_page(checkpoint: Path, **widgets) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=180)
    at.switch_page("app_pages/analyze.py")
    at.run()
    at.session_state["analyze_checkpoint"] = str(checkpoint)
    at.radio(key="analyze_mode").set_value("Which map to trust: faithfulness benchmarks")
    at.run()
    for key, value in widgets.items():
        next(w for kind in ("selectbox", "text_input", "multiselect", "number_input")
             for w in getattr(at, kind) if w.key == key).set_value(value)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def test_the_page_runs_a_benchmark_and_shows_the_commands_scores(dirs, tmp_path, capsys):  # noqa: F811
    from vit import faithfulness

    checkpoints, _ = dirs
    tiny_model_and_images(tmp_path / "world", labelled=True)
    checkpoint = shutil.copy(tmp_path / "world" / "m.pt", checkpoints / "m.pt")
    data = tmp_path / "world" / "data"
    # Perturbation: the intact accuracy against the labels; random (seeded per batch: 2 batches of 3 and 1), the
    # benchmark's gradient rollout and Grad-CAM, a map of vit.methods() drawn through vit.api.
    methods = ["random", "class", "gradcam"]
    assert faithfulness.main([str(checkpoint), "--benchmark", "perturbation", "--data", str(data), "--methods",
                              ",".join(methods), "--batch-size", "3"]) == 0
    expected = json.loads(capsys.readouterr().out)

    at = benchmark_page(Path(checkpoint), bench_benchmark="perturbation", bench_folder=str(data),
                        bench_methods=methods, bench_batch_size=3)
    next(b for b in at.button if b.label == "Run the benchmark").click()
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    [table] = at.dataframe
    shown = table.value
    assert list(shown.index) == methods
    assert list(shown.columns) == ["positive_auc", "negative_auc", "images_per_s"]
    for method in methods:
        for column in ("positive_auc", "negative_auc"):
            assert shown.loc[method, column] == expected["methods"][method][column], (method, column)
    assert any(f"{expected['model_accuracy']:.4f}" in c.value for c in at.caption)
    assert at.get("imgs") or at.image, "the plot of the curves"
    assert [b.label for b in at.get("download_button")] == ["The report (JSON)", "The table (Markdown)"]


def test_segmentation_needs_its_masks_folder_inside_the_data_roots(dirs, tmp_path, monkeypatch):  # noqa: F811
    checkpoints, _ = dirs
    tiny_model_and_images(tmp_path / "world", labelled=False)
    checkpoint = shutil.copy(tmp_path / "world" / "m.pt", checkpoints / "m.pt")
    monkeypatch.setenv("VIT_DATA_ROOTS", str(tmp_path / "world" / "data"))  # the masks lie outside it
    at = benchmark_page(Path(checkpoint), bench_benchmark="segmentation", bench_folder=str(tmp_path / "world" / "data"),
                        bench_masks=str(tmp_path / "world" / "masks"), bench_methods=["rollout"])
    next(b for b in at.button if b.label == "Run the benchmark").click()
    at.run()
    [error] = at.error
    assert "mask folders must be inside" in error.value and "\n" not in error.value
    assert not at.dataframe
