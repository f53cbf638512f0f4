"""Training under torchrun: two CPU processes with gloo, one run folder written by rank 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import TINY_TRAIN, make_image_folder
from vit_commands import vit_command

from vit.checkpoint import load_checkpoint, read_checkpoint_payload
from vit.training.snapshots import load_snapshot, snapshot_epochs

REPO = Path(__file__).resolve().parent.parent
TINY = [*TINY_TRAIN, "--device", "cpu"]
# No augmentation, dropout or mixup: two processes with half a batch each must then train
# exactly like one process with the whole batch (DDP averages the gradients).
DETERMINISTIC = ["--augment", "none", "--epochs", "2", "--batch-size", "4"]
# Two epochs, not one: the second epoch's reshuffle, dealt round the ranks, must match one process's too. Fewer steps
# would save nothing: a rank's CPU is its Python start and torch's imports (torch._dynamo's too, which the optimizer's
# add_param_group and step wrappers import: ~1.7 s), and one process trains 1 or 4 epochs for 3.2 or 3.3 s of CPU.

pytestmark = pytest.mark.slow
PROCESS_TIMEOUT = 900.0  # generous: on a machine busy with other training, starting torch can take minutes


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("data") / "colours", per_class=12)


def cli(images: Path, out: Path, *extra: str) -> list[str]:
    return ["--dataset", f"folder:{images}", "--out", str(out), "--cache-dir", str(images.parent / "cache"),
            *TINY, *extra]


def torchrun(*args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "-m", "vit.train", *args]
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def one_process(*argv: str) -> None:
    """``python -m vit.train ARGV`` as one process: the reference the ranks are compared with, or a resume. Its
    training is the same in this process (vit_command puts back the signal handlers, loggers, threads and random
    states it changes), and costs no Python start or torch's imports (~3.5 s of CPU a process)."""
    done = vit_command("vit.train", *argv, env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def read_metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_two_gloo_processes_train_like_one_process_with_the_whole_batch(images, tmp_path):
    ddp, single = tmp_path / "ddp", tmp_path / "single"
    proc = torchrun(*cli(images, ddp, *DETERMINISTIC))
    out, err = proc.communicate(timeout=PROCESS_TIMEOUT)
    assert proc.returncode == 0, f"{out}\n{err}"

    assert {p.name for p in ddp.iterdir()} == {"config.json", "metrics.jsonl", "steps.jsonl", "status.json", "last.pt",
                                               "best.pt", "train.log", "probe", "attention"}
    status = read_json(ddp / "status.json")
    assert status["state"] == "completed" and status["world_size"] == 2 and status["step"] == 10
    assert read_json(ddp / "config.json")["world_size"] == 2
    assert "2 processes" in load_checkpoint(ddp / "last.pt").metadata["hardware"]
    assert len(read_payload_rng(ddp)) == 2  # every rank's random state, for an exact resume

    one_process(*cli(images, single, *DETERMINISTIC))
    for a, b in zip(read_metrics(ddp), read_metrics(single), strict=True):
        for key in ("train_loss", "train_acc", "val_loss", "val_acc", "lr"):
            assert a[key] == pytest.approx(b[key], abs=1e-4), key
    # Rank 0 alone takes the attention snapshots, of the same weights one process trains.
    assert snapshot_epochs(ddp) == snapshot_epochs(single) and snapshot_epochs(ddp)
    for epoch in snapshot_epochs(ddp):
        a, b = load_snapshot(ddp, epoch), load_snapshot(single, epoch)
        np.testing.assert_allclose(a.cls_attention, b.cls_attention, atol=1e-4)
        np.testing.assert_allclose(a.distance, b.distance, atol=1e-3)


def read_payload_rng(run: Path) -> list:
    return read_checkpoint_payload(run / "last.pt")["training_state"]["rng"]


def test_sigterm_to_torchrun_cancels_every_rank_after_the_same_step(images, tmp_path):
    run = tmp_path / "stopped"
    proc = torchrun(*cli(images, run, "--epochs", "50", "--batch-size", "2"))
    deadline = time.time() + PROCESS_TIMEOUT
    while not (read_json(run / "status.json").get("state") == "running"
               and read_json(run / "status.json").get("step", 0) >= 1):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "torchrun did not start training"
        time.sleep(0.05)
    # At once: rank 0's status says step 1 at its first step; the ranks stop a step or two later (measured: step 3).
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=PROCESS_TIMEOUT)

    status = read_json(run / "status.json")
    assert status["state"] == "cancelled"
    progress = read_checkpoint_payload(run / "last.pt")["training_state"]["progress"]
    assert progress["global_step"] == status["step"] >= 1
    assert "cancelled by SIGTERM" in (run / "train.log").read_text()
    # One process can carry on what two started (each epoch then re-seeded for one process).
    done = progress["epoch"]
    one_process("--resume", str(run), "--epochs", str(done + 1))
    assert read_json(run / "status.json")["state"] == "completed"
    assert len(read_metrics(run)) == done + 1


def test_scale_batch_under_two_processes_trains_like_one_process_with_twice_the_batch(images, tmp_path):
    # Each of 2 processes keeps --batch-size 2 (global 4) and the LR grows by sqrt(2); stats and
    # stop flags are reduced every 3 steps only. One process with batch 4 and that LR must match.
    ddp, single = tmp_path / "ddp", tmp_path / "single"
    recipe = ["--augment", "none", "--epochs", "2", "--schedule", "constant", "--warmup-epochs", "0"]
    proc = torchrun(*cli(images, ddp, *recipe, "--batch-size", "2", "--scale-batch", "--lr", "1e-3",
                         "--sync-every", "3"))
    out, err = proc.communicate(timeout=PROCESS_TIMEOUT)
    assert proc.returncode == 0, f"{out}\n{err}"
    assert read_json(ddp / "status.json")["step"] == 10  # 20 training images, 4 per step

    one_process(*cli(images, single, *recipe, "--batch-size", "4", "--lr", str(1e-3 * 2 ** 0.5)))
    for a, b in zip(read_metrics(ddp), read_metrics(single), strict=True):
        for key in ("train_loss", "train_acc", "val_loss", "val_acc", "lr"):
            assert a[key] == pytest.approx(b[key], abs=1e-4), key


@pytest.mark.parametrize("sampler", ["passes", "copies"])
def test_repeated_augmentation_under_two_processes_trains_like_one_process(images, tmp_path, sampler):
    # Issue 111: --repeat-aug 2 deals each global batch round the processes. Lee et al.'s passes keep one process's
    # global batches; DeiT's copies put an image's two copies on the two processes at one step, where one process has
    # them side by side in its batch: the same images each step, so without augmentation the same mean gradient.
    ddp, single = tmp_path / "ddp", tmp_path / "single"
    repeated = [*DETERMINISTIC, "--repeat-aug", "2", "--repeat-aug-sampler", sampler, "--attention-every", "0"]
    proc = torchrun(*cli(images, ddp, *repeated))
    out, err = proc.communicate(timeout=PROCESS_TIMEOUT)
    assert proc.returncode == 0, f"{out}\n{err}"
    assert read_json(ddp / "status.json")["step"] == 2 * (22 * 2 // 4)  # 22 training images, each twice an epoch
    one_process(*cli(images, single, *repeated))
    for a, b in zip(read_metrics(ddp), read_metrics(single), strict=True):
        for key in ("train_loss", "train_acc", "val_loss", "val_acc", "lr"):
            assert a[key] == pytest.approx(b[key], abs=1e-4), key
