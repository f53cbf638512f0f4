"""scripts/gpu_sweep.py, the GPU lease's side-by-side recipes: its plans and re-plans, on the CPU with the runs'
processes stood in for (the lease has no time to find a planning mistake)."""

from __future__ import annotations

import importlib.util
import json
import signal
from pathlib import Path

import pytest

from vit.training.options import parse_args

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def sweep(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("gpu_sweep", REPO / "scripts" / "gpu_sweep.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "ROOT", tmp_path / "sweep")
    module.spawned, module.killed, module.alive = [], [], set()

    def spawn(name, args):
        module.spawned.append((name, args))
        pid = 1000 + len(module.spawned)
        module.alive.add(pid)
        return pid

    def kill(pid, sig):
        assert sig == signal.SIGTERM
        module.killed.append(pid)
        module.alive.discard(pid)  # the run saves last.pt and ends

    monkeypatch.setattr(module, "spawn", spawn)
    monkeypatch.setattr(module.os, "kill", kill)
    monkeypatch.setattr(module, "pid_alive", lambda pid: pid in module.alive)
    return module


def write_bench(path: Path, rates: dict[str, float]) -> Path:
    path.write_text("".join(json.dumps({"model": m, "images_per_s": r, "compile": "default", "batch": 1024}) + "\n"
                            for m, r in rates.items()))
    return path


def test_every_recipe_is_a_valid_vit_train_command_planned_from_the_bench(sweep, tmp_path, monkeypatch):
    monkeypatch.setattr(sweep, "now", lambda: 1000.0)
    sweep.launch(str(write_bench(tmp_path / "bench.jsonl", {"cifar-m": 45_000.0, "cifar-m:p2": 15_000.0})), 1075.0)
    runs = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert runs["end"] == 2075.0 and set(runs["runs"]) == set(sweep.RECIPES)
    for name, args in sweep.spawned:
        cpu = [a if a != "cuda" else "cpu" for a in args]  # this machine has no GPU to parse --device cuda against
        parsed = parse_args(cpu)
        model, divisor, batch, lr, _ = sweep.RECIPES[name]
        rate = {"cifar-m": 45_000.0, "cifar-m:p2": 15_000.0}[model] / divisor / sweep.SHARED_SLOWDOWN
        assert parsed.epochs == int(1000 * rate / 45_000 / 1.1), name  # the time left after a start, at its pace
        steps = parsed.epochs * -(-45_000 // batch)
        assert parsed.ema == pytest.approx(1 - 1 / (0.05 * steps), abs=1e-6)  # the last ~5 % of the steps
        assert (parsed.batch_size, parsed.lr, parsed.out) == (batch, lr, str(tmp_path / "sweep" / name))


def test_replan_resumes_each_run_with_the_epochs_its_pace_fits_before_the_deadline(sweep, tmp_path, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(sweep, "now", lambda: clock[0])
    sweep.launch(str(write_bench(tmp_path / "bench.jsonl", {"cifar-m": 45_000.0, "cifar-m:p2": 15_000.0})), 1075.0)
    planned = {name: json.loads((tmp_path / "sweep" / "sweep.json").read_text())["runs"][name]["epochs"]
               for name in sweep.RECIPES}
    paces = dict(zip(sweep.RECIPES, (17.0, 12.0, 6.0, 0.0), strict=True))
    kept = list(sweep.RECIPES)[-1]
    paces[kept] = (575 - sweep.RESTART_SECONDS) / (planned[kept] - 10)  # exactly its plan
    for name, pace in paces.items():
        metrics = [{"epoch": e, "val_acc": 0.5, "epoch_seconds": pace} for e in range(1, 11)]
        (tmp_path / "sweep" / name).mkdir()
        (tmp_path / "sweep" / name / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    clock[0] = 1500.0  # 575 s to the deadline
    sweep.spawned.clear()
    sweep.replan()
    resumed = {name: args for name, args in sweep.spawned}
    assert kept not in resumed  # its pace still fits its plan (within 5 %): not stopped
    for name in list(sweep.RECIPES)[:-1]:
        epochs = 10 + int((575 - sweep.RESTART_SECONDS) / paces[name])
        assert resumed[name] == ["--resume", str(tmp_path / "sweep" / name), "--epochs", str(epochs)]
    assert len(sweep.killed) == 3
