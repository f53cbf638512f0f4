"""The scripts a lent GPU runs, run here on the CPU first (a lease has minutes: no time to find a mistake there):
``bench/train_gpu_default.py`` gives its run the time left as ``--time-budget`` and collects what a lease can
return;
``bench/profile_train_step.py`` reports every phase ``Trainer.step`` labels."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from vit.training.options import parse_args

REPO = Path(__file__).resolve().parent.parent
TINY = ["--preset", "tintn-cifar10", "--batch-size", "16"]


def image_folder(root: Path, per_class: int = 4) -> Path:
    """10 classes of ``per_class`` random 32-px PNGs. 4 each (12 until issue 112): the stratified split still holds
    out one a class (the 10 images vit.evaluate scores) and leaves 30 to train on, one 16-image step an epoch (the
    rest dropped, as the authors' sampler does). What these tests check (the plan, the files, the exit codes, the
    evaluation matching the log) does not depend on the count, and 110 training images made the training most of
    their CPU after the interpreters' start (Lee et al.'s 3 passes an epoch: 3 x 3 epochs of them)."""
    rng = np.random.default_rng(0)
    for label in range(10):
        folder = root / f"class{label}"
        folder.mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    return root


def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_the_default_run_is_given_the_time_left_and_collects_what_a_lease_returns(tmp_path):
    data, out = image_folder(tmp_path / "data"), tmp_path / "out"
    done = run("bench/train_gpu_default.py", "--data", str(data), "--out", str(out), "--work", str(tmp_path / "w"),
               "--deadline", "500", "--margin", "5", "--device", "cpu", "--profile", "16", "--profile-steps", "2,1",
               "--extra", *TINY, "--epochs", "3", "--warmup-epochs", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    plan = json.loads((out / "plan.json").read_text())
    assert 200 < plan["time_budget_seconds"] <= 495  # the deadline less the margin, the decoding and the profile
    # The budget holds far more than 3 epochs of this tiny model: the run plans at its warmup's end (epoch 2, one
    # before its last: the plan is made, not skipped at the end), and its --epochs bounds the plan. (6 epochs proved
    # no more than 3 do, for 3 more epochs' CPU; issue 112.)
    assert (plan["run_plan"]["at_epoch"], plan["run_plan"]["epochs"], plan["run_plan"]["max_epochs"]) == (2, 3, 3)
    assert plan["run_epochs_done"] == 3 and plan["run_exit"] == 0
    assert plan["run_launch_to_last_epoch_seconds"] <= plan["time_budget_seconds"]
    returned = sorted(p.name for p in out.iterdir())
    assert returned == ["best.pt", "config.json", "metrics.jsonl", "plan.json", "step-16.txt", "train.log"]
    step = (out / "step-16.txt").read_text()  # the profile's 2 steps, not a lease's 30 (issue 93: 17 s -> 6 s here)
    assert "step: forward" in step and "warm-up: 1 steps" in step and "profiled: 2 steps" in step
    config = json.loads((out / "config.json").read_text())
    assert (config["args"]["epochs"], config["args"]["mix_prob"]) == (3, 0.5)
    assert config["args"]["time_budget"] == plan["time_budget_seconds"]
    # The recipe is a valid vit.train command as the GPU runs it (the device aside: this machine has none).
    from bench.train_gpu_default import RECIPE

    parsed = parse_args(["--dataset", f"folder:{data}", "--out", str(tmp_path / "x"), "--device", "cpu", *RECIPE,
                         "--time-budget", "560"])
    assert (parsed.preset, parsed.batch_size, parsed.compile, parsed.random_erasing) == ("cifar-m", 1024, True, 0.25)


def test_the_recipe_is_the_one_the_shipped_gpu_default_trained_with(tmp_path):
    # Issue 89: one command trains what ships; the default's own config.json (its lease's files) is the reference.
    from bench.train_gpu_default import RECIPE

    config = json.loads((REPO / "bench/results/h100-2026-11-26b/b1024/config.json").read_text())
    shipped = config["args"]
    ours = vars(parse_args(["--dataset", shipped["dataset"], "--out", str(tmp_path / "x"), "--device", "cpu", *RECIPE,
                            "--time-budget", str(shipped["time_budget"])]))
    # Options added since take their defaults, which leave the recipe as it trained (issue 111's are off).
    added = {k: ours[k] for k in ours if k not in shipped}
    assert added == {"repeat_aug": 1, "repeat_aug_sampler": "passes", "drop_path_schedule": None}
    differ = {k: (ours[k], shipped[k]) for k in ours if k in shipped and ours[k] != shipped[k]}
    # config.json's epochs is the run's plan; --epochs 10000 (the default) only bounds it
    assert differ == {"out": (str(tmp_path / "x"), shipped["out"]), "device": ("cpu", "cuda"),
                      "epochs": (10000, config["budget_plan"]["epochs"])}


def test_runs_side_by_side_share_the_budget_and_each_best_pt_is_evaluated_as_it_would_ship(tmp_path):
    # Issue 89: a second recipe trains beside the first on the same machine, with the same budget; vit.evaluate
    # scores each best.pt on the validation images written out as PNGs, and must find what the run logged for it.
    import tarfile

    data, out = image_folder(tmp_path / "data"), tmp_path / "out"
    done = run("bench/train_gpu_default.py", "--data", str(data), "--out", str(out), "--work", str(tmp_path / "w"),
               "--deadline", "400", "--margin", "5", "--device", "cpu", "--also", "wide=--hidden-size 64",
               "--extra", *TINY, "--epochs", "3", "--warmup-epochs", "2", "--precision", "fp32")
    assert done.returncode == 0, done.stdout + done.stderr
    plan = json.loads((out / "plan.json").read_text())
    other = plan["side_by_side_results"]["wide"]
    assert plan["side_by_side"] == {"wide": ["--hidden-size", "64"]}
    assert plan["run_exit"] == other["run_exit"] == 0 and plan["run_epochs_done"] == other["run_epochs_done"] == 3
    for result in (plan, other):
        evaluated = result["evaluate_best"]
        assert evaluated["count"] == 10 and abs(evaluated["accuracy"] - result["val_acc_best"]) < 1e-9
    assert sorted(p.name for p in out.iterdir()) == ["plan.json", "run-run.tar", "run-wide.tar"]
    with tarfile.open(out / "run-wide.tar") as tar:
        names = set(tar.getnames())
        config = json.load(tar.extractfile("wide/config.json"))
    assert {"wide/best.pt", "wide/metrics.jsonl", "wide/train.log", "wide/console.log"} <= names
    assert config["model"]["hidden_size"] == 64 and config["args"]["time_budget"] == plan["time_budget_seconds"]


def test_the_step_profile_reports_every_phase_the_trainer_labels():
    # 500 random images, not the default 50,000 (CIFAR-10's shape, which the test below checks): the two
    # validations of 5,000 images were half of this test's time on CPU, and no phase of a step depends on the count
    done = run("bench/profile_train_step.py", "--device", "cpu", "--steps", "2", "--warmup", "1", "--images", "500",
               "--", *TINY)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {line.split("  ")[0].strip(): line.split() for line in done.stdout.splitlines() if line.startswith("step:")}
    assert set(rows) == {"step: augment", "step: forward", "step: backward", "step: optimizer", "step: ema"}
    assert all(float(row[2]) > 0 for row in rows.values())  # host milliseconds a step in each phase
    assert "images/s" in done.stdout and "validation of 50 images: first" in done.stdout  # a tenth held out


def test_the_step_profiles_random_data_is_cifar_10_shaped_by_default():
    from bench.profile_train_step import RANDOM_IMAGES, parser, random_data

    assert parser().parse_args([]).images == RANDOM_IMAGES
    data = random_data(RANDOM_IMAGES, 3, 1)  # 1 px: the split's shape, not the pixels, is the subject
    assert (len(data.train), len(data.val)) == (45_000, 5_000) and data.train.images.shape[1:] == (3, 1, 1)
    assert sorted(set(data.val.labels.tolist())) == list(range(10))
