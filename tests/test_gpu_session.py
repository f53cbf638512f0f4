"""``scripts/gpu_session.sh default`` and ``record``, dry-run on the CPU (a lease has minutes: no time to find a
mistake there): the tiny preset on tiny data for 3 epochs (a --time-budget plans at the end of epoch 2), each
recipe alone, its best.pt scored by vit.evaluate, the plan, the files and the exit status checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_gpu_lease_scripts import image_folder

REPO = Path(__file__).resolve().parent.parent
TINY = "--preset tintn-cifar10 --batch-size 16 --epochs 3 --warmup-epochs 2 --threads 1"
RETURNED = ["best.pt", "config.json", "console.txt", "metrics.jsonl", "plan.json", "train.log"]


def session(tmp_path: Path, *phase: str) -> tuple[subprocess.CompletedProcess, Path]:
    out, data = tmp_path / "out", tmp_path / "data"
    if not data.exists():
        image_folder(data)
    env = {**os.environ, "PY": sys.executable, "OUT": str(out), "DATA": str(data),
           "DEVICE": "cpu", "WORK": str(tmp_path / "work"), "DEADLINE": "300", "EXTRA": TINY}
    done = subprocess.run(["bash", "scripts/gpu_session.sh", *phase], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    return done, out


def check_run(out: Path, recipe: str) -> dict:
    """One recipe's returned files: the run trained its 3 epochs inside its budget, vit.evaluate found its best."""
    assert sorted(p.name for p in out.iterdir()) == RETURNED
    plan = json.loads((out / "plan.json").read_text())
    assert plan["recipe_name"] == recipe and plan["run_exit"] == 0 and plan["run_epochs_done"] == 3
    assert 200 < plan["time_budget_seconds"] <= 285  # DEADLINE 300 less the 15-s margin and the decoding
    assert plan["run_launch_to_last_epoch_seconds"] <= plan["time_budget_seconds"]
    evaluated = plan["evaluate_best"]
    assert evaluated["count"] == 10 and abs(evaluated["accuracy"] - plan["val_acc_best"]) < 1e-9
    config = json.loads((out / "config.json").read_text())
    assert config["args"]["time_budget"] == plan["time_budget_seconds"] and config["args"]["epochs"] == 3
    return config


@pytest.mark.slow
def test_default_trains_the_recipe_alone_and_returns_its_files(tmp_path):
    done, out = session(tmp_path, "default")
    assert done.returncode == 0, done.stdout + done.stderr
    config = check_run(out, "default")
    assert (config["args"]["augment"], config["args"]["repeat_aug"], config["args"]["ema"]) == ("trivialaugment", 1,
                                                                                                  0.998)
    assert "plan: " in (out / "console.txt").read_text()


@pytest.mark.slow
def test_record_trains_lee_et_al_then_ours_one_after_the_other(tmp_path):
    done, out = session(tmp_path, "record")
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["lee", "lee-ours"]
    lee, ours = check_run(out / "lee", "lee"), check_run(out / "lee-ours", "lee-ours")
    for config in (lee, ours):
        assert config["args"]["repeat_aug"] == 3 and config["args"]["repeat_aug_sampler"] == "passes"
    assert (lee["args"]["augment"], lee["model"]["drop_path_schedule"], lee["args"]["ema"]) == ("autoaugment",
                                                                                                 "uniform", 0.0)
    assert (ours["args"]["augment"], ours["model"]["drop_path_schedule"], ours["args"]["ema"]) == (
        "trivialaugment", "linear", 0.998)
    # One after the other: the first had returned its files before the second began its console.
    assert (out / "lee" / "plan.json").stat().st_mtime <= (out / "lee-ours" / "console.txt").stat().st_ctime


def test_an_unknown_recipe_or_phase_is_refused_before_anything_runs(tmp_path):
    done, out = session(tmp_path, "record", "lee", "mine")
    assert done.returncode == 2 and "record: unknown recipe mine (lee or lee-ours)" in done.stderr
    assert not (out / "lee").exists()
    done, _ = session(tmp_path, "nothing")
    assert done.returncode == 2 and "usage:" in done.stderr
