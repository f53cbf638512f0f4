"""The dataset analysis on a real local Ray cluster (two nodes, one CPU each): ``vit.analyze --ray``."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import displayed, free_port, make_image_folder
from vit_commands import vit_command

from vit.analyze import build_parser, command_line
from vit.checkpoint import save_checkpoint
from vit.model import ViT, ViTConfig
from vit.runs.ray_analyze import cause_line, images_done, plan_actors, wait_for_job
from vit.runs.ray_jobs import RayRunError

REPO = Path(__file__).resolve().parent.parent
CONFIG = ViTConfig(image_size=16, patch_size=4, hidden_size=16, num_layers=2, num_heads=2, mlp_size=32, num_classes=3)
CLASSES = ["cat", "dog", "ship"]
TIMEOUT = 300


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("analyze-ray")
    make_image_folder(root / "data", classes=CLASSES, per_class=10)
    torch.manual_seed(0)
    save_checkpoint(root / "model.pt", ViT(CONFIG).eval(), CLASSES)  # random: mistakes and spread-out maps
    return root


def analyze(*argv: str, in_process: bool = False) -> subprocess.CompletedProcess:
    """The command, a real process unless ``in_process`` (tests/vit_commands.py: its main here, no second start)."""
    return vit_command("vit.analyze", *argv, in_process=in_process, timeout=TIMEOUT)


def analyze_here(*argv: str) -> int:
    """``vit.analyze`` in this process (one thread, as the job's actors: the same float sums); its exit status."""
    from vit.analyze import main

    return main(list(argv))


def assert_close(a: object, b: object, where: str = "") -> None:
    """The same JSON: equal keys, lists and strings; numbers to 1e-6."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            assert_close(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_close(x, y, f"{where}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, abs=1e-6, rel=1e-6), where
    else:
        assert a == b, where


@pytest.mark.slow
def test_on_ray_the_analysis_equals_the_local_one_and_an_unreadable_image_is_skipped_as_locally(ray_cluster, world,
                                                                                                 tmp_path):
    """Long (~47 s of CPU) because it runs the real command's Ray job (its driver and two actors, each importing
    torch and the model) and the same analysis locally, whose every figure it must equal. (Its CPU in the whole
    suite: bench/results/cpu-2026-11-30c/suite-cpu.txt.)"""
    # 25 of 31 images after the seeded shuffle, in batches of 8: 4 batches (the last one short) over 2 actors,
    # returned in any order; the mechanism too (token norms, head attribution, ablation, sinks). One of the 25 is
    # unreadable: skipped on an actor as it is locally, named in the job's log, and the command fails in one line
    # (one Ray job for what were two tests: each job costs ~25 s of Ray start-up here).
    data = shutil.copytree(world / "data", tmp_path / "data")
    (data / "dog" / "broken.png").write_text("not an image")
    common = [str(world / "model.pt"), "--data", str(data), "--limit", "25", "--batch-size", "8", "--mechanism"]
    assert analyze_here(*common, "--out", str(tmp_path / "local")) == 1  # the reference: no second torch start-up
    on_ray = analyze(*common, "--out", str(tmp_path / "ray"), "--ray", ray_cluster.address)
    assert on_ray.returncode == 1, f"{on_ray.stdout}\n{on_ray.stderr}"  # as the local run with an unreadable image
    assert "vit.analyze: submitted job analyze-ray-" in on_ray.stdout  # a SUCCEEDED job: the page test below
    assert re.search(r"vit.analyze: skipped: .*broken.png", on_ray.stdout)  # in the job's log
    assert on_ray.stderr.splitlines() == [f"vit.analyze: 1 of 25 images could not be read (named above); the "
                                          f"analysis in {tmp_path / 'ray'} covers the other 24"]

    names = [sorted(p.name for p in (tmp_path / name).iterdir()) for name in ("local", "ray")]
    assert names[0] == names[1]
    mine, theirs = (json.loads((tmp_path / name / "analysis.json").read_text()) for name in ("local", "ray"))
    assert mine["count"] == 24 and mine["skipped"] == 1
    assert mine["most_confident_mistakes"] and "mechanism" in mine
    assert_close(mine, theirs)
    reports = [(tmp_path / name / "report.html").read_text().count("plotly-graph-div") for name in ("local", "ray")]
    assert reports[0] == reports[1] >= 11


@pytest.mark.slow
def test_ctrl_c_stops_the_job_and_the_command_reports_it(ray_cluster, world, tmp_path):
    # Enough images that the stop always comes first: on an idle machine 30 images were done before it.
    data = make_image_folder(tmp_path / "many", classes=CLASSES, per_class=400)
    proc = subprocess.Popen([sys.executable, "-m", "vit.analyze", str(world / "model.pt"), "--data",
                             str(data), "--out", str(tmp_path / "out"), "--ray", ray_cluster.address,
                             "--batch-size", "8"],
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    seen = ""
    while "Running entrypoint for job" not in seen:  # the job has started: its first log line
        line = proc.stdout.readline()
        assert line, f"the command ended first: {seen}{proc.communicate()}"
        seen += line
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 130, f"{seen}{out}\n{err}"
    assert re.search(r"vit.analyze: job analyze-out-\w+ stopped", out)
    assert err.startswith("vit.analyze: stopping job analyze-out-")
    assert not (tmp_path / "out" / "report.html").exists()


@pytest.mark.slow
def test_an_unreachable_address_is_one_line_and_writes_nothing(world, tmp_path):
    # In this process: the real command's one line on a failed job is the first test's
    done = analyze(str(world / "model.pt"), "--data", str(world / "data"), "--out", str(tmp_path / "out"),
                   "--ray", f"http://127.0.0.1:{free_port()}", in_process=True)  # a closed port: nothing listens
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vit.analyze: error: cannot reach the Ray cluster"), done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_data_folder_without_images_fails_the_job_in_one_line(ray_cluster, world, tmp_path):
    (tmp_path / "empty" / "cat").mkdir(parents=True)
    done = analyze(str(world / "model.pt"), "--data", str(tmp_path / "empty"), "--out", str(tmp_path / "out"),
                   "--ray", ray_cluster.address, in_process=True)  # the job fails on the cluster; its driver here
    assert done.returncode == 1, f"{done.stdout}\n{done.stderr}"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0] == f"vit.analyze: error: no images in {tmp_path / 'empty'}; lay it out as " \
                                           f"{tmp_path / 'empty'}/<class>/<image>", done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "out").exists()


def test_a_missing_data_folder_is_refused_before_anything_is_submitted(world, tmp_path):
    done = analyze(str(world / "model.pt"), "--data", str(tmp_path / "nowhere"), "--ray", "http://127.0.0.1:1",
                   in_process=True)
    assert done.returncode == 2
    assert done.stderr.strip() == (f"vit.analyze: error: --data {tmp_path / 'nowhere'} is not a folder; give a "
                                   "folder with one subfolder per class")


def test_the_job_reads_back_the_arguments_it_was_given():
    parser = build_parser()
    args = parser.parse_args(["/m.pt", "--data", "/d", "--limit", "5", "--mechanism", "--norm-threshold", "0.1",
                              "--workers", "3", "--ray-job"])
    assert parser.parse_args(command_line(parser, args)) == args


def test_one_actor_per_cpu_or_gpu_and_never_more_than_batches():
    assert plan_actors({"CPU": 2.0}, "auto", None, batches=10) == (2, False)
    assert plan_actors({"CPU": 16.0, "GPU": 4.0}, "auto", None, batches=10) == (4, True)
    assert plan_actors({"CPU": 16.0, "GPU": 4.0}, "cpu", None, batches=10) == (10, False)
    assert plan_actors({"CPU": 16.0}, "auto", 8, batches=3) == (3, False)


def test_asking_for_more_than_the_cluster_has_is_refused_before_any_actor_starts():
    with pytest.raises(RayRunError, match="--workers 3 needs 3 CPU"):
        plan_actors({"CPU": 2.0}, "auto", 3, batches=10)
    with pytest.raises(RayRunError, match="no GPU"):
        plan_actors({"CPU": 2.0}, "cuda", None, batches=10)


def test_an_actors_error_is_the_line_that_names_it_in_rays_wrapped_error():
    wrapped = ("\x1b[36mray::MapWorker(MapBatches(Summarizer)).submit()\x1b[39m (pid=1, ip=10.0.0.1)\n"
               '  File "vit/explain/views/dataset.py", line 90, in image_summaries\n'
               "ValueError: batch_size must be a whole number of at least 1, got 0\n\n"
               "The above exception was the direct cause of the following exception:\n\n"
               "ray.exceptions.UserCodeException: UDF failed to process a data block.\n")
    assert cause_line(RuntimeError(wrapped)) == "ValueError: batch_size must be a whole number of at least 1, got 0"
    assert cause_line(RuntimeError("\nno named error\nhere")) == "no named error"


def test_summaries_that_come_in_any_order_and_split_go_on_in_file_order():
    from vit.runs.ray_analyze import in_file_order

    def part(*indices: int) -> dict:
        return {"index": np.array(indices), "value": np.array(indices) * 10}

    runs = list(in_file_order([part(4, 5), part(7, 6), part(0, 1, 2), part(3)], total=8))
    assert [run["index"].tolist() for run in runs] == [[0, 1, 2], [3], [4, 5], [6, 7]]
    assert np.concatenate([run["value"] for run in runs]).tolist() == [0, 10, 20, 30, 40, 50, 60, 70]
    with pytest.raises(RuntimeError, match="for 2 of 3 files"):
        list(in_file_order([part(0, 1)], total=3))
    with pytest.raises(RuntimeError, match="file 1 twice"):
        list(in_file_order([part(0, 1), part(1)], total=2))


class FakeJobs:
    """A JobSubmissionClient's answers about one job: RUNNING with ``log`` until it is stopped (STOPPED then, or
    never when ``stops`` is False), and the stops it was asked for."""

    def __init__(self, log: str = "", stops: bool = True) -> None:
        self.log, self.stops, self.stopped = log, stops, []

    def get_job_status(self, sid):
        return SimpleNamespace(value="STOPPED" if self.stopped and self.stops else "RUNNING")

    def get_job_logs(self, sid):
        return self.log

    def stop_job(self, sid):
        self.stopped.append(sid)
        return True


class PageStop(Exception):
    """What a page's progress callback raises on Stop (vit.app.work.Stopped, which vit/runs does not know)."""


