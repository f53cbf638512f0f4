"""Attention snapshots and per-epoch checkpoints written by training runs (``vit.train``'s main, and a real process
killed, then resumed) on tiny generated images.

The snapshots are checked against what ``vit.attention`` computes from the checkpoint saved at
the same epoch (``--save-every 1``), through the model's own forward pass.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import make_image_folder
from vit_commands import vit_command

from vit.checkpoint import load_checkpoint
from vit.core.images import normalize
from vit.core.inference import preprocess
from vit.core.runfiles import epoch_checkpoint_path, epoch_checkpoints, read_metrics
from vit.explain.methods.attention import layer_stats, rollout, token_map
from vit.training.data import load_dataset
from vit.training.snapshots import load_probe, load_snapshot, snapshot_epochs

REPO = Path(__file__).resolve().parent.parent
MODEL = ["--image-size", "8", "--patch-size", "4", "--hidden-size", "8", "--num-layers", "2", "--num-heads", "2",
         "--mlp-size", "16", "--threads", "1", "--warmup-epochs", "0"]


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """Three colour classes, 14 images each; --val-fraction 0.25 holds out 4 per class (12 validation images)."""
    return make_image_folder(tmp_path_factory.mktemp("data") / "colours", classes=("red", "green", "blue"),
                             per_class=14)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


def cli(images: Path, cache: Path, out: Path, *extra: str) -> list[str]:
    return ["--dataset", f"folder:{images}", "--out", str(out), "--cache-dir", str(cache), "--batch-size", "4",
            "--val-fraction", "0.25", *MODEL, *extra]


def train(argv: list[str]) -> int:
    """``vit.train`` in this process (tests/vit_commands.py: its logging, signals and threads put back after)."""
    return vit_command("vit.train", *argv, env={"OMP_NUM_THREADS": "1"}).returncode


def train_process(argv: list[str]) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "vit.train", *argv], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def saved_run(images, cache, tmp_path_factory) -> Path:
    # The command's main in this process (issue 112: a second torch start-up, ~3 s of CPU, for files any run writes);
    # a real process is killed and resumed below
    out = tmp_path_factory.mktemp("runs") / "snapshots"
    assert train(cli(images, cache, out, "--epochs", "3", "--save-every", "1")) == 0
    return out


def test_a_run_snapshots_every_epoch_and_its_initial_weights(saved_run):
    assert snapshot_epochs(saved_run) == [0, 1, 2, 3]
    probe = load_probe(saved_run)
    assert len(probe.indices) == 8 and sorted(set(probe.labels)) == [0, 1, 2]  # stratified over the 3 classes
    assert probe.class_names == ["blue", "green", "red"] and len(probe.sample_indices) == 12
    assert "attention snapshot of epoch 3 in" in (saved_run / "train.log").read_text()
    assert list(epoch_checkpoints(saved_run)) == [1, 2, 3]


@pytest.mark.parametrize("epoch", [1, 2, 3])
def test_snapshots_match_the_attention_of_that_epochs_checkpoint(saved_run, images, cache, epoch):
    checkpoint = load_checkpoint(epoch_checkpoint_path(saved_run, epoch))
    probe, snapshot = load_probe(saved_run), load_snapshot(saved_run, epoch)
    model, grid = checkpoint.model, (2, 2)
    with torch.no_grad():
        logits, attentions = model(preprocess(probe.pil_images(), checkpoint.preprocessing), output_attentions=True)
    np.testing.assert_allclose(snapshot.logits, logits.numpy(), rtol=0, atol=1e-5)
    expected_cls = torch.stack([token_map(a, 0, grid) for a in attentions]).numpy()  # (L, P, H, 2, 2)
    np.testing.assert_allclose(snapshot.cls_attention, expected_cls, rtol=0, atol=1e-5)
    expected_rollout = token_map(rollout(attentions), 0, grid).numpy()
    np.testing.assert_allclose(snapshot.rollout, expected_rollout, rtol=0, atol=1e-5)

    # The statistics: over the validation images the probe file names, as the run split them.
    data = load_dataset(f"folder:{images}", 8, 3, cache_dir=cache, val_fraction=0.25, seed=0)
    pre = checkpoint.preprocessing
    sample = normalize(data.val.images[probe.sample_indices], pre.mean, pre.std)
    with torch.no_grad():
        _, sample_attentions = model(sample, output_attentions=True)
    stats = layer_stats(sample_attentions, grid, patch_size=4)
    np.testing.assert_allclose(snapshot.distance, stats["distance"].mean(dim=1).numpy(), rtol=0, atol=1e-5)
    np.testing.assert_allclose(snapshot.entropy, stats["entropy"].mean(dim=1).numpy(), rtol=0, atol=1e-5)


def test_snapshots_survive_sigkill_and_resume_continues_them_exactly(images, cache, tmp_path):
    reference = tmp_path / "reference"
    assert train(cli(images, cache, reference, "--epochs", "8")) == 0  # in this process: no second torch start-up

    killed = tmp_path / "killed"
    process = train_process(cli(images, cache, killed, "--epochs", "8"))
    deadline = time.time() + 600
    while not (killed / "attention" / "epoch_0002.npz").exists() and time.time() < deadline:
        assert process.poll() is None, process.communicate()[0]
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL
    written = snapshot_epochs(killed)
    assert written[:3] == [0, 1, 2] and written != list(range(9)), "the kill came after the run ended"
    for epoch in written:  # every file a reader can see is whole
        load_snapshot(killed, epoch)

    resumed = vit_command("vit.train", "--resume", killed, env={"OMP_NUM_THREADS": "1"})  # in this process
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert snapshot_epochs(killed) == snapshot_epochs(reference) == list(range(9))
    for epoch in range(9):
        a, b = load_snapshot(killed, epoch), load_snapshot(reference, epoch)
        for key in ("logits", "cls_attention", "rollout", "distance", "entropy"):
            np.testing.assert_allclose(getattr(a, key), getattr(b, key), rtol=0, atol=1e-6, err_msg=f"{key} {epoch}")


def test_keep_leaves_the_most_recent_epoch_checkpoints_and_the_best(images, cache, tmp_path):
    out = tmp_path / "keep"
    assert train(cli(images, cache, out, "--epochs", "4", "--save-every", "1", "--keep", "1",
                    "--attention-every", "0")) == 0
    accuracies = [row["val_acc"] for row in read_metrics(out / "metrics.jsonl")]
    best = accuracies.index(max(accuracies)) + 1  # the first epoch to reach the best accuracy
    assert set(epoch_checkpoints(out)) == {4, best}
    kept = load_checkpoint(epoch_checkpoint_path(out, 4))
    assert kept.metadata["epochs"] == 4 and kept.training_state is None  # the usual format, weights only
    assert not (out / "attention").exists()  # --attention-every 0


def test_attention_every_n_takes_every_nth_epoch_and_the_last(images, cache, tmp_path):
    out = tmp_path / "every2"
    assert train(cli(images, cache, out, "--epochs", "3", "--attention-every", "2")) == 0
    assert snapshot_epochs(out) == [0, 2, 3]
    assert not (out / "checkpoints").exists()  # --save-every defaults to off
