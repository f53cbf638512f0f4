"""The training CLI on tiny generated image folders: run files, resume, signals, failures, arguments."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import TINY_TRAIN, make_image_folder

import vit.core.runfiles as runfiles
from vit.checkpoint import load_checkpoint, read_checkpoint_payload
from vit.core.runfiles import Status
from vit.train import main
from vit.training import options
from vit.training.data import Dataset, Split
from vit.training.options import build_parser
from vit.training.session import EtaClock
from vit.training.trainer import FAULT_ENV, Trainer

REPO = Path(__file__).resolve().parent.parent
TINY = TINY_TRAIN
METRIC_KEYS = {"epoch", "train_loss", "train_acc", "val_loss", "val_acc", "lr", "epoch_seconds", "images_per_second"}
TIMING_KEYS = {"epoch_seconds", "images_per_second", "elapsed_seconds"}
STATUS_KEYS = {"state", "epoch", "step", "total_epochs", "total_steps", "progress", "pid", "host", "start_time",
               "updated_time", "eta_seconds", "elapsed_seconds", "best_val_acc", "device", "world_size", "error",
               "phase"}


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """Two colour classes, 12 images each: 22 for training and 2 held out at --val-fraction 0.1."""
    return make_image_folder(tmp_path_factory.mktemp("data") / "colours", per_class=12)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


def cli(images: Path, cache: Path, out: Path, *extra: str) -> list[str]:
    return ["--dataset", f"folder:{images}", "--out", str(out), "--cache-dir", str(cache), "--batch-size", "4",
            *TINY, *extra]


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def read_metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def without_timing(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in rows]


def read_steps(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()]


def test_steps_jsonl_holds_the_training_loss_between_rows_and_stays_bounded(images, cache, tmp_path, monkeypatch):
    """The live curve: each row's loss is the mean over its images since the previous row, so the rows of an
    epoch weighted by their images give the epoch's train_loss; past MAX_STEP_ROWS every other row goes."""
    monkeypatch.setattr("vit.training.trainer.STEP_ROW_SECONDS", 0.0)
    run = tmp_path / "steps"
    assert main(cli(images, cache, run, "--epochs", "2", "--batch-size", "4")) == 0
    steps, metrics = read_steps(run), read_metrics(run)
    for epoch in (1, 2):
        rows = [r for r in steps if epoch - 1 < r["epoch"] <= epoch]
        assert len(rows) > 2 and rows[-1]["epoch"] == epoch
        mean = sum(r["train_loss"] * r["images"] for r in rows) / sum(r["images"] for r in rows)
        assert mean == pytest.approx(metrics[epoch - 1]["train_loss"], abs=1e-6)  # metrics keep 6 decimals
    assert [r["step"] for r in steps] == sorted({r["step"] for r in steps})

    monkeypatch.setattr("vit.training.trainer.MAX_STEP_ROWS", 4)
    bounded = tmp_path / "bounded"
    assert main(cli(images, cache, bounded, "--epochs", "2", "--batch-size", "4")) == 0
    rows = read_steps(bounded)
    assert 2 <= len(rows) <= 4 and rows == read_checkpoint_payload(bounded / "last.pt")["training_state"]["steps"]
    assert rows[-1]["step"] == read_json(bounded / "status.json")["step"]  # thinned, still up to the end


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


