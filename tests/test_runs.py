"""The run manager: validation, reconciling files with processes, and real tiny training runs.

The slow tests start the real training CLI on a generated 2-class folder of 16 px images with
a one-layer model. Every scenario is launched up front (each in its own runs folder) so their
start-ups, which dominate on a busy machine, overlap; each test then waits for its own.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vit.core.runfiles import LAUNCH_DIR, default_runs_dir
from vit.runs.devices import DeviceInfo, device_choices
from vit.runs.display import RunInfo, curve_rows, table_rows
from vit.runs.launch import RunParams, ValidationError, launch_command, preset_summary
from vit.runs.manager import RunError, RunManager
from vit.runs.state import proc_cmdline, proc_start, reconcile

WAIT_SECONDS = 900  # generous: on two shared cores a niced Python needs minutes to import torch
TINY = dict(image_size=16, patch_size=4, hidden_size=16, num_layers=1, num_heads=2, mlp_size=32,
            batch_size=4, warmup_epochs=0, augment="none")


def make_image_folder(root: Path, classes: tuple[str, ...] = ("cat", "dog"), per_class: int = 10) -> Path:
    """A folder dataset ROOT/<class>/<n>.png of random 16 px RGB images."""
    rng = np.random.default_rng(0)
    for name in classes:
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(root / name / f"{i}.png")
    return root


def make_manager(root: Path, **env: str) -> RunManager:
    """A manager on ROOT/runs whose training processes are niced and single-threaded."""
    return RunManager(root / "runs", root / "data", nice=19, env={"OMP_NUM_THREADS": "1", **env},
                      stop_grace_seconds=60, data_roots=(root.parent,))  # tests keep images beside the runs


def tiny_params(run_name: str, folder: Path, **changes) -> RunParams:
    """A 2-epoch run of a one-layer 16 px model on ``folder``; ``changes`` override any field."""
    return RunParams(**{"name": run_name, "dataset": f"folder:{folder}", **TINY, "epochs": 2, **changes})


def wait_for(manager: RunManager, name: str, done, timeout: float = WAIT_SECONDS) -> tuple[RunInfo, list[str]]:
    """Poll like the page does until ``done(info)``; returns the info and every state seen."""
    seen: list[str] = []
    deadline = time.time() + timeout
    while True:
        manager.poll()
        info = manager.get(name)
        if not seen or seen[-1] != info.state:
            seen.append(info.state)
        if done(info):
            return info, seen
        if time.time() > deadline:
            raise AssertionError(f"{name} still {info.state} ({info.detail}) after {timeout} s; seen {seen}\n"
                                 f"{manager.log_tail(name)}")
        time.sleep(0.5)


def training(info: RunInfo) -> bool:
    """Running and past its first optimizer step (status.json written by this session)."""
    return info.state == "running" and info.detail is None and (info.run_dir / "status.json").is_file()


def finished(info: RunInfo) -> bool:
    return info.state not in ("queued", "running")


# ---------------------------------------------------------------------------------------------
# Fast: no processes


def test_default_runs_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("VIT_RUNS_DIR", str(tmp_path / "elsewhere"))
    assert default_runs_dir() == tmp_path / "elsewhere"
    monkeypatch.delenv("VIT_RUNS_DIR")
    assert default_runs_dir() == Path(__file__).resolve().parent.parent / "runs"


@pytest.fixture
def dataset(tmp_path) -> Path:
    return make_image_folder(tmp_path / "images")


def test_valid_parameters_have_no_errors(tmp_path, dataset):
    assert make_manager(tmp_path).validate(tiny_params("ok", dataset)) == {}


@pytest.mark.parametrize("change, field, words", [
    (dict(name=""), "name", "give the run a name"),
    (dict(name="../escape"), "name", "letters, digits"),
    (dict(dataset="imagenet"), "dataset", "unknown dataset"),
    (dict(dataset="folder:/no/such/folder"), "dataset", "folder datasets must be inside"),
    (dict(preset="vit-tiny"), "preset", "unknown preset"),
    (dict(epochs=0), "epochs", "positive integer"),
    (dict(batch_size=-4), "batch_size", "positive integer"),
    (dict(lr=0.0), "lr", "positive number"),
    (dict(weight_decay=-1.0), "weight_decay", "[0, 10)"),
    (dict(label_smoothing=1.0), "label_smoothing", "[0, 1)"),
    (dict(ema=1.5), "ema", "[0, 1)"),
    (dict(augment="wild"), "augment", "invalid choice"),
    (dict(recipe="mine"), "recipe", "invalid choice"),
    (dict(seed=-1), "seed", "integer >= 0"),
    (dict(hidden_size=0), "hidden_size", "positive integer"),
    (dict(patch_size=5), "image_size", "divisible by patch_size"),
    (dict(num_heads=3), "hidden_size", "divisible by num_heads"),
    (dict(epochs=2, warmup_epochs=2), "warmup_epochs", "must be below --epochs"),
    (dict(devices=("cuda:7",)), "devices", "GPU"),
    (dict(devices=("cpu", "cuda:0")), "devices", "not both"),
])
def test_each_bad_field_gets_its_own_message(tmp_path, dataset, change, field, words):
    errors = make_manager(tmp_path).validate(tiny_params("bad", dataset, **change))
    assert field in errors, errors
    assert words in errors[field]


def test_several_bad_fields_are_all_reported(tmp_path, dataset):
    errors = make_manager(tmp_path).validate(tiny_params("", dataset, epochs=0, lr=-1.0, ema=2.0))
    assert set(errors) == {"name", "epochs", "lr", "ema"}


def test_a_taken_name_is_refused(tmp_path, dataset):
    (tmp_path / "runs" / "taken").mkdir(parents=True)
    errors = make_manager(tmp_path).validate(tiny_params("taken", dataset))
    assert "already exists" in errors["name"]


def test_launch_with_bad_parameters_raises_and_writes_nothing(tmp_path, dataset):
    manager = make_manager(tmp_path)
    with pytest.raises(ValidationError) as caught:
        manager.launch(tiny_params("never", dataset, epochs=0))
    assert set(caught.value.errors) == {"epochs"}
    assert manager.list_runs() == []


def test_one_device_runs_the_cli_directly():
    command, env = launch_command(["--dataset", "mnist"], ("cuda:1",))
    assert command == [sys.executable, "-m", "vit.train", "--dataset", "mnist", "--device", "cuda:1"]
    assert env == {}


def test_several_gpus_run_under_torchrun_with_only_those_visible(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    command, env = launch_command(["--dataset", "mnist"], ("cuda:0", "cuda:2"), nice=5)
    assert command == ["nice", "-n", "5", sys.executable, "-m", "torch.distributed.run", "--standalone",
                       "--nproc_per_node=2", "-m", "vit.train", "--dataset", "mnist", "--device", "cuda"]
    assert env == {"CUDA_VISIBLE_DEVICES": "0,2"}


def test_torchrun_maps_gpu_numbers_through_an_existing_visibility_list(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")
    assert launch_command([], ("cuda:0", "cuda:2"))[1] == {"CUDA_VISIBLE_DEVICES": "4,6"}


def test_device_choices_offer_each_gpu_all_gpus_and_the_cpu():
    devices = [DeviceInfo("cuda:0", "H100", 80 * 2**30, 60 * 2**30), DeviceInfo("cuda:1", "H100", 80 * 2**30,
                                                                              80 * 2**30),
               DeviceInfo("cpu", "2 cores")]
    choices = device_choices(devices)
    assert [c[0] for c in choices] == [("cuda:0",), ("cuda:1",), ("cuda:0", "cuda:1"), ("cpu",)]
    assert "20.0 of 80 GiB in use" in choices[0][1]
    assert "torchrun" in choices[2][1]


def test_device_choices_name_the_runs_using_each_device():
    choices = device_choices([DeviceInfo("cpu", "2 cores")], {"cpu": ["cifar10-cifar-s"]})
    assert choices[0][1].endswith("· used by cifar10-cifar-s")


def test_without_gpus_the_cpu_is_the_only_choice_and_says_so():
    assert device_choices([DeviceInfo("cpu", "2 cores")]) == [(("cpu",), "CPU (2 cores): no CUDA GPU on this machine")]


def test_preset_summary_names_parameters_and_the_seed_figure():
    assert preset_summary("tintn-cifar10") == ("tintn-cifar10 · 0.12 M parameters · "
                                               "reproduces 75.5 % CIFAR-10 (seed blog)")
    assert "98.5 % MNIST" in preset_summary("mnist-p7")
    assert "reproduces" not in preset_summary("cifar-m")


# Reconciling: hand-made records, status files and process facts.

NOW = 1_000_000.0


def record(started: float = NOW - 100, **changes) -> dict:
    return {"state": "started", "sessions": [{"pid": 4242, "started_at": started}], "stop_requested_at": None,
            **changes}


def status(state: str = "running", updated: float = NOW - 2, pid: int = 4242, **changes) -> dict:
    iso = dt.datetime.fromtimestamp(updated, dt.UTC).isoformat(timespec="seconds")
    return {"state": state, "updated_time": iso, "pid": pid, "error": None, **changes}


@pytest.mark.parametrize("rec, stat, alive, code, output, expected", [
    (record(state="queued", queue_reason="waiting for CPU"), None, None, None, "", ("queued", "waiting for CPU")),
    (record(), None, True, None, "", ("running", "starting")),
    (record(), status(), True, None, "", ("running", None)),
    (record(), status("completed"), False, 0, "", ("completed", None)),
    (record(), status("cancelled"), False, 0, "", ("cancelled", None)),
    (record(), status("failed", error="RuntimeError: boom"), False, 1, "", ("failed", "RuntimeError: boom")),
    (record(), status(), False, -9, "", ("crashed", "killed by SIGKILL without a final state")),
    (record(), status(updated=NOW - 600), True, None, "", ("crashed", "no heartbeat for 600 s")),
    (record(), None, False, 2, "vit.train: error: --batch-size 64 is larger than the 18 training images",
     ("failed", "--batch-size 64 is larger than the 18 training images")),
    (record(stop_requested_at=NOW - 5), None, False, -15, "", ("cancelled", "stopped before training started")),
    (record(stop_requested_at=NOW - 90), status(), False, -9, "",
     ("cancelled", "killed after the stop grace period; resumes from the last saved epoch")),
    (None, status(), None, None, "", ("running", None)),
    (None, status(), False, None, "", ("crashed", "process 4242 is gone without a final state")),
])
def test_reconcile(rec, stat, alive, code, output, expected):
    assert reconcile(rec, stat, alive, code, output, NOW) == expected


def test_a_usage_error_is_read_from_the_end_record_not_from_the_output():
    # Anything may print after the error line (a library's exit noise: 27-31 lines with torch 2.15's triton)
    end = {"pid": 4242, "exit_code": 2, "error": "--batch-size 64 is larger than the 18 training images"}
    noise = "vit.train: error: --batch-size 64 is larger than the 18 training images\n" + "nanobind: leaked\n" * 30
    assert reconcile(record(), None, False, 2, noise[-40:], NOW, end=end) == ("failed", end["error"])
    assert reconcile(record(), None, False, 2, noise[-40:], NOW)[0] == "crashed"


def test_a_previous_sessions_final_status_does_not_end_a_resumed_run():
    old = status("cancelled", updated=NOW - 50, pid=1111)
    assert reconcile(record(started=NOW - 10), old, True, None, "", NOW) == ("running", "starting")


def test_table_rows_keep_numbers_sortable(tmp_path):
    info = RunInfo(name="a", state="running", detail=None, run_dir=tmp_path, devices=("cuda:0",), epoch=3,
                   total_epochs=10, progress=0.25, best_val_acc=0.5, eta_seconds=90.4, elapsed_seconds=30.0,
                   settings={"preset": "tintn-cifar10", "dataset": "folder:/x/birds", "lr": 0.002})
    row = table_rows([info])[0]
    assert row["Progress"] == 0.25 and row["Epoch"] == "3/10" and row["Best val acc"] == 0.5
    assert row["ETA"] == dt.timedelta(seconds=90) and row["Elapsed"] == dt.timedelta(seconds=30)
    assert row["Device"] == "GPU 0" and row["Dataset"] == "folder:birds" and row["LR"] == 0.002


def test_a_run_folder_named_with_a_right_to_left_override_shows_it_in_the_table(tmp_path):
    """Issue 20, item 9: run names are folder names; U+202E in one turned the rest of the name around."""
    (tmp_path / "runs" / "evil\u202egpj.exe").mkdir(parents=True)
    (tmp_path / "runs" / "evil\u202egpj.exe" / "status.json").write_text(
        json.dumps({"state": "failed", "error": "ValueError: folder:/x/\u202ebad"}))
    [row] = table_rows(RunManager(tmp_path / "runs", tmp_path / "data").poll())
    assert row["Name"] == "evil\\u202egpj.exe"
    assert "\u202e" not in row["Detail"] and "\\u202ebad" in row["Detail"]


@pytest.mark.parametrize("name", ["evil\u202egpj.exe", "a\u2066b", "run\x1b[31m", "zero\u200bwidth", "caf\u00e9"])
def test_a_run_name_the_page_creates_is_refused_with_control_or_non_ascii_characters(tmp_path, name):
    errors = make_manager(tmp_path).validate(tiny_params(name, make_image_folder(tmp_path / "images")))
    assert errors["name"].startswith("use letters, digits")


def test_curve_rows_overlay_runs_per_chart():
    charts = curve_rows({"a": [{"epoch": 1, "train_loss": 2.0, "val_loss": 1.5, "lr": 0.1}],
                         "b": [{"epoch": 1, "train_loss": 3.0, "val_loss": None}]})
    assert charts["loss"] == [{"run": "a", "epoch": 1, "split": "train", "value": 2.0},
                              {"run": "a", "epoch": 1, "split": "val", "value": 1.5},
                              {"run": "b", "epoch": 1, "split": "train", "value": 3.0}]
    assert charts["learning rate"] == [{"run": "a", "epoch": 1, "split": "end of epoch", "value": 0.1}]


def test_a_queued_run_can_be_cancelled_and_deleted_without_a_process(tmp_path, dataset):
    manager = make_manager(tmp_path)
    launch_dir = manager.launch_root / "waiting"
    launch_dir.mkdir(parents=True)
    (launch_dir / "launch.json").write_text(
        '{"name": "waiting", "params": {}, "devices": ["cpu"], "state": "queued", "queued_at": 1.0, '
        '"queue_reason": "waiting for CPU", "sessions": []}')
    assert manager.get("waiting").state == "queued"
    assert manager.stop("waiting").state == "cancelled"
    manager.delete("waiting")
    assert manager.names() == []


def queue_record(manager: RunManager, name: str, devices: list[str], queued_at: float, share: bool = False) -> None:
    folder = manager.launch_root / name
    folder.mkdir(parents=True)
    (folder / "launch.json").write_text(json.dumps({
        "name": name, "params": {}, "devices": devices, "state": "queued", "queued_at": queued_at,
        "allow_sharing": share, "sessions": []}))


@pytest.fixture
def fake_starts(tmp_path, monkeypatch) -> tuple[RunManager, list[str]]:
    """A manager whose 'processes' are this test process, so dispatch decisions run without training."""
    manager = make_manager(tmp_path)
    started: list[str] = []

    def start(record: dict) -> None:
        started.append(record["name"])
        record["sessions"].append({"pid": os.getpid(), "pgid": os.getpgid(0), "started_at": time.time(),
                                   "host": socket.gethostname(), "proc_start": None})
        record["state"] = "started"
        manager._save_record(record)

    monkeypatch.setattr(manager, "_start", start)
    return manager, started


def test_queued_runs_start_in_order_when_their_device_is_free(fake_starts):
    manager, started = fake_starts
    queue_record(manager, "cpu-first", ["cpu"], 1.0)
    queue_record(manager, "gpu", ["cuda:0"], 2.0)
    queue_record(manager, "cpu-second", ["cpu"], 3.0)
    manager.poll()
    assert started == ["cpu-first", "gpu"]
    waiting = manager.get("cpu-second")
    assert waiting.state == "queued" and waiting.detail == "waiting for CPU: in use by cpu-first"


def test_a_run_allowed_to_share_starts_beside_a_running_one(fake_starts):
    manager, started = fake_starts
    queue_record(manager, "first", ["cpu"], 1.0)
    queue_record(manager, "sharing", ["cpu"], 2.0, share=True)
    manager.poll()
    assert started == ["first", "sharing"]


def test_a_later_run_does_not_overtake_an_earlier_queued_one(fake_starts):
    manager, started = fake_starts
    queue_record(manager, "running", ["cuda:0"], 1.0)
    queue_record(manager, "both-gpus", ["cuda:0", "cuda:1"], 2.0)
    queue_record(manager, "second-gpu", ["cuda:1"], 3.0)
    manager.poll()
    assert started == ["running"]
    assert "earlier queued runs go first" in manager.get("second-gpu").detail


def test_unknown_runs_raise_run_error(tmp_path):
    with pytest.raises(RunError, match="no run named"):
        make_manager(tmp_path).get("ghost")


def test_folders_without_run_files_and_our_launch_folder_are_not_runs(tmp_path):
    manager = make_manager(tmp_path)
    (manager.runs_dir / "notes").mkdir(parents=True)
    (manager.runs_dir / LAUNCH_DIR).mkdir()
    assert manager.names() == []


# ---------------------------------------------------------------------------------------------
# Slow: real training processes


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory):
    """Launch every real-process scenario at once, each in its own runs folder."""
    root = tmp_path_factory.mktemp("scenarios")
    data = make_image_folder(root / "images")
    s = {}
    s["queue"] = make_manager(root / "queue")
    s["launched"] = {"first": s["queue"].launch(tiny_params("first", data)).state,
                     "second": s["queue"].launch(tiny_params("second", data)).state}  # same CPU, no sharing
    s["stop"] = make_manager(root / "stop")
    s["stop"].launch(tiny_params("long", data, epochs=1000))
    s["kill"] = make_manager(root / "kill")
    s["kill"].launch(tiny_params("victim", data, epochs=1000))
    s["fault"] = make_manager(root / "fault", VIT_TRAIN_FAULT_AT_STEP="3")
    s["fault"].launch(tiny_params("faulty", data))
    s["usage"] = make_manager(root / "usage")
    s["usage"].launch(tiny_params("too-big-batch", data, batch_size=64))  # only the CLI knows the image count
    yield s
    # A failed test must not leave training processes behind.
    for manager in (v for v in s.values() if isinstance(v, RunManager)):
        for run in manager.list_runs():
            if run.state == "running" and run.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(run.pid, signal.SIGKILL)  # launched runs lead their own process group


@pytest.mark.slow
def test_sigkill_of_the_process_is_crashed(scenarios):
    manager = scenarios["kill"]
    info, _ = wait_for(manager, "victim", training)
    os.kill(info.pid, signal.SIGKILL)
    info, _ = wait_for(manager, "victim", finished, timeout=30)
    assert info.state == "crashed"
    assert "SIGKILL" in info.detail or "gone" in info.detail


@pytest.mark.slow
def test_stop_ends_cancelled_with_a_last_pt_and_resume_completes(scenarios):
    manager = scenarios["stop"]
    wait_for(manager, "long", training)
    manager.stop("long")
    info, _ = wait_for(manager, "long", finished, timeout=120)
    assert info.state == "cancelled"
    assert info.resumable
    done = len(manager.metrics("long"))
    info = manager.resume("long", epochs=done + 1)
    assert info.state == "running"
    info, seen = wait_for(manager, "long", finished)
    assert info.state == "completed", (info.detail, manager.log_tail("long"))
    assert len(manager.metrics("long")) == done + 1
    assert "resume" in manager.log_tail("long", lines=1000)


@pytest.mark.slow
def test_launch_goes_running_then_completed(scenarios):
    assert scenarios["launched"]["first"] == "running"
    info, _ = wait_for(scenarios["queue"], "first", finished)
    assert info.state == "completed", info.detail
    assert info.best_checkpoint.is_file()
    assert info.progress == 1.0 and info.epoch == 2
    # The page's log box ends on the line that says how the run ended (with triton loaded, 27-31 lines of nanobind
    # leak noise once followed it and filled the box).
    last = scenarios["queue"].log_tail("first", lines=15).splitlines()[-1]
    assert " completed " in last and "after 2 epochs" in last, last


@pytest.mark.slow
def test_a_second_run_on_the_same_device_waits_queued_then_completes(scenarios):
    manager = scenarios["queue"]
    assert scenarios["launched"]["second"] == "queued"
    info, seen = wait_for(manager, "second", finished)
    assert info.state == "completed", info.detail
    first_end = (manager.run_dir("first") / "status.json").stat().st_mtime
    assert "running" in seen
    assert info.started_at >= first_end - 1  # it started only after the first ended


@pytest.mark.slow
def test_states_survive_a_new_manager(scenarios):
    old = scenarios["queue"]
    wait_for(old, "second", finished)
    fresh = RunManager(old.runs_dir, old.data_dir)  # as after a server restart
    assert [(r.name, r.state) for r in fresh.list_runs()] == [(r.name, r.state) for r in old.list_runs()]
    assert {r.state for r in fresh.list_runs()} == {"completed"}


@pytest.mark.slow
def test_an_exception_inside_training_is_failed_with_its_message(scenarios):
    info, _ = wait_for(scenarios["fault"], "faulty", finished)
    assert info.state == "failed"
    assert info.detail == "RuntimeError: injected fault at step 3 (VIT_TRAIN_FAULT_AT_STEP)"


@pytest.mark.slow
def test_a_cli_usage_error_before_status_is_failed_with_its_line(scenarios):
    manager = scenarios["usage"]
    info, _ = wait_for(manager, "too-big-batch", finished)
    assert info.state == "failed"
    assert info.detail.startswith("--batch-size 64 is larger than the 18 training images")
    end = json.loads((manager.launch_root / "too-big-batch" / "end.json").read_text())  # read from here, not the log
    assert end["error"] == info.detail and end["exit_code"] == 2


# ---------------------------------------------------------------------------------------------
# Damaged run files: one bad folder is one row saying why, never an error for the whole list

GOOD_LAUNCH = {"name": "bad", "params": {}, "devices": ["cpu"], "state": "queued", "queued_at": 1.0,
               "queue_reason": None, "sessions": []}
CORRUPTIONS = [  # (file, content, words of the reason)
    ("status.json", "[1, 2]", "status.json holds a JSON list, not an object"),
    ("status.json", '"running"', "holds a JSON str"),
    ("status.json", "42", "holds a JSON int"),
    ("status.json", "{not json", "status.json is not valid JSON"),
    ("status.json", '{"state": 5}', "'state' is 5, not text"),
    ("status.json", '{"state": "exploded"}', "state 'exploded' is not one of"),
    ("status.json", '{"pid": 12}', "status.json lacks 'state'"),
    ("status.json", '{"state": "running", "pid": "4242"}', "'pid' is \"4242\", not a whole number"),
    ("status.json", '{"state": "running", "pid": true}', "'pid' is true, not a whole number"),
    ("status.json", '{"state": "running", "updated_time": 17}', "'updated_time' is 17, not text"),
    ("status.json", '{"state": "running", "progress": "half"}', "'progress' is \"half\", not a number"),
    ("status.json", '{"state": "running", "progress": NaN}', "'progress' is NaN, not a number"),
    ("status.json", '{"state": "failed", "error": ["boom"]}', "'error' is list, not text"),
    ("status.json", '{"state": "running", "device": 0}', "'device' is 0, not text"),
    ("status.json", '{"state": "running", "world_size": "2"}', "'world_size' is \"2\", not a whole number"),
    ("config.json", "[]", "config.json holds a JSON list"),
    ("config.json", '{"args": "epochs=3"}', "'args' is \"epochs=3\", not an object"),
    ("config.json", '{"args": {"epochs": "ten"}}', "config.json args: 'epochs' is \"ten\", not a whole number"),
    ("config.json", '{"args": {"dataset": 5}}', "'dataset' is 5, not text"),
    ("config.json", '{"args": {"lr": "fast"}}', "'lr' is \"fast\", not a number"),
    ("launch.json", "null", "launch.json holds a JSON NoneType"),
    ("launch.json", {**GOOD_LAUNCH, "sessions": "none"}, "'sessions' is \"none\", not a list"),
    ("launch.json", {**GOOD_LAUNCH, "state": "started"}, "a started run without a session"),
    ("launch.json", {**GOOD_LAUNCH, "sessions": [5]}, "session 1 is not an object"),
    ("launch.json", {**GOOD_LAUNCH, "state": "started", "sessions": [{"pid": "1", "started_at": 1.0}]},
     "session 1: 'pid' is \"1\", not a whole number"),
    ("launch.json", {**GOOD_LAUNCH, "devices": "cpu"}, "'devices' is \"cpu\", not a list"),
    ("launch.json", {**GOOD_LAUNCH, "devices": [0]}, "devices must be a list of device names"),
    ("launch.json", {**GOOD_LAUNCH, "queued_at": "yesterday"}, "'queued_at' is \"yesterday\", not a number"),
    ("launch.json", {**GOOD_LAUNCH, "params": {"epochs": [3]}}, "launch.json params: 'epochs' is list"),
    ("launch.json", {k: v for k, v in GOOD_LAUNCH.items() if k != "name"}, "launch.json lacks 'name'"),
]


@pytest.mark.parametrize("file, content", [
    ("status.json", {"state": "running", "eta_seconds": 1e300, "host": "another-machine", "updated_time": "now",
                     "start_time": "1970-01-01T00:00:00+00:00"}),
    ("status.json", {"state": "completed", "start_time": "9999-12-31T23:59:59+00:00", "epoch": 10**30}),
    ("launch.json", {**GOOD_LAUNCH, "queued_at": 1e300}),
    ("launch.json", {**GOOD_LAUNCH, "queued_at": -1e300}),
])
def test_absurd_numbers_in_run_files_still_give_a_table(tmp_path, file, content):
    manager = make_manager(tmp_path)
    write_good_run(manager.runs_dir)
    if content.get("updated_time") == "now":  # a live heartbeat from another machine: shown as running
        content = {**content, "updated_time": dt.datetime.now(dt.UTC).isoformat()}
    write_damaged(manager, file, content)
    runs = manager.poll()
    rows = {row["Name"]: row for row in table_rows(runs)}
    assert set(rows) == {"good", "bad"}


def write_good_run(runs: Path, name: str = "good") -> None:
    folder = runs / name
    folder.mkdir(parents=True)
    (folder / "status.json").write_text(json.dumps({"state": "completed", "updated_time": "2026-01-01T00:00:00+00:00",
                                                   "epoch": 2, "total_epochs": 2}))
    (folder / "config.json").write_text(json.dumps({"args": {"epochs": 2, "dataset": "cifar10", "lr": 0.001}}))
    (folder / "metrics.jsonl").write_text('{"epoch": 1, "train_loss": 2.0}\n{"epoch": 2, "train_loss": 1.0}\n')


def write_damaged(manager: RunManager, file: str, content) -> None:
    text = content if isinstance(content, str) else json.dumps(content)
    if file == "launch.json":
        folder = manager.launch_root / "bad"
    else:
        folder = manager.run_dir("bad")
        other = "config.json" if file == "status.json" else "status.json"
        folder.mkdir(parents=True)
        (folder / other).write_text('{"state": "failed", "error": "x"}' if other == "status.json" else '{"args": {}}')
    folder.mkdir(parents=True, exist_ok=True)
    (folder / file).write_text(text)


@pytest.mark.parametrize("file, content, words", CORRUPTIONS, ids=[f"{f}-{i}" for i, (f, _, _) in
                                                                   enumerate(CORRUPTIONS)])
def test_a_damaged_run_file_makes_one_damaged_row_and_the_others_stay(tmp_path, file, content, words):
    manager = make_manager(tmp_path)
    write_good_run(manager.runs_dir)
    write_damaged(manager, file, content)
    runs = {run.name: run for run in manager.poll()}  # never raises
    assert set(runs) == {"good", "bad"}
    assert runs["good"].state == "completed"
    assert runs["bad"].state == "damaged" and words in runs["bad"].detail, runs["bad"].detail
    rows = {row["Name"]: row for row in table_rows(list(runs.values()))}
    assert rows["bad"]["State"] == "damaged" and words in rows["bad"]["Detail"]
    assert manager.curves(["good", "bad"])["loss"]  # the good run's curve is still drawn
    assert not runs["bad"].can_resume
    with pytest.raises(RunError, match="damaged"):
        manager.resume("bad")
    manager.delete("bad")  # and it can be cleaned up
    assert [run.name for run in manager.poll()] == ["good"]


@pytest.mark.parametrize("line", ["5", "[1, 2]", '"epoch 3"', "null", '{"epoch": "three", "train_loss": "low"}',
                                  '{"epoch": 3, "train_loss": NaN}', '{"epoch": true, "train_loss": 1.0}'])
def test_metrics_lines_that_are_not_epoch_objects_are_skipped(tmp_path, line):
    manager = make_manager(tmp_path)
    write_good_run(manager.runs_dir)
    with open(manager.run_dir("good") / "metrics.jsonl", "a") as f:
        f.write(line + "\n")
    assert manager.poll()[0].state == "completed"
    assert [row["epoch"] for row in manager.curves(["good"])["loss"]] == [1, 2]
    assert all(isinstance(row, dict) for row in manager.metrics("good"))


# ---------------------------------------------------------------------------------------------
# Stop signals only the run's own process, whatever status.json or launch.json say


@pytest.fixture
def bystander():
    """An unrelated process (what a forged or reused pid would name), in its own process group."""
    process = wait_for_exec(subprocess.Popen(["sleep", "120"], start_new_session=True), "sleep")
    yield process
    process.kill()
    process.wait()


def wait_for_exec(process: subprocess.Popen, word: str) -> subprocess.Popen:
    """``process`` once its command line shows ``word``: the forked child has exec()ed its program."""
    deadline = time.monotonic() + 30
    while word not in Path(f"/proc/{process.pid}/cmdline").read_bytes().decode() and time.monotonic() < deadline:
        time.sleep(0.05)
    return process


def fake_cli(run_dir: Path, **env: str) -> subprocess.Popen:
    """A process leading its own group whose command line is a vit.train on ``run_dir`` (it just sleeps)."""
    return wait_for_exec(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "vit.train", "--out",
                                           str(run_dir)], start_new_session=True, env={**os.environ, **env}),
                         "vit.train")


def running_status(run_dir: Path, pid: int, start: float) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    (run_dir / "status.json").write_text(json.dumps({
        "state": "running", "pid": pid, "host": socket.gethostname(), "updated_time": now.isoformat(),
        "start_time": dt.datetime.fromtimestamp(start, dt.UTC).isoformat()}))


def test_stop_refuses_a_pid_from_status_json_that_is_not_a_training_process(tmp_path, bystander):
    manager = make_manager(tmp_path)
    running_status(manager.run_dir("forged"), bystander.pid, time.time())
    info = manager.get("forged")
    assert (info.state, f"process {bystander.pid} is not a vit.train process" in (info.detail or "")) == (
        "crashed", True), (info.state, info.detail, Path(f"/proc/{bystander.pid}/cmdline").read_bytes())
    with pytest.raises(RunError, match="not running; there is nothing to stop"):
        manager.stop("forged")
    time.sleep(0.2)
    assert bystander.poll() is None, "the unrelated process was signalled"


def test_stop_refuses_a_training_process_that_started_after_the_runs_status(tmp_path):
    manager = make_manager(tmp_path)
    process = fake_cli(manager.run_dir("reused"))
    try:
        time.sleep(0.5)
        running_status(manager.run_dir("reused"), process.pid, time.time() - 3600)  # written an hour ago
        assert "its pid was reused" in manager.get("reused").detail
        with pytest.raises(RunError, match="nothing to stop"):
            manager.stop("reused")
        assert process.poll() is None
    finally:
        process.kill()
        process.wait()


def test_stop_refuses_a_training_process_of_another_run_folder(tmp_path):
    manager = make_manager(tmp_path)
    process = fake_cli(tmp_path / "elsewhere")
    try:
        running_status(manager.run_dir("mine"), process.pid, time.time() + 5)
        assert "trains another run folder" in manager.get("mine").detail
        with pytest.raises(RunError, match="nothing to stop"):
            manager.stop("mine")
        assert process.poll() is None
    finally:
        process.kill()
        process.wait()


def test_stop_signals_the_runs_own_training_process(tmp_path):
    manager = make_manager(tmp_path)
    process = fake_cli(manager.run_dir("cli-run"))
    try:
        running_status(manager.run_dir("cli-run"), process.pid, time.time() + 5)
        manager.stop("cli-run")
        assert process.wait(timeout=30) == -signal.SIGTERM
    finally:
        process.kill()
        process.wait()


def test_stop_refuses_a_launch_record_whose_process_group_is_not_ours(tmp_path, bystander):
    manager = make_manager(tmp_path)
    folder = manager.launch_root / "forged"
    folder.mkdir(parents=True)
    session = {"pid": bystander.pid, "pgid": bystander.pid, "started_at": time.time() - 5, "host": socket.gethostname(),
               "command": [sys.executable, "-m", "vit.train", "--out", str(manager.run_dir("forged"))]}
    (folder / "launch.json").write_text(json.dumps({
        "name": "forged", "params": {}, "devices": ["cpu"], "state": "started", "queued_at": 1.0,
        "sessions": [session]}))
    running_status(manager.run_dir("forged"), bystander.pid, time.time())
    assert manager.get("forged").state == "running"
    with pytest.raises(RunError, match="runs another command than the one started for this run"):
        manager.stop("forged")
    time.sleep(0.2)
    assert bystander.poll() is None


def started_process(run_dir: Path, **env: str) -> tuple[subprocess.Popen, dict]:
    """``fake_cli(run_dir)`` and the launch session that copies its pid, start time and command line from /proc
    (all a forger can read)."""
    process = fake_cli(run_dir, **env)
    return process, {"pid": process.pid, "pgid": process.pid, "started_at": time.time() - 5,
                     "proc_start": proc_start(process.pid)[1], "host": socket.gethostname(),
                     "command": proc_cmdline(process.pid)}


def write_launch(manager: RunManager, name: str, session: dict) -> None:
    folder = manager.launch_root / name
    folder.mkdir(parents=True)
    (folder / "launch.json").write_text(json.dumps({
        "name": name, "params": {}, "devices": ["cpu"], "state": "started", "queued_at": 1.0, "sessions": [session]}))
    running_status(manager.run_dir(name), session["pid"], time.time())


def test_stop_refuses_a_forged_launch_record_that_copies_a_process_identity_from_proc(tmp_path):
    """Issue 20, item 7: pid, start time and command line copied from /proc used to be enough to get SIGTERM sent."""
    manager = make_manager(tmp_path)
    process, session = started_process(manager.run_dir("forged"))
    try:
        write_launch(manager, "forged", session)
        with pytest.raises(RunError, match="was not launched by this server for this run"):
            manager.stop("forged")
        time.sleep(0.2)
        assert process.poll() is None, "another process was signalled"
    finally:
        process.kill()
        process.wait()


def test_after_a_restart_stop_verifies_the_launch_by_its_secret_and_a_copied_record_does_not_verify(tmp_path):
    from vit.runs.state import LAUNCH_SECRET_ENV, launch_secret_hash

    manager = make_manager(tmp_path)
    process, session = started_process(manager.run_dir("real"), **{LAUNCH_SECRET_ENV: "s3cret"})
    try:
        session["secret_hash"] = launch_secret_hash("real", "s3cret")  # what the launch wrote; not in _children
        write_launch(manager, "copy", session)  # the same record under another run's name
        with pytest.raises(RunError, match="lacks the launch's secret"):
            manager.stop("copy")
        assert process.poll() is None
        write_launch(manager, "real", session)
        manager.stop("real")
        process.wait(timeout=30)  # ended by the signal (the manager may have reaped it: then its code reads 0)
    finally:
        process.kill()
        process.wait()


def test_a_launch_gives_its_process_a_secret_that_launch_json_keeps_only_as_a_hash(tmp_path, dataset):
    from vit.runs.state import LAUNCH_SECRET_ENV, environ_value, launch_secret_hash

    manager = make_manager(tmp_path)
    info = manager.launch(tiny_params("keyed", dataset, epochs=50))
    try:
        record = json.loads((manager.launch_root / "keyed" / "launch.json").read_text())
        session = record["sessions"][-1]
        secret, deadline = None, time.monotonic() + 30
        while secret is None and time.monotonic() < deadline:  # nice exec()s python; meanwhile environ reads empty
            secret = environ_value(info.pid, LAUNCH_SECRET_ENV)
            time.sleep(0.05)
        assert secret is not None, "the launched process has no launch secret in its environment"
        assert session["secret_hash"] == launch_secret_hash("keyed", secret)
        assert secret not in json.dumps(record)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(info.pid, signal.SIGKILL)


# ---------------------------------------------------------------------------------------------
# Leftovers and bounds


def test_poll_removes_temporary_files_a_killed_process_left_in_finished_runs(tmp_path):
    manager = make_manager(tmp_path)
    write_good_run(manager.runs_dir)  # completed
    stray = manager.run_dir("good") / ".last.pt.x8d7.tmp"
    stray.write_bytes(b"half a checkpoint")
    running = manager.run_dir("busy")
    process = fake_cli(running)
    try:
        running_status(running, process.pid, time.time() + 5)
        live = running / ".status.json.1.2.tmp"
        live.write_text("{}")
        assert [run.state for run in manager.poll() if run.name == "busy"] == ["running"]
        assert not stray.exists()
        assert live.exists(), "a temporary file of a run that may still write is kept"
    finally:
        process.kill()
        process.wait()


def test_the_form_refuses_an_absurd_learning_rate(tmp_path, dataset):
    manager = make_manager(tmp_path)
    errors = manager.validate(tiny_params("fast", dataset, lr=1e300))
    assert "at most 10" in errors["lr"]


# ---------------------------------------------------------------------------------------------
# What the page may launch: bounded runs, from the data roots only


@pytest.mark.parametrize("change, field, words", [
    (dict(epochs=5000), "epochs", "at most 1000 epochs"),
    (dict(batch_size=100_000), "batch_size", "at most 4096 images per batch"),
    (dict(image_size=1024, patch_size=4), "image_size", "65,536 patches per image; at most 4,096"),
    (dict(hidden_size=8192, num_heads=8, mlp_size=32768, num_layers=8), "form", "M parameters; at most 350 M"),
    (dict(hidden_size=10**6, num_heads=1, mlp_size=10**9), "hidden_size", "hidden_size is 1,000,000; at most 16,384"),
    (dict(num_layers=100_000), "num_layers", "num_layers is 100,000; at most 256"),
    (dict(hidden_size=2**62, num_heads=1), "hidden_size", "at most 16,384"),
])
def test_the_page_launches_only_bounded_runs(tmp_path, dataset, change, field, words):
    errors = make_manager(tmp_path).validate(tiny_params("big", dataset, **change))
    assert words in errors.get(field, ""), errors


@pytest.mark.parametrize("folder", ["/", "/proc/self", "/root", "/etc", "/no/such/folder"])
def test_folder_datasets_outside_the_data_roots_are_refused_without_saying_whether_they_exist(tmp_path, folder):
    manager = make_manager(tmp_path)
    errors = manager.validate(tiny_params("outside", tmp_path, dataset=f"folder:{folder}"))
    assert errors["dataset"] == (f"folder datasets must be inside {tmp_path.parent.resolve()}; put the images there "
                                 "(or set VIT_DATA_ROOTS when starting the app)")


def test_a_network_visitor_sees_the_data_roots_by_name_and_not_where_they_are(tmp_path):
    """Issue 20, item 9: the page's messages named the data roots' absolute paths (/home/owner/...) to anyone."""
    from vit.runs.launch import hide_data_roots

    data, images = tmp_path / "home" / "owner" / "data", tmp_path / "srv" / "imagenet"
    data.mkdir(parents=True)
    images.mkdir(parents=True)
    (tmp_path / "link").symlink_to(images, target_is_directory=True)
    manager = RunManager(tmp_path / "runs", data, data_roots=(data, tmp_path / "link"))
    errors = manager.validate(tiny_params("outside", tmp_path, dataset="folder:/etc"))
    assert hide_data_roots(errors["dataset"], manager.data_roots) == (
        "folder datasets must be inside data, imagenet; put the images there (or set VIT_DATA_ROOTS when starting "
        "the app)")
    missing = manager.validate(tiny_params("missing", data / "cats"))["dataset"]
    assert str(data) in missing  # the server's own message (and log) keeps the path
    assert hide_data_roots(missing, manager.data_roots) == missing.replace(str(data), "data")
    assert "/" + "data/cats" not in hide_data_roots(missing, manager.data_roots)
    assert hide_data_roots(f"{tmp_path}/link/a, {images}/b.", (tmp_path / "link",)) == "link/a, imagenet/b."
    assert hide_data_roots(f"{data}base and {data}.old", (data,)) == f"{data}base and {data}.old"  # other folders


def test_a_link_inside_a_data_root_to_a_folder_outside_is_refused(tmp_path):
    root, outside = tmp_path / "data", tmp_path / "elsewhere"
    make_image_folder(outside)
    root.mkdir()
    (root / "innocent").symlink_to(outside, target_is_directory=True)
    manager = RunManager(tmp_path / "runs", root, data_roots=(root,))
    assert "must be inside" in manager.validate(tiny_params("linked", root / "innocent"))["dataset"]
    assert manager.validate(tiny_params("direct", make_image_folder(root / "real"))) == {}


def test_the_filesystem_root_and_proc_are_never_data_roots(tmp_path, monkeypatch):
    from vit.runs.launch import default_data_roots

    monkeypatch.setenv("VIT_DATA_ROOTS", os.pathsep.join(["/", "/proc", "/proc/self", str(tmp_path)]))
    assert default_data_roots() == (tmp_path.resolve(),)


def test_launches_beyond_the_queued_and_running_limit_are_refused(tmp_path, dataset):
    manager = RunManager(tmp_path / "runs", tmp_path / "data", data_roots=(tmp_path,), max_active=2)
    for name in ("a", "b"):
        queue_record(manager, name, ["cpu"], time.time())
    with pytest.raises(ValidationError, match="2 runs are already queued or running \\(at most 2\\)"):
        manager.launch(tiny_params("c", dataset))
    assert not (manager.launch_root / "c").exists()


def test_no_more_than_max_running_runs_train_at_once(fake_starts):
    manager, started = fake_starts
    manager.max_running = 1
    for i, name in enumerate(("one", "two")):
        queue_record(manager, name, ["cpu"], 1.0 + i, share=True)
    manager.poll()
    assert started == ["one"]
    assert manager.get("two").detail == "waiting: 1 runs are training, the most at once"


@pytest.mark.parametrize("file", ["status.json", "config.json", "metrics.jsonl"])
def test_a_run_file_of_nested_lists_is_read_as_damaged_and_the_manager_survives(tmp_path, file):
    """200 kB of nested lists raised RecursionError out of RunManager.poll, taking the Train page down for all."""
    runs = tmp_path / "runs"
    run = runs / "nested"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"args": {"dataset": "cifar10"}}))
    (run / file).write_text("[" * 100_000 + "]" * 100_000)
    manager = RunManager(runs)
    infos = manager.poll()
    assert [info.name for info in infos] == ["nested"]


def test_parse_json_bounds_depth_and_size():
    from vit.core.runfiles import MAX_JSON_DEPTH, parse_json

    assert parse_json('{"a": [1, {"b": 2}]}') == {"a": [1, {"b": 2}]}
    with pytest.raises(ValueError, match="nested deeper"):
        parse_json("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1))
    with pytest.raises(ValueError, match="nested deeper"):
        parse_json("[" * 100_000 + "]" * 100_000)


def test_step_curves_read_each_runs_live_loss_and_skip_torn_lines(tmp_path):
    manager = RunManager(tmp_path / "runs", tmp_path / "data")
    (tmp_path / "runs" / "a").mkdir(parents=True)
    (tmp_path / "runs" / "a" / "steps.jsonl").write_text(
        '{"step": 3, "epoch": 0.25, "train_loss": 2.1}\n{"step": 6, "epoch": 0.5, "train_loss": "x"}\n{"step": 9, "ep')
    assert manager.step_curves(["a", "missing"]) == [{"run": "a", "epoch": 0.25, "value": 2.1}]


def test_stray_temp_cleanup_never_follows_a_link_out_of_the_run(tmp_path):
    """Issue 20, item 9: a run's probe/ (or the run folder itself) linking elsewhere loses nothing there."""
    from vit.core.runfiles import remove_stray_temp_files

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / ".keep.abc.tmp").write_text("someone else's")
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / "probe").symlink_to(elsewhere)
    (run / ".status.json.x.tmp").write_text("ours")
    (tmp_path / "runs" / "linked").symlink_to(elsewhere)
    assert remove_stray_temp_files(run) == [run / ".status.json.x.tmp"]
    assert remove_stray_temp_files(tmp_path / "runs" / "linked") == []
    assert (elsewhere / ".keep.abc.tmp").is_file()


