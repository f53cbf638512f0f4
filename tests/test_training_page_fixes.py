"""What a new user hit on the Train page (issue 12), each through AppTest: device options that changed their
text under the form, a form that forgot its values on another page, a launch notice that outlived its run,
"None" in empty table cells, and training threads missing from the form."""

from __future__ import annotations

import datetime as dt
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from test_training_attention_page import fake_run, shown_text
from test_training_page import fill_tiny_run, submit

from vit.core.runfiles import now_iso
from vit.runs import launch
from vit.runs.manager import RunManager

ROOT = Path(__file__).resolve().parent.parent
PAGE = str(ROOT / "app_pages" / "training.py")
APP = str(ROOT / "app.py")
TIMEOUT = 300


@pytest.fixture
def folders(tmp_path, monkeypatch):
    monkeypatch.setenv("VIT_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("VIT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("VIT_CHECKPOINTS_DIR", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("VIT_DATA_ROOTS", str(tmp_path))  # the generated image folder lives here
    monkeypatch.delenv("VIT_TRAIN_TOKEN", raising=False)  # a developer's token would lock the page
    (tmp_path / "runs").mkdir()
    return tmp_path / "runs"


@pytest.fixture
def running_run(folders):
    """Make ``runs/NAME`` a CLI run folder whose training process is alive and beating on the CPU: a sleeping
    stand-in started with the command line the run manager checks (``vit.train --out RUN_DIR``)."""
    started = []

    def make(name: str) -> None:
        run = folders / name
        run.mkdir()
        process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "vit.train", "--out",
                                    str(run)])
        started.append(process)
        time.sleep(0.1)  # its start time must not be later than the status's
        (run / "config.json").write_text(json.dumps({"args": {"dataset": "cifar10", "epochs": 5, "device": "cpu"}}))
        (run / "status.json").write_text(json.dumps({
            "state": "running", "epoch": 1, "total_epochs": 5, "progress": 0.2, "pid": process.pid,
            "host": socket.gethostname(), "start_time": now_iso(), "updated_time": now_iso(), "device": "cpu",
            "world_size": 1}))

    yield make
    for process in started:
        process.kill()
        process.wait()


def test_device_options_keep_their_text_when_a_run_starts_using_the_device(folders, running_run):
    # The browser sends back the option's text; the old labels grew "· used by ..." once a run started,
    # so the next submit got the stale text as its value and reported "a device is listed twice".
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT).run()
    before = at.selectbox(key="train_devices").options
    running_run("busy")
    at = at.run()
    assert not at.exception
    assert at.selectbox(key="train_devices").options == before
    assert any("used by busy" in shown_text(c.value) for c in at.caption)  # the live state is still shown, beside it


def test_the_form_keeps_its_values_across_a_visit_to_another_page(folders):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.switch_page("app_pages/training.py").run()
    at.text_input(key="train_name").set_value("keep-me")
    at.number_input(key="train_epochs").set_value(7)
    at.number_input(key="train_threads").set_value(3)
    at.selectbox(key="train_recipe").set_value("seed")
    at.selectbox(key="train_dataset").set_value("folder")
    at.text_input(key="train_folder").set_value("no/such/folder")  # so the submit launches nothing
    at = submit(at)  # a form's values reach the server only when it is submitted
    assert any("not launched" in e.value for e in at.error)
    at.switch_page("app_pages/explorer.py").run()
    assert not at.exception
    at.switch_page("app_pages/training.py").run()
    assert not at.exception
    assert at.text_input(key="train_name").value == "keep-me"
    assert at.number_input(key="train_epochs").value == 7
    assert at.number_input(key="train_threads").value == 3
    assert at.selectbox(key="train_recipe").value == "seed"
    assert at.text_input(key="train_folder").value == "no/such/folder"


