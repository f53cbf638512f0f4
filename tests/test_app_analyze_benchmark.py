"""The Analyse page's faithfulness benchmarks: the table it shows is the command's report for the same input."""

import json
import shutil
from pathlib import Path

from streamlit.testing.v1 import AppTest

from tests.test_app import dirs  # noqa: F401  (fixture)
from tests.test_faithfulness_chefer import tiny_model_and_images
from vit.explain.benchmarks.benchmark_run import header

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


def test_the_page_runs_a_benchmark_and_shows_the_commands_scores(dirs, tmp_path, capsys, monkeypatch):  # noqa: F811
    from streamlit.delta_generator import DeltaGenerator

    from vit import faithfulness

    downloads, original = {}, DeltaGenerator.download_button
    monkeypatch.setattr(DeltaGenerator, "download_button", lambda self, label, data, *a, **k: downloads.update(
        {label: data}) or original(self, label, data, *a, **k))

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
    # Each header says which side is better (Chefer et al.: positive perturbation low, negative high), the legend
    # under the table what the arrows mean.
    assert list(shown.columns) == ["positive_auc ↓", "negative_auc ↑", "images_per_s ↑"]
    for method in methods:
        for column in ("positive_auc", "negative_auc"):
            assert shown.loc[method, header(column)] == expected["methods"][method][column], (method, column)
    assert any(c.value.startswith("↑ higher is better; ↓ lower is better") for c in at.caption)
    assert any(f"{expected['model_accuracy']:.4f}" in c.value for c in at.caption)
    assert at.get("imgs") or at.image, "the plot of the curves"
    assert [b.label for b in at.get("download_button")] == ["The report (JSON)", "The table (Markdown)"]
    # the model and the folder by their names: no path of the server in what a visitor downloads
    report = json.loads(downloads["The report (JSON)"])
    assert (report["checkpoint"], report["data"]) == ("m.pt", "data"), report
    assert str(tmp_path) not in downloads["The table (Markdown)"] and str(checkpoints) not in \
        downloads["The table (Markdown)"] and str(tmp_path) not in downloads["The report (JSON)"]


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


def test_a_batch_past_the_memory_limit_is_refused_before_the_work_starts(dirs, tmp_path, monkeypatch):  # noqa: F811
    """The command's count of a batch (``benchmark_run.check_batch``), asked as Run is pressed: one line, no work."""
    checkpoints, _ = dirs
    tiny_model_and_images(tmp_path / "world", labelled=False)
    checkpoint = shutil.copy(tmp_path / "world" / "m.pt", checkpoints / "m.pt")
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "16")
    at = benchmark_page(Path(checkpoint), bench_benchmark="saco", bench_folder=str(tmp_path / "world" / "data"),
                        bench_methods=["random"], bench_batch_size=4)
    next(b for b in at.button if b.label == "Run the benchmark").click()
    at.run()
    [error] = at.error
    assert "A batch of 4 images holds about 20 MB at once" in error.value and "\n" not in error.value
    assert not at.dataframe

def test_on_ray_the_page_submits_the_commands_job_and_shows_the_report_it_writes(dirs, tmp_path, monkeypatch,  # noqa: F811
                                                                                 capsys):
    """The page's Ray path without a cluster: the job it submits is ``vit.faithfulness --ray`` on the page's own
    arguments (parsed and checked by the command), here run in process by a stand-in for the job; the table shown is
    the report that job writes, equal to the command's run here. The job on a real cluster equals the local run
    (tests/test_faithfulness_ray.py)."""
    from vit import faithfulness
    from vit.runs import ray_analyze

    checkpoints, _ = dirs
    tiny_model_and_images(tmp_path / "world", labelled=True)
    checkpoint = shutil.copy(tmp_path / "world" / "m.pt", checkpoints / "m.pt")
    data = tmp_path / "world" / "data"
    methods = ["random", "class"]
    assert faithfulness.main([str(checkpoint), "--benchmark", "perturbation", "--data", str(data), "--methods",
                              ",".join(methods), "--batch-size", "3"]) == 0
    expected = json.loads(capsys.readouterr().out)

    monkeypatch.setenv("VIT_RAY_ADDRESS", "http://127.0.0.1:8265")
    submitted = []

    def submit(args):  # the job: the command, on the arguments the page gave it, writing its report to --out
        submitted.append(args)
        argv = [args.checkpoint, "--benchmark", args.benchmark, "--data", args.data, "--methods", *args.methods,
                "--limit", str(args.limit), "--batch-size", str(args.batch_size), "--out", args.out]
        assert faithfulness.main(argv) == 0
        return object(), "faithfulness-test"

    def wait_for_job(jobs, sid, total, progress, desc=None):
        progress(total, total)
        return "SUCCEEDED"

    monkeypatch.setattr(faithfulness, "submit", submit)
    monkeypatch.setattr(ray_analyze, "wait_for_job", wait_for_job)
    at = benchmark_page(Path(checkpoint), bench_benchmark="perturbation", bench_folder=str(data),
                        bench_methods=methods, bench_batch_size=3)
    at.checkbox(key="bench_on_ray").check()
    at.run()
    next(b for b in at.button if b.label == "Run the benchmark").click()
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    [args] = submitted
    assert args.ray == "http://127.0.0.1:8265" and args.benchmark == "perturbation"
    [table] = at.dataframe
    for method in methods:
        for column in ("positive_auc", "negative_auc"):
            assert table.value.loc[method, header(column)] == expected["methods"][method][column], (method, column)


