"""The Train page's Ray target without a cluster (issue 23): a Ray run is ("ray",) on the cluster that
$VIT_RAY_ADDRESS names (never one a visitor gives), with its workers and GPUs per worker checked, started by the
follower command that submits the job, listed beside local runs without queueing behind them, and the form offers
it only when the server has an address."""

import sys
from pathlib import Path

import pytest
from test_runs import make_image_folder, tiny_params
from test_training_page import folders  # noqa: F401 (a fixture used by name)
from vit_commands import vit_command

from vit.runs import launch
from vit.runs.devices import device_label
from vit.runs.launch import RAY, launch_command, validate_params


def check(params, tmp_path):
    return validate_params(params, tmp_path / "runs", tmp_path / "data", gpu_count=0, data_roots=(tmp_path,))


def test_a_ray_run_needs_the_servers_address_and_bounded_workers(tmp_path, monkeypatch):
    folder = make_image_folder(tmp_path / "images")
    monkeypatch.delenv(launch.RAY_ADDRESS_ENV, raising=False)
    errors = check(tiny_params("r", folder, devices=RAY, workers=2), tmp_path)
    assert "VIT_RAY_ADDRESS" in errors["devices"]
    monkeypatch.setenv(launch.RAY_ADDRESS_ENV, "http://127.0.0.1:1")
    assert check(tiny_params("r", folder, devices=RAY, workers=2, gpus_per_worker=0.0), tmp_path) == {}
    assert "workers" in check(tiny_params("r", folder, devices=RAY, workers=65), tmp_path)
    assert "gpus_per_worker" in check(tiny_params("r", folder, devices=RAY, workers=1, gpus_per_worker=9.0), tmp_path)
    assert "workers" in check(tiny_params("r", folder, devices=("cpu",), workers=2), tmp_path)  # local: no workers
    assert "not both" in check(tiny_params("r", folder, devices=("ray", "cpu")), tmp_path)["devices"]


def test_a_ray_run_starts_the_follower_that_submits_it(monkeypatch):
    monkeypatch.setenv(launch.RAY_ADDRESS_ENV, "http://10.0.0.5:8265")
    command, env = launch_command(["--dataset", "cifar10", "--out", "runs/x"], RAY, 0, 3, 1.0)
    assert command[:3] == [sys.executable, "-m", "vit.train"] and env == {}
    tail = command[command.index("--ray"):]
    assert tail == ["--ray", "http://10.0.0.5:8265", "--workers", "3", "--gpus-per-worker", "1", "--device", "cuda"]
    command, _ = launch_command(["--resume", "runs/x"], RAY, 0, None, None)
    assert command[-6:] == ["--workers", "1", "--gpus-per-worker", "0", "--device", "cpu"]
    assert device_label(RAY) == "the Ray cluster"


def test_ray_runs_do_not_queue_behind_each_other_or_local_runs(tmp_path, monkeypatch):
    from vit.runs.manager import RunManager

    monkeypatch.setenv(launch.RAY_ADDRESS_ENV, "http://127.0.0.1:1")
    started = []
    monkeypatch.setattr(RunManager, "_start", lambda self, record: started.append(record["name"]) or
                        self._save_record({**record, "state": "error", "start_error": "not started in this test"}))
    folder = make_image_folder(tmp_path / "images")
    manager = RunManager(tmp_path / "runs", tmp_path / "data", data_roots=(tmp_path,))
    for name in ("a", "b"):
        manager.launch(tiny_params(name, folder, devices=RAY, workers=1))
    assert started == ["a", "b"]


@pytest.mark.usefixtures("folders")
def test_the_form_offers_the_cluster_only_with_an_address(monkeypatch):
    from streamlit.testing.v1 import AppTest
    from test_training_page import PAGE, TIMEOUT

    monkeypatch.delenv(launch.RAY_ADDRESS_ENV, raising=False)
    at = AppTest.from_file(PAGE).run(timeout=TIMEOUT)
    assert not [w for w in at.number_input if w.label == "Ray workers"]
    monkeypatch.setenv(launch.RAY_ADDRESS_ENV, "http://127.0.0.1:9")  # nothing listens there
    at = AppTest.from_file(PAGE).run(timeout=TIMEOUT)
    assert not at.exception, [e.message for e in at.exception]
    assert [w for w in at.number_input if w.label == "Ray workers"]
    [device] = [w for w in at.selectbox if w.label == "Device"]
    assert "the Ray cluster" in device.options
    captions = " ".join(c.value for c in at.caption)
    assert "the Ray cluster: cannot reach it now" in captions and "127.0.0.1:9" not in captions


# -- issue 33, item 8: Ray as users meet it ---------------------------------------------------------------------------

def test_train_help_lists_the_ray_options():
    # In this process (tests/vit_commands.py); test_cli_startup.py runs every command's --help as a real one
    done = vit_command("vit.train", "--help")
    assert done.returncode == 0, done.stderr
    help_text = done.stdout
    for option in ("--ray ADDRESS", "--workers N", "--gpus-per-worker G"):
        assert option in help_text


def test_workers_without_ray_is_a_usage_error():
    from vit.training.options import parse_args
    from vit.training.trainer import UsageError

    with pytest.raises(UsageError, match="--workers and --gpus-per-worker go with --ray"):
        parse_args(["--dataset", "cifar10", "--out", "/nonexistent/run", "--workers", "2"], check_out=False)


def test_the_ray_options_are_not_passed_on_to_the_job():
    from vit.training.options import without_ray_options

    assert without_ray_options(["--dataset", "cifar10", "--ray", "http://h:8265", "--workers=2", "--epochs", "3",
                                "--gpus-per-worker", "1"]) == ["--dataset", "cifar10", "--epochs", "3"]


class FailedJob:
    """What Ray's JobSubmissionClient answers for a job whose node ran a Python without ray."""

    def get_job_logs(self, sid):
        return ("Traceback (most recent call last):\n  File \"<frozen runpy>\", line 198, in _run_module_as_main\n"
                "ModuleNotFoundError: No module named 'ray'\n")

    def get_job_info(self, sid):
        raise AssertionError("the log says it all")


def test_a_job_whose_cluster_runs_another_python_says_how_to_start_ray_with_ours():
    from vit.runs.ray_jobs import job_error

    error = job_error(FailedJob(), "run")
    assert error.startswith("vit.train: the cluster's Python has no module 'ray'")
    assert f"PATH={Path(sys.executable).parent}:$PATH ray start --head" in error and "\n" not in error


def test_the_train_page_shows_a_ray_jobs_log_without_colour_codes(tmp_path):
    from vit.core.runfiles import LOG_FILE
    from vit.runs.manager import RunManager

    manager = RunManager(tmp_path / "runs", tmp_path / "data")
    manager.run_dir("ray").mkdir(parents=True)
    (manager.run_dir("ray") / LOG_FILE).write_text(
        "\x1b[36m(RayTrainWorker pid=1)\x1b[0m epoch 1\n\x1b[1m\x1b[31mwarning\x1b[39m\x1b[22m done\n")
    assert manager.log_tail("ray") == "(RayTrainWorker pid=1) epoch 1\nwarning done"
