"""Training on a real local Ray cluster (two nodes, one CPU each): ``vit.train --ray``."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from helpers import free_port, make_image_folder
from test_distributed import DETERMINISTIC, PROCESS_TIMEOUT, TINY, read_json, read_metrics, torchrun
from vit_commands import vit_command

from vit.checkpoint import load_checkpoint, read_checkpoint_payload

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("data") / "colours", per_class=12)


def args(images: Path, out: Path, *extra: str) -> list[str]:
    return ["--dataset", f"folder:{images}", "--out", str(out), "--cache-dir", str(images.parent / "cache"),
            *TINY, *extra]


def test_an_unreachable_address_is_one_line_and_writes_nothing(images, tmp_path):
    # A closed port on this machine: nothing listens there. In this process (tests/vit_commands.py), as the bad
    # dataset's driver below: the real command's exit and lines are the two workers' and the Train page's tests'.
    done = vit_command("vit.train", *args(images, tmp_path / "run", "--epochs", "1"), "--ray",
                       f"http://127.0.0.1:{free_port()}", "--workers", "2")
    rc, err = done.returncode, done.stderr
    assert rc == 2
    lines = [line for line in err.splitlines() if line.startswith("vit.train:")]
    assert len(lines) == 1 and "cannot reach the Ray cluster" in lines[0], err
    assert "Traceback" not in err and not (tmp_path / "run").exists()


def test_cuda_workers_are_asked_for_from_a_machine_without_cuda(images, tmp_path, monkeypatch):
    # A laptop submits to a GPU cluster: --device cuda is the workers' device, not this machine's.
    import torch

    from vit.core.cli import UsageError
    from vit.runs import ray_jobs
    from vit.training.options import parse_args

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = args(images, tmp_path / "run", "--epochs", "1", "--device", "cuda")
    with pytest.raises(UsageError, match="CUDA is not available on this machine"):
        parse_args(argv)  # a local run still is refused at once
    parse_args([*argv, "--ray", "http://127.0.0.1:1", "--gpus-per-worker", "1"])
    with pytest.raises(ray_jobs.RayRunError, match="cannot reach the Ray cluster"):  # not refused before
        ray_jobs.submit(f"http://127.0.0.1:{free_port()}", argv, 1, 1)
    assert not (tmp_path / "run").exists()


def test_two_ray_workers_train_like_two_torchrun_processes(ray_cluster, images, tmp_path):
    """Long (~39 s of CPU) because it runs one Ray Train job (a controller, a supervisor, a synchronization actor and
    two workers, each importing torch: ~25 s, bench/results/cpu-2026-11-30/h22-ray-train-job-processes.txt) and the
    same run under torchrun, whose weights it must equal. (Its CPU in the whole suite:
    bench/results/cpu-2026-11-30c/suite-cpu.txt.)"""
    ray_run, ddp = tmp_path / "ray", tmp_path / "ddp"
    began = time.monotonic()
    # The command in this process (tests/vit_commands.py), as the bad dataset's below: the job's driver and its two
    # workers are the real processes, on the cluster; the real command's entry point and exit (130 on a stop) are
    # the Train page test's.
    done = vit_command("vit.train", *args(images, ray_run, *DETERMINISTIC), "--ray", ray_cluster.address,
                       "--workers", "2")
    rc, out, err = done.returncode, done.stdout, done.stderr
    ray_seconds = time.monotonic() - began
    assert rc == 0, f"{out}\n{err}"
    assert "job ray succeeded" in out
    assert {p.name for p in ray_run.iterdir()} == {"config.json", "metrics.jsonl", "steps.jsonl", "status.json",
                                                   "last.pt", "best.pt", "train.log", "probe", "attention"}
    status = read_json(ray_run / "status.json")
    assert status["state"] == "completed" and status["world_size"] == 2 and status["step"] == 10

    proc = torchrun(*args(images, ddp, *DETERMINISTIC))
    out, err = proc.communicate(timeout=PROCESS_TIMEOUT)
    assert proc.returncode == 0, f"{out}\n{err}"
    # Same seed, same shards, same gloo all-reduce of two ranks: the same numbers.
    for a, b in zip(read_metrics(ray_run), read_metrics(ddp), strict=True):
        for key in ("train_loss", "train_acc", "val_loss", "val_acc", "lr"):
            assert a[key] == pytest.approx(b[key], abs=1e-6), key
    wa, wb = (load_checkpoint(r / "last.pt").model.state_dict() for r in (ray_run, ddp))
    worst = max((wa[k].float() - wb[k].float()).abs().max().item() for k in wa)
    print(f"ray run {ray_seconds:.1f} s (cluster started in {ray_cluster.start_seconds:.1f} s); "
          f"largest weight difference ray vs torchrun {worst:.2e}")
    assert worst <= 1e-6


def test_a_bad_dataset_fails_the_job_with_its_one_line_error(ray_cluster, images, tmp_path):
    empty = tmp_path / "empty"
    (empty / "train").mkdir(parents=True)
    done = vit_command("vit.train", "--dataset", f"folder:{empty}", "--out", tmp_path / "run", *TINY, "--epochs",
                       "1", "--ray", ray_cluster.address, "--workers", "1")  # the job on the cluster, its driver here
    rc, out, err = done.returncode, done.stdout, done.stderr
    assert rc == 1, f"{out}\n{err}"
    last = err.strip().splitlines()[-1]
    assert last.startswith("vit.train: error:") and str(empty) in last, err
    # refused by the job's driver (vit.runs.ray_train): no Ray Train controller or worker was started for it
    assert "TrainController" not in out + err and "RayTrainWorker" not in out + err, f"{out}\n{err}"
    assert not (tmp_path / "run").exists()


def test_a_head_that_cannot_be_reached_is_a_state_not_an_error():
    state, detail = ray_jobs_module().run_state(f"http://127.0.0.1:{free_port()}", "any", "running")
    assert state == "unreachable" and "cannot reach the Ray cluster" in detail


def ray_jobs_module():
    from vit.runs import ray_jobs

    return ray_jobs


# --- the Train page's path: RunManager launching, watching, stopping and resuming a run on the cluster -----------

def ray_manager(tmp_path, images, monkeypatch):
    from vit.runs import launch
    from vit.runs.manager import RunManager

    monkeypatch.setenv(launch.RAY_ADDRESS_ENV, "")  # set per test below, after the cluster is up
    return RunManager(tmp_path / "runs", tmp_path / "data", env={"OMP_NUM_THREADS": "1"}, stop_grace_seconds=120,
                      data_roots=(images.parent,))


def page_params(name, images, **changes):
    from test_runs import TINY as PAGE_TINY

    from vit.runs.launch import RAY, RunParams

    return RunParams(**{"name": name, "dataset": f"folder:{images}", **PAGE_TINY, "epochs": 1, "threads": 1,
                        "devices": RAY, "workers": 2, **changes})


def test_the_train_page_runs_stops_and_resumes_a_run_on_the_cluster(ray_cluster, images, tmp_path, monkeypatch):
    """Long (~50 s of CPU) because it runs two Ray Train jobs, each ~25 s of Ray's and torch's start-ups: the run the
    page launches and stops (the Ctrl-C test's checks made on it), and the run its Resume continues. (Its CPU in the
    whole suite: bench/results/cpu-2026-11-30c/suite-cpu.txt.)"""
    # The page's Stop is a SIGTERM to `vit.train --ray`, a real process here, whose handler is its Ctrl-C's (SIGINT
    # and SIGTERM alike stop the job through Ray's job API, as `ray job stop` does: tests/test_ray_follow.py sends
    # each signal to it); the run it stopped is whole. Its Resume runs `vit.train --resume DIR --ray`: the stopped
    # run's last.pt goes on in a new job from the step it kept. One job fewer than a Ctrl-C test of its own (~22 s
    # of CPU: bench/results/cpu-2026-11-30/h22-ray-ray-group-*.txt), every check of that test made on this stop.
    from test_runs import wait_for

    manager = ray_manager(tmp_path, images, monkeypatch)
    monkeypatch.setenv("VIT_RAY_ADDRESS", ray_cluster.address)
    info = manager.launch(page_params("on-ray", images, epochs=40, batch_size=2))
    assert info.devices == ("ray",)
    info, seen = wait_for(manager, "on-ray", lambda i: i.state == "running" and i.epoch >= 1, PROCESS_TIMEOUT)
    manager.stop("on-ray")
    info, _ = wait_for(manager, "on-ray", lambda i: i.state not in ("running",), PROCESS_TIMEOUT)
    assert info.state == "cancelled", (info.detail, manager.log_tail("on-ray"))
    assert command_exit(manager, "on-ray") == 130  # the command's exit on a stopped job, as at a Ctrl-C
    log = manager.log_tail("on-ray", 400)
    assert "submitted job on-ray to" in log and "vit.train: job on-ray stopped" in log, log  # Ray's STOPPED
    done = len(manager.metrics("on-ray"))
    progress = read_checkpoint_payload(info.run_dir / "last.pt")["training_state"]["progress"]  # whole
    assert progress["global_step"] == read_json(info.run_dir / "status.json")["step"] >= 1
    # rank 0 names the signal when its own poll of the stop flag came first, else another rank's stop reached it
    assert re.search(r"cancelled by (SIGTERM|another process's signal)", (info.run_dir / "train.log").read_text())
    manager.resume("on-ray", epochs=done + 1)
    info, _ = wait_for(manager, "on-ray", lambda i: i.state not in ("queued", "running"), PROCESS_TIMEOUT)
    assert info.state == "completed", (info.detail, manager.log_tail("on-ray"))
    assert len(manager.metrics("on-ray")) == done + 1
    assert read_json(info.run_dir / "config.json")["resumes"][-1]["from_step"] == progress["global_step"]


def command_exit(manager, name: str) -> int | None:
    """The exit status of the run's latest ``vit.train`` process (the page's launch), once it has exited."""
    from vit.runs.state import process_alive

    session = manager._record(name)["sessions"][-1]
    deadline = time.monotonic() + PROCESS_TIMEOUT
    while (state := process_alive(session))[0]:
        assert time.monotonic() < deadline, f"{name}'s vit.train --ray did not exit"
        time.sleep(0.2)
    return state[1]


def test_a_run_asking_for_more_than_the_cluster_has_is_pending_says_what_it_needs_and_stops(ray_cluster, images,
                                                                                            tmp_path, monkeypatch):
    # One job for what were two tests (the page's run and ray_jobs' own calls on a job of their own; each job costs
    # its driver, its supervisor and Ray Train's controller): the page's launch submits it through ray_jobs.submit
    # and its Stop stops it through the Jobs API (jobs.stop_job), as the command's Ctrl-C does.
    from test_runs import wait_for

    from vit.runs import ray_jobs

    manager = ray_manager(tmp_path, images, monkeypatch)
    monkeypatch.setenv("VIT_RAY_ADDRESS", ray_cluster.address)
    manager.launch(page_params("too-big", images, workers=5))
    info, _ = wait_for(manager, "too-big", lambda i: "needs 5 CPU(s)" in (i.detail or ""), PROCESS_TIMEOUT)
    assert info.state == "running"  # submitted: Ray holds it until the resources are there
    sid = re.search(r"submitted job (\S+) to", manager.log_tail("too-big", 400)).group(1)
    state, detail = ray_jobs.run_state(ray_cluster.address, sid, None)
    assert state == "pending" and "needs 5 CPU(s)" in detail, (state, detail)
    manager.stop("too-big")
    info, _ = wait_for(manager, "too-big", lambda i: i.state != "running", PROCESS_TIMEOUT)
    assert info.state == "cancelled", (info.detail, manager.log_tail("too-big"))
    assert ray_jobs.follow(ray_jobs.client(ray_cluster.address), sid, lambda text: None) == "STOPPED"
    assert ray_jobs.run_state(ray_cluster.address, sid, None)[0] == "stopped"
    assert ray_jobs.run_state(ray_cluster.address, "no-such-job", None)[0] == "lost"
    assert ray_jobs.run_state(ray_cluster.address, "no-such-job", "completed")[0] == "completed"