def streamlit_font():
    """The font Streamlit's tables draw their text with: its own Source Sans, 14 px."""
    from pathlib import Path

    from PIL import ImageFont

    streamlit = pytest.importorskip("streamlit")  # the GPU machine's engine suite runs without the app

    [font] = (Path(streamlit.__file__).parent / "static").rglob("SourceSansVF-Upright*")
    return ImageFont.truetype(str(font), 14)


def needed_px(font, rows, column, header):
    """What a column needs to show its header and every cell uncut, as the table writes them, with the cell's
    padding (8 px a side)."""
    from vit.runs.display import SHOWN_AS

    shown = {"Progress": "100.0%", "Best val acc": "81.2%", "LR": "0.0003", **SHOWN_AS}
    texts = [header] + [shown.get(column, str(row[column])) for row in rows if row[column] is not None]
    return max(font.getlength(text) for text in texts) + 16


def test_the_runs_tables_columns_show_their_headers_and_cells_uncut_within_the_page(tmp_path):
    """Issue 45, item 10: set widths cut names, durations and datasets short (issue 33: within the page's 940 px)."""
    from vit.runs.display import TABLE_HEADERS, table_widths

    font = streamlit_font()
    runs = [RunInfo(name="cifar10-cifar-s-lr3e-4", state="cancelled", detail="stopped from the page",
                    run_dir=tmp_path, devices=("cuda:0",), epoch=12, total_epochs=100, progress=1.0,
                    best_val_acc=0.8125, elapsed_seconds=3600.0,
                    settings={"preset": "tintn-cifar10", "dataset": "folder:/x/birds", "lr": 0.0003})]
    rows = table_rows(runs)
    assert all(width >= needed_px(font, rows, column, TABLE_HEADERS[column])  # with the room
               for column, width in table_widths(rows, budget=2000).items())
    widths = table_widths(rows)
    assert list(widths) == list(TABLE_HEADERS) and sum(widths.values()) <= 940
    for column, header in TABLE_HEADERS.items():  # within the page: the name and detail give way, shown whole below
        assert widths[column] >= needed_px(font, [] if column in ("Name", "Detail") else rows, column, header), column


def test_a_long_detail_or_name_gives_way_first_and_every_header_stays_whole(tmp_path):
    from vit.runs.display import TABLE_HEADERS, table_widths

    font = streamlit_font()
    runs = [RunInfo(name="a-very-long-run-name-" * 3, state="failed", detail="x" * 400, run_dir=tmp_path,
                    devices=("cpu",), settings={"dataset": "cifar10"})]
    rows = table_rows(runs)
    widths = table_widths(rows)
    assert sum(widths.values()) <= 940
    for column, header in TABLE_HEADERS.items():
        assert widths[column] >= needed_px(font, [], column, header), column  # its header
        if column not in ("Name", "Detail"):
            assert widths[column] >= needed_px(font, rows, column, header), column  # and its cells
