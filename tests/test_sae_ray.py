"""``python -m vit.sae train … --ray ADDRESS --workers N`` on a real local Ray cluster (two nodes, one CPU each):
Ray Data harvests on an actor, a Ray Train worker trains, and the SAE is the one the local command trains on the
same images (the same harvested activations, shuffled alike)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from vit_commands import vit_command

from vit.core.runfiles import read_status

REPO = Path(__file__).resolve().parent.parent
CHECKPOINT = REPO / "checkpoints" / "cifar10-cifar-s.pt"
SAMPLES = REPO / "checkpoints" / "samples" / "cifar10-cifar-s"
pytestmark = pytest.mark.slow
# 8 training images in blocks of 3 (three Ray Data blocks, order matters), 2 held out.
TINY = ["--layer", "2", "--width", "48", "--k", "4", "--epochs", "2", "--batch-size", "64", "--buffer-tokens", "256",
        "--holdout", "2", "--image-batch", "3"]


def sae(*argv: str) -> subprocess.CompletedProcess:
    """``vit.sae train`` in this process (tests/vit_commands.py: its main here, what a real process prints and exits
    with): the job's entrypoint, its actor and its Train worker are the real processes, on the cluster; the command
    as a real process (its entry point, a stop) is the Train page's SAE test's (tests/test_training_page_sae.py)."""
    return vit_command("vit.sae", "train", *argv, env={"OMP_NUM_THREADS": "1"})  # as the job's: the same float sums


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("sae-ray") / "images"
    shutil.copytree(SAMPLES, folder)
    return folder


def test_a_ray_run_trains_the_sae_the_local_command_trains(ray_cluster, images, tmp_path):
    local, remote = tmp_path / "local", tmp_path / "ray"
    # The reference in this process (one thread, as the job's: the same float sums): no second torch start-up.
    from vit.sae import main

    assert main(["train", str(CHECKPOINT), "--data", str(images), *TINY, "--out", str(local), "--device", "cpu"]) == 0
    done = sae(str(CHECKPOINT), "--data", str(images), *TINY, "--out", str(remote), "--ray", ray_cluster.address,
               "--workers", "1")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "vit.sae: submitted job sae-ray-" in done.stdout
    assert read_status(remote / "status.json")["state"] == "completed"
    a, b = load_file(local / "sae_weights.safetensors"), load_file(remote / "sae_weights.safetensors")
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=1e-6)
    steps = [[json.loads(line)["explained_variance"] for line in (folder / "steps.jsonl").read_text().splitlines()]
             for folder in (local, remote)]
    assert steps[0] == pytest.approx(steps[1], abs=1e-6)  # step by step: the same shuffled activations
    assert json.loads((remote / "config.json").read_text())["kind"] == "sae"


def test_more_workers_than_the_cluster_holds_is_one_line_before_submitting(ray_cluster, images, tmp_path):
    done = sae(str(CHECKPOINT), "--data", str(images), *TINY, "--out", str(tmp_path / "o"), "--ray",
               ray_cluster.address, "--workers", "5")  # read from the dashboard: nothing submitted
    assert done.returncode == 2
    assert done.stderr.startswith("vit.sae: error: --workers 5 needs 6 CPUs") and done.stderr.count("\n") == 1
    assert not (tmp_path / "o").exists()
