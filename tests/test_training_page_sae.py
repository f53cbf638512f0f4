"""The Train page's SAE runs through Streamlit's AppTest: launched from the form, shown live (explained variance,
L0 and dead fraction per step), stopped and resumed from the run's buttons, and the finished SAE's folder handed to
the explorer."""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from pathlib import Path

import pytest
from helpers import displayed, follow_page_link
from streamlit.testing.v1 import AppTest

from vit.core.runfiles import now_iso, read_config, read_status, record_resume
from vit.runs.manager import RunError, RunManager
from vit.sae import main as sae_main

ROOT = Path(__file__).resolve().parent.parent
PAGE = str(ROOT / "app_pages" / "training.py")
CHECKPOINT = ROOT / "checkpoints" / "cifar10-cifar-s.pt"
SAMPLES = ROOT / "checkpoints" / "samples" / "cifar10-cifar-s"
TIMEOUT = 300


@pytest.fixture
def folders(tmp_path, monkeypatch):
    monkeypatch.setenv("VIT_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("VIT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("VIT_DATA_ROOTS", str(tmp_path))
    monkeypatch.delenv("VIT_TRAIN_TOKEN", raising=False)
    images = tmp_path / "images"
    shutil.copytree(SAMPLES, images)
    return images, tmp_path / "runs"


def fill_sae_run(at: AppTest, images: Path, name: str, epochs: int) -> None:
    at.text_input(key="sae_model_path").set_value(str(CHECKPOINT))
    at.text_input(key="sae_data").set_value(str(images))
    at.number_input(key="sae_layer").set_value(2)
    at.radio(key="sae_size").set_value("width")
    at.number_input(key="sae_width").set_value(48)
    at.number_input(key="sae_k").set_value(4)
    at.number_input(key="sae_epochs").set_value(epochs)
    at.text_input(key="sae_name").set_value(name)


def wait(predicate, timeout: float = TIMEOUT) -> None:
    deadline = time.time() + timeout
    while not predicate() and time.time() < deadline:
        time.sleep(0.3)
    assert predicate()


def test_bad_sae_fields_show_their_own_errors_and_launch_nothing(folders):
    images, runs_dir = folders
    at = AppTest.from_file(PAGE).run(timeout=TIMEOUT)
    fill_sae_run(at, images, "bad name!", 1)
    at.text_input(key="sae_data").set_value(str(images / "missing"))
    at.button(key="sae_submit").click()
    at = at.run(timeout=TIMEOUT)
    assert not at.exception
    shown = [displayed(e.value) for e in at.error]
    assert any("letters, digits" in e for e in shown) and any("is not a folder" in e for e in shown)
    assert RunManager(runs_dir).names() == []


def test_the_sae_form_and_the_vit_form_label_no_two_fields_alike(folders):
    """A user (and a browser test, by label) tells the fields apart by their labels: the SAE form beside the ViT
    form once had a second "Epochs", "Seed" and "Run name"."""
    at = AppTest.from_file(PAGE).run(timeout=TIMEOUT)
    labels = [w.label for kind in ("number_input", "text_input", "selectbox", "radio", "slider")
              for w in getattr(at, kind)]
    assert len(labels) > 10 and sorted(labels) == sorted(set(labels)), [x for x in labels if labels.count(x) > 1]


@pytest.mark.slow  # two training processes start (torch imported twice)
def test_an_sae_run_launches_stops_and_resumes_from_the_page(folders):
    images, runs_dir = folders
    at = AppTest.from_file(PAGE).run(timeout=TIMEOUT)
    fill_sae_run(at, images, "sae-run", 1000)  # far more steps than the test waits for
    at.button(key="sae_submit").click()
    at = at.run(timeout=TIMEOUT)
    assert not at.exception
    assert displayed(at.success[0].value).startswith("Started sae-run on ")
    status = runs_dir / "sae-run" / "status.json"
    wait(lambda: (read_status(status) or {}).get("step", 0) >= 3)

    at.button(key="stop-sae-run").click()
    at = at.run(timeout=TIMEOUT)
    manager = RunManager(runs_dir)
    wait(lambda: manager.get("sae-run").state == "cancelled")
    stopped_at = read_status(status)["step"]
    assert manager.get("sae-run").resumable  # last.pt saved on the stop

    at = at.run(timeout=TIMEOUT)
    at.button(key="resume-sae-run").click()
    at = at.run(timeout=TIMEOUT)
    assert not at.exception
    wait(lambda: (read_status(status) or {}).get("step", 0) > stopped_at)
    resumes = read_config(runs_dir / "sae-run" / "config.json")["resumes"]
    assert [r["step"] for r in resumes] == [stopped_at]  # continued where it stopped, not from scratch
    # Stopped again, unless it trained all its epochs while this test waited (a loaded machine: it did once).
    with contextlib.suppress(RunError):
        manager.stop("sae-run")
    wait(lambda: manager.get("sae-run").state in ("cancelled", "completed"))


def test_a_finished_sae_run_shows_its_curves_and_opens_the_explorer_with_its_folder(folders):
    images, runs_dir = folders
    out = runs_dir / "done"
    assert sae_main(["train", str(CHECKPOINT), "--data", str(images), "--layer", "2", "--width", "48", "--k", "4",
                     "--epochs", "2", "--batch-size", "64", "--buffer-tokens", "256", "--holdout", "2",
                     "--device", "cpu", "--out", str(out)]) == 0
    record_resume(out / "config.json", {"epochs": 2}, {"time": now_iso(), "step": 3, "epochs": 2})  # as vit.sae's
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT)  # in the app's navigation: its links
    at.switch_page("app_pages/training.py").run()
    assert not at.exception
    assert at.dataframe[0].value["State"][0] == "completed"
    charts = {json.loads(c.proto.spec)["layout"]["title"]["text"]: json.loads(c.proto.spec)
              for c in at.get("plotly_chart")}
    for title in ("SAE explained variance", "SAE L0 (latents per token)", "SAE dead fraction"):
        # Issue 69, item 12: a resume is a dashed line at the step it took over from.
        assert [(s["x0"], s["line"]["dash"]) for s in charts[title]["layout"]["shapes"]] == [(3, "dash")], title
    assert any(str(out) == c.value for c in at.code)
    at = follow_page_link(at, "Open with this SAE in the explorer")
    assert not at.exception, [e.message for e in at.exception]
    assert at.session_state["explorer_last_checkpoint"] == str(CHECKPOINT)  # the model it reads, opened
    assert at.toggle(key="sae_view").value and at.text_input(key="sae_folder").value == str(out)  # and the SAE