def test_the_page_samples_the_folder_with_the_commands_benchmark_items(dirs, tmp_path, monkeypatch):  # noqa: F811
    """The page has no sampler of its own: it asks ``vit.faithfulness.benchmark_items`` (here stopped right after,
    with the error the page shows) on the command's arguments, its --limit the page's image count."""
    from vit import faithfulness
    from vit.core.cli import UsageError
    from vit.sources.open import open_source

    checkpoints, _ = dirs
    tiny_model_and_images(tmp_path / "world", labelled=True)
    checkpoint = shutil.copy(tmp_path / "world" / "m.pt", checkpoints / "m.pt")
    data = tmp_path / "world" / "data"
    asked, real = [], faithfulness.benchmark_items

    def benchmark_items(args, checkpoint, command=True):
        asked.append((args.benchmark, args.data, args.masks, args.limit, args.seed, command,
                      real(args, checkpoint, command)[0]))
        raise UsageError("stopped once sampled")

    monkeypatch.setattr(faithfulness, "benchmark_items", benchmark_items)
    at = benchmark_page(Path(checkpoint), bench_benchmark="perturbation", bench_folder=str(data),
                        bench_methods=["random"], bench_limit=3)
    next(b for b in at.button if b.label == "Run the benchmark").click()
    at.run()
    [error] = at.error
    assert error.value == "stopped once sampled"
    [(benchmark, folder, masks, limit, seed, command, items)] = asked
    assert (benchmark, folder, masks, limit, seed, command) == ("perturbation", str(data), None, 3, 0, False)
    args = faithfulness.build_parser().parse_args([str(checkpoint), "--benchmark", "perturbation", "--data",
                                                   str(data), "--limit", "3"])
    assert len(items) == 3 and items == real(args, open_source(str(checkpoint)))[0]  # the command's own sample


def test_a_rerun_that_changes_nothing_draws_the_reports_plot_once(dirs, tmp_path, monkeypatch):  # noqa: F811
    """The plot is built once per report and kept with it: two reruns build it once; a new report builds its own."""
    from app_pages.analyze_sections.benchmark import FIGURE_KEY, RESULT_KEY
    from vit.explain.benchmarks import benchmark_run

    checkpoints, _ = dirs
    tiny_model_and_images(tmp_path / "world", labelled=False)
    checkpoint = shutil.copy(tmp_path / "world" / "m.pt", checkpoints / "m.pt")
    built = []
    figure = benchmark_run.figure
    monkeypatch.setattr(benchmark_run, "figure", lambda result: built.append(result) or figure(result))
    at = benchmark_page(Path(checkpoint))

    def report(accuracy: float) -> dict:
        return {"benchmark": "segmentation", "checkpoint": "m.pt", "data": "data", "images": 4, "methods": {
            "rollout": {"pixel_accuracy": accuracy, "mIoU": 0.4, "mAP": 0.6, "images_per_s": 9.0}}}

    first = report(0.5)
    at.session_state[RESULT_KEY] = {"result": first, "skipped": []}
    for _ in range(2):
        at.run()
        assert not at.exception, [e.message for e in at.exception]
        assert at.get("imgs") or at.image, "the plot, on every rerun"
    assert built == [first]
    assert at.session_state[FIGURE_KEY][0] is first
    second = report(0.7)
    at.session_state[RESULT_KEY] = {"result": second, "skipped": []}
    at.run()
    assert built == [first, second] and (at.get("imgs") or at.image)