def test_the_images_done_are_read_from_the_jobs_progress_bar():
    from tqdm import tqdm

    log = io.StringIO()
    log.write("Running entrypoint for job analyze-x\n")
    bar = tqdm(total=25, unit="img", desc="analysing", file=log, dynamic_ncols=True)  # as vit.analyze draws it
    assert images_done(log.getvalue()) == 0
    bar.update(8)
    bar.update(8)
    bar.refresh()
    assert images_done(log.getvalue()) == 16


def test_a_stop_from_the_page_stops_the_job_through_the_jobs_api_before_it_goes_on():
    seen = []

    def progress(done, total):
        seen.append((done, total))
        if len(seen) == 2:
            raise PageStop("stopped by you")

    jobs = FakeJobs("analysing:  32%|###2      | 8/25 [00:01<00:02,  6.00img/s]")
    with pytest.raises(PageStop):
        wait_for_job(jobs, "analyze-x", 25, progress, poll=0)
    assert seen == [(8, 25), (8, 25)] and jobs.stopped == ["analyze-x"]


def test_a_job_that_does_not_stop_is_one_line_naming_it():
    def progress(done, total):
        raise PageStop("stopped by you")

    with pytest.raises(RayRunError, match="could not stop Ray job analyze-x .*ray job stop analyze-x") as error:
        wait_for_job(FakeJobs(stops=False), "analyze-x", 25, progress, poll=0, stop_wait=0.6)
    assert "\n" not in str(error.value)