def test_the_launch_notice_goes_when_its_run_is_deleted(folders):
    fake_run(folders, "alpha", lr=0.001)
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT)
    at.session_state["train_notice"] = "Started alpha on the CPU."
    at.session_state["train_notice_run"] = "alpha"
    at = at.run()
    at.button(key="delete-alpha").click()
    at = at.run()
    assert not at.exception
    assert RunManager(folders).names() == []
    assert [s.value for s in at.success] == []


def test_the_launch_notice_goes_when_its_run_ends(folders, running_run):
    running_run("alpha")
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT)
    at.session_state["train_notice"] = "Started alpha on the CPU."
    at.session_state["train_notice_run"] = "alpha"
    at = at.run()
    assert [shown_text(s.value) for s in at.success] == ["Started alpha on the CPU."]
    status = json.loads((folders / "alpha" / "status.json").read_text())
    (folders / "alpha" / "status.json").write_text(json.dumps({**status, "state": "completed", "progress": 1.0}))
    at = at.run()
    assert not at.exception
    assert [s.value for s in at.success] == []


def test_a_run_started_from_the_command_line_says_where_its_output_went(folders, running_run):
    running_run("alpha")  # vit.train's process, no train.log yet
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT).run()
    assert not at.exception
    [log] = [c.value for c in at.code]
    assert log.startswith("(started outside this page") and "terminal" in log


def test_empty_table_cells_are_empty_not_none(folders, running_run):
    running_run("busy")  # no best accuracy, ETA, preset or batch size yet
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT).run()
    table = at.dataframe[0]
    assert table.value["Best val acc"].isna().all()  # numbers stay numbers (they sort) ...
    assert table.proto.HasField("placeholder") and table.proto.placeholder == ""  # ... and read as blanks


def test_default_threads_follow_the_machine():
    assert launch.default_threads(cores=2, load=0.0) == 1  # the shared two-core case of the issue
    assert launch.default_threads(cores=1, load=0.0) == 1
    assert launch.default_threads(cores=8, load=0.0) == 7  # one core left for the app
    assert launch.default_threads(cores=8, load=5.2) == 2  # only idle cores count
    assert launch.default_threads(cores=8, load=12.0) == 1
    assert launch.default_threads(cores=64, load=0.0) == 8
    assert 1 <= launch.default_threads() <= 8


def test_threads_reach_the_command_line():
    params = launch.RunParams(name="t", dataset="cifar10", threads=3)
    argv = launch.cli_args(params, Path("runs/t"), Path("data"))
    assert argv[argv.index("--threads") + 1] == "3"


@pytest.mark.slow
def test_a_second_launch_after_the_first_is_accepted_and_both_get_the_machine_threads(folders, tmp_path):
    from helpers import make_image_folder

    images = make_image_folder(tmp_path / "images")
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT).run()
    placeholder = at.number_input(key="train_threads").placeholder
    assert placeholder.startswith("this machine: ")
    machine = int(placeholder.removeprefix("this machine: "))
    fill_tiny_run(at, images, "first")
    at = submit(at)
    fill_tiny_run(at, images, "second")
    at = submit(at)
    assert not at.exception
    assert [e.value for e in at.error] == []  # no "a device is listed twice"
    manager = RunManager(folders)
    try:
        for name in ("first", "second"):
            record = json.loads((folders / ".launch" / name / "launch.json").read_text())
            assert record["params"]["threads"] == machine  # the field left empty: the machine's default
            for session in record["sessions"]:  # the second run may still wait in the queue for the CPU
                command = session["command"]
                assert command[command.index("--threads") + 1] == str(machine)
            assert record["devices"] == ["cpu"]
    finally:
        for name in ("second", "first"):
            info = manager.get(name)
            if info.active:
                manager.stop(name)
        deadline = time.time() + TIMEOUT
        while any(manager.get(n).state == "running" for n in ("first", "second")) and time.time() < deadline:
            time.sleep(0.5)


