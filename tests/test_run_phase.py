"""What a starting run does (issue 76, item 9): "running · starting" lasted 15-48 s without a word. The run says its
phase through its files (phase.json beside its launch.json until status.json exists, then status.json's ``phase``)
and the run manager shows it as the run's detail."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from helpers import displayed
from streamlit.testing.v1 import AppTest
from test_runs import NOW, record, status
from test_train import cache, cli, images, tiny_trainer  # noqa: F401 (fixtures)

import vit.core.runfiles as runfiles
from vit.core.runfiles import PHASE_FILE, PHASE_FILE_ENV, read_run_phase, record_run_phase
from vit.runs.manager import RunManager
from vit.runs.state import reconcile
from vit.train import main

PAGE = str(Path(__file__).resolve().parent.parent / "app_pages" / "training.py")


def test_a_starting_run_says_the_phase_it_recorded():
    assert reconcile(record(), None, True, None, "", NOW) == ("running", "starting")  # nothing said yet
    assert reconcile(record(), None, True, None, "", NOW, phase="reading the data") == \
        ("running", "starting: reading the data")


def test_a_training_run_says_its_status_files_phase_until_the_first_epoch_ends():
    assert reconcile(record(), status(phase="compiling the model (the first step)"), True, None, "", NOW) == \
        ("running", "compiling the model (the first step)")
    assert reconcile(None, status(phase="first epoch"), None, None, "", NOW) == ("running", "first epoch")
    assert reconcile(record(), status(phase=None), True, None, "", NOW) == ("running", None)


def test_the_phase_file_is_written_only_for_a_launched_process_and_by_rank_0(tmp_path, monkeypatch):
    path = tmp_path / PHASE_FILE
    monkeypatch.delenv(PHASE_FILE_ENV, raising=False)
    record_run_phase("reading the data")
    assert not path.exists()
    monkeypatch.setenv(PHASE_FILE_ENV, str(path))
    monkeypatch.setenv("RANK", "1")
    record_run_phase("reading the data")
    assert not path.exists()
    monkeypatch.setenv("RANK", "0")
    record_run_phase("reading the data")
    assert json.loads(path.read_text())["pid"] == os.getpid()
    assert read_run_phase(path) == "reading the data"
    path.write_text(json.dumps({"phase": "x" * 1000}))
    assert read_run_phase(path) == "x" * runfiles.MAX_PHASE_CHARS
    path.write_text("[1, 2]")
    assert read_run_phase(path) is None


def launched(runs_dir) -> Path:
    """A run launched by the manager whose process is alive (this test's), without a status.json yet."""
    launch = RunManager(runs_dir, runs_dir.parent / "data").launch_root / "tiny"
    launch.mkdir(parents=True)
    now = time.time()
    (launch / "launch.json").write_text(json.dumps({
        "name": "tiny", "params": {"dataset": "cifar10"}, "devices": ["cpu"], "state": "started", "queued_at": now,
        "sessions": [{"pid": os.getpid(), "started_at": now, "host": socket.gethostname()}]}))
    return launch


def test_the_manager_shows_what_a_launched_run_does_before_its_status_exists(tmp_path):
    launch = launched(tmp_path / "runs")
    manager = RunManager(tmp_path / "runs", tmp_path / "data")
    assert (manager.get("tiny").state, manager.get("tiny").detail) == ("running", "starting")
    (launch / PHASE_FILE).write_text(json.dumps({"pid": os.getpid(), "phase": "building the model"}))
    assert (manager.get("tiny").state, manager.get("tiny").detail) == ("running", "starting: building the model")


def test_the_train_page_shows_the_phase(tmp_path, monkeypatch):
    monkeypatch.setenv("VIT_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("VIT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("VIT_TRAIN_TOKEN", raising=False)
    launch = launched(tmp_path / "runs")
    (launch / PHASE_FILE).write_text(json.dumps({"pid": os.getpid(), "phase": "reading the data"}))
    at = AppTest.from_file(PAGE).run(timeout=300)
    assert not at.exception, [e.message for e in at.exception]
    assert any(displayed(m.value) == "tiny · running · starting: reading the data" for m in at.markdown), \
        [m.value for m in at.markdown]


def test_the_training_command_says_each_phase_in_order(images, cache, tmp_path, monkeypatch):  # noqa: F811
    said = []
    write_json = runfiles.write_json

    def recording(path, value):
        if path.name in (PHASE_FILE, runfiles.STATUS_FILE) and (not said or said[-1] != (path.name,
                                                                                            value.get("phase"))):
            said.append((path.name, value.get("phase")))
        write_json(path, value)

    monkeypatch.setattr(runfiles, "write_json", recording)
    monkeypatch.setenv(PHASE_FILE_ENV, str(tmp_path / PHASE_FILE))
    assert main(cli(images, cache, tmp_path / "run", "--epochs", "1")) == 0
    assert said == [(PHASE_FILE, "loading PyTorch"), (PHASE_FILE, "reading the data"),
                    (PHASE_FILE, "building the model"), ("status.json", "starting to train"),
                    ("status.json", "attention snapshot of the initial weights"), ("status.json", "first epoch"),
                    ("status.json", None)]


def test_a_compiled_run_says_it_compiles_first_and_a_resumed_one_where_it_resumed():
    trainer = tiny_trainer("--compile")
    assert trainer.opening_phase() == "compiling the model (the first step)"
    assert trainer.opening_phase(compiled=True) == "first epoch"
    trainer = tiny_trainer()
    assert trainer.opening_phase() == "first epoch"
    trainer.progress.epoch, trainer.progress.global_step = 4, 40
    assert trainer.opening_phase() == "resumed in epoch 5"