@pytest.mark.slow
def test_the_analyse_page_runs_on_the_cluster_and_shows_what_a_local_run_shows(ray_cluster, world, tmp_path,
                                                                               monkeypatch):
    """The "Analyse a dataset" page with VIT_RAY_ADDRESS: "Run on the Ray cluster" gives the local numbers."""
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("VIT_CHECKPOINTS_DIR", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("VIT_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("VIT_DATA_ROOTS", str(world))  # the page analyses folders inside the data roots only
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "model.pt").write_bytes((world / "model.pt").read_bytes())  # what the page lists

    def page(on_ray: bool) -> list[str]:
        if on_ray:
            monkeypatch.setenv("VIT_RAY_ADDRESS", ray_cluster.address)
        else:
            monkeypatch.delenv("VIT_RAY_ADDRESS", raising=False)
        at = AppTest.from_file(str(REPO / "app.py"), default_timeout=TIMEOUT)
        at.switch_page("app_pages/analyze.py")
        at.run()
        at.text_input(key="analyze_folder").set_value(str(world / "data"))
        at.run()
        if on_ray:
            at.checkbox(key="analyze_on_ray").check()
        [analyse] = [b for b in at.button if b.label == "Analyse"]
        analyse.click()
        at.run()
        assert not at.exception, [e.message for e in at.exception]
        assert not at.error, [e.value for e in at.error]
        assert len(at.get("plotly_chart")) == 5
        return [m.value for m in at.metric]

    assert page(on_ray=True) == page(on_ray=False)
    reports = list((tmp_path / "runs" / ".analyses").glob("*/analysis.json"))
    assert len(reports) == 1  # written on the shared runs folder

    # Started by mistake: Stop stops the job on the cluster; the page says so and shows no report.
    from ray.job_submission import JobSubmissionClient

    from app_pages.explorer_sections import long_work

    monkeypatch.setattr(long_work, "QUICK_S", 0.5)
    monkeypatch.setenv("VIT_RAY_ADDRESS", ray_cluster.address)
    at = AppTest.from_file(str(REPO / "app.py"), default_timeout=TIMEOUT)
    at.switch_page("app_pages/analyze.py")
    at.run()
    at.text_input(key="analyze_folder").set_value(str(world / "data"))
    at.checkbox(key="analyze_on_ray").check()
    at.run()
    [analyse] = [b for b in at.button if b.label == "Analyse"]
    analyse.click()
    at.run()
    assert not at.metric, "the report of the run before is not shown as this one's"
    current = at.session_state[long_work.SESSION_KEY]
    [stop] = [b for b in at.button if b.key == "long_work_stop-analyse"]
    stop.click()
    at.run()
    assert current.wait(90) and current.state == "stopped", current.describe()
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert any("on the Ray cluster: stopped after" in displayed(i.value) and "stopped by you" in i.value
               for i in at.info)
    assert not at.metric and not at.get("plotly_chart")
    analyses = [j for j in JobSubmissionClient(ray_cluster.address).list_jobs()
                if str((j.metadata or {}).get("vit_analysis", "")).startswith(str(tmp_path / "runs"))]
    assert sorted(str(j.status.value) for j in analyses) == ["STOPPED", "SUCCEEDED"]
    assert list((tmp_path / "runs" / ".analyses").glob("*/analysis.json")) == reports  # it wrote nothing