def test_the_form_passes_snapshot_and_checkpoint_intervals_to_the_cli(tmp_path):
    from vit.runs.launch import RunParams, cli_args

    argv = cli_args(RunParams(name="r", dataset="cifar10", save_every=5, attention_every=0), tmp_path / "r",
                    tmp_path / "data")
    assert argv[argv.index("--save-every") + 1] == "5" and argv[argv.index("--attention-every") + 1] == "0"
    assert "--save-every" not in cli_args(RunParams(name="r", dataset="cifar10"), tmp_path / "r", tmp_path / "data")


def test_the_live_loss_curve_is_drawn_from_steps_jsonl(tmp_path, monkeypatch):
    """A run's training loss every few seconds is charted before (and besides) the per-epoch curves."""
    from helpers import make_image_folder as make_folder
    from streamlit.testing.v1 import AppTest
    from test_training_page import PAGE, TIMEOUT

    from vit.train import main

    monkeypatch.setenv("VIT_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("VIT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("VIT_TRAIN_TOKEN", raising=False)
    monkeypatch.delenv("VIT_RAY_ADDRESS", raising=False)
    monkeypatch.setattr("vit.training.trainer.STEP_ROW_SECONDS", 0.0)
    images = make_folder(tmp_path / "images", per_class=6)
    assert main(["--dataset", f"folder:{images}", "--out", str(tmp_path / "runs" / "live"), "--cache-dir",
                 str(tmp_path / "cache"), "--image-size", "8", "--patch-size", "4", "--hidden-size", "8",
                 "--num-layers", "1", "--num-heads", "2", "--mlp-size", "16", "--epochs", "1", "--batch-size", "2",
                 "--attention-every", "0"]) == 0
    at = AppTest.from_file(PAGE).run(timeout=TIMEOUT)
    assert not at.exception, [e.message for e in at.exception]
    titles = [__import__("json").loads(c.proto.spec)["layout"]["title"]["text"] for c in at.get("plotly_chart")]
    assert "Training loss, every few seconds" in titles


def test_the_runs_table_fits_the_page_at_a_1400_px_window(tmp_path, monkeypatch):
    """Issue 33, item 10: at 1400 px the table was cut off after "LR" (Weight decay, Started and Detail out of
    sight). Every column it shows has a set width, all within the page's 940-px main column, what went wrong first."""
    monkeypatch.setenv("VIT_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("VIT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("VIT_TRAIN_TOKEN", raising=False)
    run = tmp_path / "runs" / "failed-run"
    run.mkdir(parents=True)
    (run / "status.json").write_text(json.dumps({"state": "failed", "error": "ValueError: no images"}))
    at = AppTest.from_file(PAGE).run(timeout=TIMEOUT)
    assert not at.exception, [e.message for e in at.exception]
    table = at.dataframe[0].proto
    columns = json.loads(table.columns)
    shown = list(table.column_order)
    assert shown[:3] == ["Name", "State", "Detail"]
    assert set(shown) <= set(at.dataframe[0].value.columns)
    widths = [columns[name]["width"] for name in shown]
    assert all(isinstance(w, int) for w in widths) and sum(widths) <= 940


def test_a_running_runs_button_reads_resume_greyed_not_restart(folders, running_run):
    """Issue 69, item 12: a running run's button read "Restart" (greyed), which a running run can never be."""
    running_run("live")
    at = AppTest.from_file(PAGE).run(timeout=TIMEOUT)
    assert not at.exception, [e.message for e in at.exception]
    button = at.button(key="resume-live")
    assert (button.label, button.disabled) == ("Resume", True)
    assert "stop it first" in button.help


def charts_by_title(at: AppTest) -> dict[str, dict]:
    return {json.loads(c.proto.spec)["layout"]["title"]["text"]: json.loads(c.proto.spec)
            for c in at.get("plotly_chart")}


def resume_lines(figure: dict) -> list[tuple[float, str]]:
    """(x, hover text) of each vertical dashed line on a chart, from its shapes and their annotations."""
    layout = figure["layout"]
    lines = [s for s in layout.get("shapes", []) if s["type"] == "line" and s["x0"] == s["x1"]]
    assert all(s["line"]["dash"] == "dash" for s in lines)
    hovers = {a["x"]: a.get("hovertext") for a in layout.get("annotations", []) if a.get("text") == "resumed"}
    return [(s["x0"], hovers.get(s["x0"])) for s in lines]


def test_each_resume_recorded_is_a_dashed_line_on_every_curve(folders):
    """Issue 69, item 12: a stop and a resume left no mark on the curves. Each entry of config.json's "resumes" is a
    dashed line at the epochs done where it took over (an entry from before "at_epoch": its epoch), with the run and
    the time on hover."""
    run = folders / "paused"
    run.mkdir()
    resumes = [{"time": "2026-11-20T10:30:00+00:00", "from_epoch": 1, "from_step": 6, "at_epoch": 1.5},
               {"time": "2026-11-20T11:00:00+00:00", "from_epoch": 2, "from_step": 8}, "damaged"]
    (run / "config.json").write_text(json.dumps({"args": {"dataset": "cifar10", "epochs": 3}, "resumes": resumes}))
    (run / "status.json").write_text(json.dumps({
        "state": "completed", "epoch": 3, "total_epochs": 3, "progress": 1.0, "pid": 1, "host": "elsewhere",
        "start_time": "2026-11-20T10:00:00+00:00", "updated_time": "2026-11-20T11:30:00+00:00", "device": "cpu",
        "world_size": 1}))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"epoch": e, "train_loss": 1 / e, "val_loss": 1.0,
                                                           "train_acc": 0.5, "val_acc": 0.5, "lr": 1e-3}) + "\n"
                                               for e in (1, 2, 3)))
    (run / "steps.jsonl").write_text("".join(json.dumps({"step": s, "epoch": s / 4, "train_loss": 1 / (s + 1)}) + "\n"
                                             for s in range(13)))
    at = AppTest.from_file(PAGE).run(timeout=TIMEOUT)
    assert not at.exception, [e.message for e in at.exception]
    charts = charts_by_title(at)
    assert "Training loss, every few seconds" in charts and len(charts) >= 3
    local = [dt.datetime.fromisoformat(r["time"]).astimezone().strftime("%m-%d %H:%M") for r in resumes[:2]]
    for title, figure in charts.items():
        assert resume_lines(figure) == [(1.5, f"paused: resumed at epoch 1.5 ({local[0]})"),
                                        (2, f"paused: resumed at epoch 2 ({local[1]})")], title