@pytest.fixture(scope="module")
def completed_run(images, cache, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "done"
    assert main(cli(images, cache, out, "--epochs", "2")) == 0
    return out


# -- a whole run ------------------------------------------------------------------------------


def test_short_run_writes_every_run_file(completed_run, images):
    files = {p.name for p in completed_run.iterdir()}
    assert files == {"config.json", "metrics.jsonl", "steps.jsonl", "status.json", "last.pt", "best.pt", "train.log",
                     "probe", "attention"}  # the last two: attention snapshots, on by default

    config = read_json(completed_run / "config.json")
    parser_dests = {a.dest for a in build_parser()._actions if a.dest not in ("help", "version")}  # not settings
    assert parser_dests <= set(config["args"])
    assert config["args"]["epochs"] == 2 and config["args"]["batch_size"] == 4 and config["args"]["lr"] == 2e-3
    assert config["model"]["hidden_size"] == 8 and config["model"]["num_classes"] == 2
    assert config["dataset"]["name"] == f"folder:{images}"
    assert config["dataset"]["class_names"] == ["cat", "dog"]
    assert (config["dataset"]["train_size"], config["dataset"]["val_size"]) == (22, 2)

    rows = read_metrics(completed_run)
    assert [row["epoch"] for row in rows] == [1, 2]
    for row in rows:
        assert set(row) == METRIC_KEYS
        assert 0 <= row["train_acc"] <= 1 and 0 <= row["val_acc"] <= 1 and row["train_loss"] > 0
        assert row["epoch_seconds"] > 0 and row["images_per_second"] > 0
    assert rows[-1]["lr"] == pytest.approx(1e-5)  # the cosine ends at --min-lr

    status = read_json(completed_run / "status.json")
    assert set(status) == STATUS_KEYS
    assert status["state"] == "completed" and status["error"] is None
    assert (status["epoch"], status["total_epochs"], status["step"], status["total_steps"]) == (2, 2, 10, 10)
    assert status["progress"] == 1.0 and status["eta_seconds"] == 0
    assert status["best_val_acc"] == max(row["val_acc"] for row in rows)
    assert status["pid"] > 0 and status["elapsed_seconds"] > 0

    for name in ("last.pt", "best.pt"):
        checkpoint = load_checkpoint(completed_run / name)
        assert checkpoint.class_names == ["cat", "dog"]
        assert checkpoint.preprocessing.mean == tuple(config["dataset"]["mean"])
        assert checkpoint.metadata["dataset"] == f"folder:{images}"
    assert load_checkpoint(completed_run / "last.pt").metadata["epochs"] == 2
    assert "completed after 2 epochs" in (completed_run / "train.log").read_text()


def test_a_run_leaves_the_vit_loggers_handlers_level_and_propagation_as_it_found_them(images, cache, tmp_path):
    """A library leaves its caller's logging as it was: a run logs to stdout and train.log through the ``vit``
    logger, its caller's handler set aside (not closed, not written to) and put back when it ends, with the level
    and propagation the caller gave (a run left them at INFO and False: later tests' caplog saw nothing of vit)."""
    class Caller(logging.Handler):
        def __init__(self):
            super().__init__()
            self.closed, self.lines = False, []

        def emit(self, record):
            self.lines.append(record.getMessage())

        def close(self):
            self.closed = True
            super().close()

    logger = logging.getLogger("vit")
    before = (list(logger.handlers), logger.level, logger.propagate)
    caller = Caller()
    logger.handlers[:] = [caller]
    logger.setLevel(logging.DEBUG)
    logger.propagate = True
    try:
        assert main(cli(images, cache, tmp_path / "run", "--epochs", "1")) == 0
        assert logger.handlers == [caller] and not caller.closed and not caller.lines
        assert logger.level == logging.DEBUG and logger.propagate
        assert "starting run" in (tmp_path / "run" / "train.log").read_text()
    finally:
        logger.handlers[:] = before[0]
        logger.setLevel(before[1])
        logger.propagate = before[2]


def test_greyscale_folder_trains_a_3_channel_model(tmp_path, cache):
    grey = make_image_folder(tmp_path / "grey", per_class=6, size=6, mode="L")
    out = tmp_path / "run"
    assert main(cli(grey, cache, out, "--epochs", "1")) == 0
    checkpoint = load_checkpoint(out / "last.pt")
    assert checkpoint.config.num_channels == 3 and checkpoint.preprocessing.num_channels == 3
    assert checkpoint.config.image_size == 8


def tiny_trainer(*extra: str) -> Trainer:
    """A Trainer on 16 random 8x8 images, built as the CLI builds it."""
    args = options.parse_args(["--dataset", "folder:unused", "--out", "unused-run", *TINY, "--batch-size", "4",
                             *extra])
    options.resolve_model(args, num_classes=2)
    images = torch.randint(0, 256, (16, 3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    labels = torch.arange(16) % 2
    split = Split(images, labels)
    data = Dataset("tiny", ["a", "b"], split, split, (0.5,) * 3, (0.25,) * 3, True)
    return Trainer(options.settings_from_args(args), data, None)


def test_a_full_disk_at_a_save_says_where_the_run_goes_on_from(tmp_path, monkeypatch):
    import errno

    trainer = tiny_trainer()
    trainer.run_dir = tmp_path
    trainer._save_model(tmp_path / "last.pt", None)
    real_fdopen = os.fdopen
    monkeypatch.setattr(os, "fdopen", lambda fd, mode="r", *a, **k: (os.close(fd), real_fdopen(
        os.open("/dev/full", os.O_WRONLY), mode))[1])  # every write fails with ENOSPC, as on a full disk
    with pytest.raises(OSError) as info:
        trainer._save_model(tmp_path / "best.pt", None)
    assert info.value.errno == errno.ENOSPC
    assert str(info.value).endswith("free some space, then save again (the run resumes from its last.pt)")


def test_seed_recipe_is_the_blogs_constant_adamw_on_every_parameter():
    trainer = tiny_trainer("--recipe", "seed")
    assert [g["weight_decay"] for g in trainer.optimizer.param_groups] == [1e-2, 1e-2]
    assert trainer.augment.policy == "seed" and trainer.settings.batch_size == 4
    for _ in range(3):
        trainer.step(torch.arange(4))
        assert trainer.lr() == 1e-2
    ours = tiny_trainer()
    assert [g["weight_decay"] for g in ours.optimizer.param_groups] == [0.05, 0.0]
    assert ours.settings.label_smoothing == 0.1 and ours.settings.grad_clip == 1.0
    assert ours.augment.policy == "trivialaugment"


# -- resume -----------------------------------------------------------------------------------


def test_resume_after_one_epoch_gives_the_metrics_of_two_straight_epochs(images, cache, tmp_path, monkeypatch):
    # A constant rate so that a 1-epoch and a 2-epoch run share their first epoch; EMA and mixup
    # so that their state and random draws must be restored too. A steps.jsonl row at every sync, not by time.
    monkeypatch.setattr("vit.training.trainer.STEP_ROW_SECONDS", 0.0)
    recipe = ["--schedule", "constant", "--warmup-epochs", "0", "--ema", "0.9", "--mixup", "0.4"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert main(cli(images, cache, straight, "--epochs", "2", *recipe)) == 0
    assert main(cli(images, cache, split, "--epochs", "1", *recipe)) == 0
    assert len(read_metrics(split)) == 1
    assert main(["--resume", str(split), "--epochs", "2"]) == 0

    assert without_timing(read_metrics(split)) == without_timing(read_metrics(straight))
    assert without_timing(read_steps(split)) == without_timing(read_steps(straight))  # the live curve too
    a, b = read_checkpoint_payload(straight / "last.pt"), read_checkpoint_payload(split / "last.pt")
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])
    status = read_json(split / "status.json")
    assert (status["state"], status["epoch"], status["total_epochs"]) == ("completed", 2, 2)
    config = read_json(split / "config.json")
    assert config["args"]["epochs"] == 2 and config["resumes"][0]["from_epoch"] == 1


def test_resume_of_a_completed_run_without_more_epochs_is_refused(completed_run, capsys):
    before = (completed_run / "status.json").read_text()
    assert main(["--resume", str(completed_run)]) == 2
    assert "already trained 2 of 2 epochs; pass --epochs N with N > 2" in one_line_error(capsys)
    assert main(["--resume", str(completed_run), "--epochs", "2"]) == 2
    assert (completed_run / "status.json").read_text() == before


def test_resume_refuses_to_change_what_the_run_trains(completed_run, capsys):
    assert main(["--resume", str(completed_run), "--epochs", "5", "--lr", "0.1", "--preset", "cifar-s"]) == 2
    assert "--lr, --preset cannot change when resuming" in one_line_error(capsys)


def test_resume_refuses_a_run_that_is_still_running(completed_run, tmp_path, capsys):
    live = tmp_path / "live"
    live.mkdir()
    for name in ("config.json", "last.pt"):
        (live / name).write_bytes((completed_run / name).read_bytes())
    status = read_json(completed_run / "status.json")
    status.update(state="running", pid=os.getpid(), host=socket.gethostname(), updated_time=runfiles.now_iso())
    (live / "status.json").write_text(json.dumps(status))
    assert main(["--resume", str(live), "--epochs", "3"]) == 2
    assert "is still running" in one_line_error(capsys)


def test_resume_of_a_folder_that_is_not_a_run_is_refused(tmp_path, capsys):
    assert main(["--resume", str(tmp_path)]) == 2
    assert "not a run folder" in one_line_error(capsys)


# -- signals, crashes, SIGKILL ----------------------------------------------------------------


def start_cli(*args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "vit.train", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# Generous: on a machine busy with other training a starting interpreter can take minutes.
PROCESS_TIMEOUT = 900.0


def wait_for(condition, proc: subprocess.Popen, timeout: float = PROCESS_TIMEOUT) -> None:
    deadline = time.time() + timeout
    while not condition():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"training ended (rc {proc.returncode}) before the condition held:\n{out}\n{err}")
        if time.time() > deadline:
            proc.kill()
            pytest.fail("timed out waiting for the training process")
        time.sleep(0.05)


def status_of(run: Path) -> dict:
    try:
        return read_json(run / "status.json")
    except (OSError, ValueError):
        return {}


@pytest.mark.slow
@pytest.mark.scenario  # a real training process, signalled
def test_sigterm_cancels_after_the_step_and_the_resumed_run_matches_an_uninterrupted_one(images, cache, tmp_path):
    # Warmup + cosine, TrivialAugment: the resumed run must replay the schedule and continue the
    # random stream mid-epoch to end with the same metrics as a run that was never stopped.
    args = ["--epochs", "4", "--batch-size", "2"]
    stopped, straight = tmp_path / "stopped", tmp_path / "straight"
    proc = start_cli(*cli(images, cache, stopped, *args))
    wait_for(lambda: status_of(stopped).get("state") == "running" and status_of(stopped).get("step", 0) >= 1, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=PROCESS_TIMEOUT)
    assert proc.returncode == 0, err
    status = read_json(stopped / "status.json")
    assert status["state"] == "cancelled" and status["error"] is None
    state = read_checkpoint_payload(stopped / "last.pt")["training_state"]["progress"]
    assert 1 <= state["global_step"] < 44 and state["global_step"] == status["step"]
    assert "cancelled by SIGTERM" in (stopped / "train.log").read_text()

    assert main(["--resume", str(stopped)]) == 0
    assert read_json(stopped / "status.json")["state"] == "completed"
    assert main(cli(images, cache, straight, *args)) == 0
    assert without_timing(read_metrics(stopped)) == without_timing(read_metrics(straight))
    resume = read_json(stopped / "config.json")["resumes"][0]
    assert resume["from_step"] == state["global_step"]
    # Where the Train page marks it: epochs done, mid-epoch as the stop was (44 steps in 4 epochs, 11 an epoch).
    assert resume["at_epoch"] == pytest.approx(state["epoch"] + state["step_in_epoch"] / 11, abs=1e-5)


@pytest.mark.slow
@pytest.mark.scenario  # a real training process, signalled
def test_sigkill_leaves_readable_files_and_a_resumable_run(images, cache, tmp_path):
    run = tmp_path / "killed"
    proc = start_cli(*cli(images, cache, run, "--epochs", "40", "--batch-size", "2", "--augment", "none"))
    wait_for(lambda: (run / "last.pt").exists(), proc)
    proc.kill()
    proc.communicate()
    for name in ("config.json", "status.json"):
        assert isinstance(read_json(run / name), dict)
    assert all(set(row) == METRIC_KEYS for row in read_metrics(run))
    assert read_json(run / "status.json")["state"] == "running"  # nobody was left to say otherwise
    done = load_checkpoint(run / "last.pt").metadata["epochs"]
    if (run / "best.pt").exists():
        load_checkpoint(run / "best.pt")
    # The dead run's status still says running; without a live pid it can be resumed.
    assert main(["--resume", str(run), "--epochs", str(done + 1)]) == 0
    assert len(read_metrics(run)) == done + 1
    assert read_json(run / "status.json")["state"] == "completed"


def test_a_crash_marks_the_run_failed_with_its_message(images, cache, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(FAULT_ENV, "3")
    out = tmp_path / "crash"
    assert main(cli(images, cache, out, "--epochs", "2")) == 1
    err = capsys.readouterr().err
    assert "injected fault at step 3" in err and "Traceback" not in err
    status = read_json(out / "status.json")
    assert status["state"] == "failed" and "injected fault at step 3" in status["error"]
    assert "Traceback" in (out / "train.log").read_text()


def test_a_failure_after_loading_the_data_leaves_no_run_folder(images, cache, tmp_path, monkeypatch, capsys):
    def broken(config):
        raise RuntimeError("cannot build this model")

    monkeypatch.setattr("vit.training.trainer.ViT", broken)
    out = tmp_path / "never"
    assert main(cli(images, cache, out, "--epochs", "1")) == 1
    assert "cannot build this model" in capsys.readouterr().err
    assert not out.exists()


# -- invalid arguments ------------------------------------------------------------------------


INVALID = {
    "negative epochs": (["--epochs", "-1"], "--epochs: expected a positive integer"),
    "non-numeric lr": (["--lr", "fast"], "--lr: expected a positive number, got 'fast'"),
    "zero batch size": (["--batch-size", "0"], "--batch-size: expected a positive integer"),
    "negative weight decay": (["--weight-decay", "-0.1"], "--weight-decay: expected a number in [0, 10)"),
    "dropout of 1": (["--dropout", "1"], "--dropout: expected a number in [0, 1)"),
    "unknown preset": (["--preset", "vit-tiny"], "unknown preset 'vit-tiny'"),
    "unknown recipe": (["--recipe", "fast"], "invalid choice: 'fast'"),
    "unknown dataset": (["--dataset", "imagenet"], "unknown dataset 'imagenet'"),
    "missing folder": (["--dataset", "folder:/no/such/folder"], "dataset folder /no/such/folder does not exist"),
    "batch larger than the data": (["--batch-size", "23"], "--batch-size 23 is larger than the 22 training images"),
    "patch not dividing the image": (["--patch-size", "3"], "must be divisible by patch_size"),
    "warmup beyond the run": (["--epochs", "2", "--warmup-epochs", "2"], "--warmup-epochs (2) must be below"),
    "min-lr above lr": (["--lr", "1e-3", "--min-lr", "0.01"], "--min-lr (0.01) must not exceed --lr"),
    "magnitude out of range": (["--aug-magnitude", "31"], "expected an integer in 0..30"),
    "unknown device": (["--device", "tpu"], "--device"),
    "no val split possible": (["--val-fraction", "0"], "no val/ folder, so --val-fraction must be above 0"),
}


@pytest.mark.parametrize("case", INVALID, ids=list(INVALID))
def test_invalid_arguments_fail_with_one_line_before_anything_is_written(case, images, cache, tmp_path, capsys):
    extra, expected = INVALID[case]
    out = tmp_path / "run"
    assert main(cli(images, cache, out, *extra)) == 2
    err = one_line_error(capsys)
    assert err.startswith("vit.train: error: ") and expected in err
    assert not out.exists()


def test_the_command_refuses_bad_arguments_before_torch_loads(images, cache, tmp_path):
    """``python -m vit.train`` answers what its arguments and its dataset's layout refuse in one line before it
    loads torch (seconds on a busy machine): each case of INVALID that needs neither the images nor the model, in one
    fresh process that never imports torch."""
    early = [case for case in INVALID if case not in ("batch larger than the data",)]
    script = ("import json, sys\nfrom vit.train import cli\n"
              "print(json.dumps([cli(argv) for argv in json.loads(sys.argv[1])]), 'torch' in sys.modules)")
    argvs = [cli(images, cache, tmp_path / f"run{i}", *INVALID[case][0]) for i, case in enumerate(early)]
    done = subprocess.run([sys.executable, "-c", script, json.dumps(argvs)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    statuses, torch_loaded = done.stdout.rsplit(maxsplit=1)
    assert json.loads(statuses) == [2] * len(early) and torch_loaded == "False", done.stderr
    errors = done.stderr.splitlines()
    assert len(errors) == len(early)
    for case, line in zip(early, errors, strict=True):
        assert line.startswith("vit.train: error: ") and INVALID[case][1] in line, (case, line)
    assert not any((tmp_path / f"run{i}").exists() for i in range(len(early)))


def test_a_folder_with_one_class_is_refused(tmp_path, cache, capsys):
    one = make_image_folder(tmp_path / "one", classes=["only"], per_class=4)
    assert main(cli(one, cache, tmp_path / "run")) == 2
    assert "needs at least two class subfolders" in one_line_error(capsys)


def test_dataset_and_out_are_required_and_out_must_be_new(completed_run, images, cache, capsys):
    assert main(["--out", "somewhere"]) == 2
    assert "--dataset is required" in one_line_error(capsys)
    assert main(["--dataset", "cifar10"]) == 2
    assert "--out RUN_DIR is required" in one_line_error(capsys)
    assert main(cli(images, cache, completed_run)) == 2
    assert "already holds files; continue it with --resume" in one_line_error(capsys)


def test_offline_builtin_dataset_fails_with_one_line_naming_its_folder(tmp_path, monkeypatch, capsys):
    def offline(*args, **kwargs):
        raise OSError("network is unreachable (test)")

    monkeypatch.setattr(socket, "create_connection", offline)
    monkeypatch.setattr(socket, "getaddrinfo", offline)
    out = tmp_path / "run"
    assert main(["--dataset", "mnist", "--data-dir", str(tmp_path / "data"), "--out", str(out), *TINY]) == 2
    err = one_line_error(capsys)
    assert f"mnist is not in {tmp_path / 'data' / 'mnist'}" in err and "MNIST/raw" in err
    assert not out.exists()


def test_help_explains_every_option(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for action in build_parser()._actions:
        assert action.help, f"{action.option_strings} has no help"
        for option in action.option_strings:
            assert option in text
    for word in ("config.json", "metrics.jsonl", "status.json", "last.pt", "best.pt", "train.log", "SIGTERM",
                 "torchrun", "--resume", "images_per_second", "eta_seconds", "exit status"):
        assert word in text


# -- status heartbeat and ETA -----------------------------------------------------------------


def test_status_heartbeat_rewrites_the_file_while_nothing_else_does(tmp_path, monkeypatch):
    assert runfiles.HEARTBEAT_SECONDS <= 10
    monkeypatch.setattr(runfiles, "HEARTBEAT_SECONDS", 0.05)
    status = Status(tmp_path / "status.json", {"state": "running"})
    status.start()
    try:
        first = (tmp_path / "status.json").stat().st_ino
        deadline = time.time() + 10
        while (tmp_path / "status.json").stat().st_ino == first:  # each write renames a new file in
            assert time.time() < deadline, "no heartbeat"
            time.sleep(0.01)
    finally:
        status.close()
    assert read_json(tmp_path / "status.json")["state"] == "running"
    assert not status.thread.is_alive()


def test_eta_leaves_out_the_first_step_and_validation():
    clock = EtaClock()
    assert clock.eta(10, 1, 5.0) is None
    clock.step_done(100.0)  # the first step (compilation) takes however long it takes
    clock.step_done(102.0)
    clock.step_done(104.0)
    clock.exclude(10.0)  # a validation between two steps
    clock.step_done(116.0)
    assert clock.seconds_per_step() == 2.0
    assert clock.eta(remaining_steps=10, remaining_evals=2, eval_seconds=3.0) == 26.0


# -- caps and leftovers ---------------------------------------------------------------------------


def test_threads_are_capped_at_four_per_core(images, cache, tmp_path, capsys):
    assert main(cli(images, cache, tmp_path / "run", "--threads", "100000")) == 2  # segfaulted inside torch
    assert f"expected at most {4 * (os.cpu_count() or 1)} threads" in one_line_error(capsys)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("lr", ["1e300", "11", "inf", "nan", "0"])
def test_learning_rate_is_bounded(images, cache, tmp_path, capsys, lr):
    assert main(cli(images, cache, tmp_path / "run", "--lr", lr)) == 2
    assert "--lr: expected a positive number of at most 10, got" in one_line_error(capsys)


def test_resume_removes_temporary_files_a_killed_write_left(completed_run, tmp_path):
    run = tmp_path / "killed"
    run.mkdir()
    shutil.copytree(completed_run, run, dirs_exist_ok=True)
    strays = [run / ".last.pt.k2j3h4.tmp", run / ".status.json.4242.139.tmp", run / ".metrics.jsonl.1.2.tmp",
              run / "attention" / ".epoch_0003.npz.x1y2.tmp"]
    for stray in strays:
        stray.write_bytes(b"half a file")
    assert main(["--resume", str(run), "--epochs", "3"]) == 0
    assert not any(stray.exists() for stray in strays)
    assert not list(run.glob(".*.tmp"))