def test_a_run_resumed_from_the_command_line_is_marked_where_it_took_over(tmp_path, monkeypatch):
    """The resume vit.train records says how many epochs were done ("at_epoch"), which the curves mark."""
    from helpers import make_image_folder as make_folder

    from vit.core.runfiles import read_config
    from vit.train import main

    monkeypatch.setenv("VIT_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("VIT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("VIT_TRAIN_TOKEN", raising=False)
    monkeypatch.delenv("VIT_RAY_ADDRESS", raising=False)
    images = make_folder(tmp_path / "images", per_class=6)
    out = tmp_path / "runs" / "twice"
    assert main(["--dataset", f"folder:{images}", "--out", str(out), "--cache-dir", str(tmp_path / "cache"),
                 "--image-size", "8", "--patch-size", "4", "--hidden-size", "8", "--num-layers", "1", "--num-heads",
                 "2", "--mlp-size", "16", "--epochs", "1", "--batch-size", "2", "--attention-every", "0"]) == 0
    assert main(["--resume", str(out), "--epochs", "2"]) == 0
    [resume] = read_config(out / "config.json")["resumes"]
    assert resume["at_epoch"] == 1.0  # one whole epoch was done when it took over
    at = AppTest.from_file(PAGE).run(timeout=TIMEOUT)
    assert not at.exception, [e.message for e in at.exception]
    assert [x for x, _ in resume_lines(charts_by_title(at)["Training loss, every few seconds"])] == [1.0]
