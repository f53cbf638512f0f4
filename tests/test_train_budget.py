"""``vit.train --time-budget``: the epochs planned from the run's own pace, and a run equal to one that was told
them (schedule, files, resume)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import TINY_TRAIN, make_image_folder

import vit.training.trainer as trainer_module
from vit.checkpoint import read_checkpoint_payload
from vit.train import main
from vit.training.budget import BUDGET_MAX_EPOCHS, BUDGET_SAFETY, parse_duration, plan_epochs
from vit.training.optimization import schedule_factor
from vit.training.options import parse_args
from vit.training.trainer import FAULT_ENV

TINY = [*TINY_TRAIN, "--batch-size", "4"]
TIMING_KEYS = {"epoch_seconds", "images_per_second"}
# The cosine, a warmup of the two planning epochs and EMA: the rates before and after the plan both matter.
RECIPE = ["--warmup-epochs", "2", "--ema", "0.9"]


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """22 training images at batch 4: 5 steps an epoch."""
    return make_image_folder(tmp_path_factory.mktemp("data") / "colours", per_class=12)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


def cli(images: Path, cache: Path, out: Path, *extra: str) -> list[str]:
    return ["--dataset", f"folder:{images}", "--out", str(out), "--cache-dir", str(cache), *TINY, *RECIPE, *extra]


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def metrics(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in rows]


@pytest.fixture(scope="module")
def told_three(images, cache, tmp_path_factory) -> Path:
    """The run a plan of 3 epochs must equal: told --epochs 3."""
    out = tmp_path_factory.mktemp("runs") / "told"
    assert main(cli(images, cache, out, "--epochs", "3")) == 0
    return out


def planning(monkeypatch, epochs: int) -> list[tuple]:
    """Make the plan ``epochs`` whatever the clock says; returns the calls' arguments."""
    calls = []

    def plan(*args):
        calls.append(args)
        return epochs

    monkeypatch.setattr(trainer_module, "plan_epochs", plan)
    return calls


def test_plan_epochs_fits_whole_epochs_with_their_margin_and_never_passes_the_most():
    assert BUDGET_SAFETY == 1.02
    # 500 s left at 10 s an epoch taken as 10.2 s: 49 more (49 x 10.2 = 499.8; 50 x 10.2 = 510).
    assert plan_epochs(600.0, 100.0, 10.0, 2, BUDGET_MAX_EPOCHS) == 51
    assert plan_epochs(600.0, 100.0, 10.0, 2, 30) == 30
    assert plan_epochs(600.0, 599.0, 10.0, 2, 30) == 2  # not one more fits
    assert plan_epochs(600.0, 700.0, 10.0, 3, 30) == 3  # over budget already: none more, none taken back


def test_the_plan_sets_the_runs_epochs_and_its_cosine_as_if_they_had_been_told(told_three, images, cache,
                                                                                tmp_path, monkeypatch):
    calls = planning(monkeypatch, 3)
    out = tmp_path / "budget"
    assert main(cli(images, cache, out, "--time-budget", "1h", "--epochs", "8")) == 0

    budget, done, most = calls[0][0], calls[0][3], calls[0][4]
    assert (len(calls), budget, done, most) == (1, 3600.0, 2, 8)
    spent, epoch_seconds = calls[0][1], calls[0][2]
    assert 0 < epoch_seconds < spent < 600  # the second epoch's wall time, and the run's since its launch
    assert metrics(out) == metrics(told_three)  # every epoch's losses, accuracies and learning rate
    a, b = read_checkpoint_payload(out / "last.pt"), read_checkpoint_payload(told_three / "last.pt")
    assert all((a["state_dict"][k] == b["state_dict"][k]).all() for k in a["state_dict"])
    config = read_json(out / "config.json")
    assert config["args"]["epochs"] == 3 and config["args"]["time_budget"] == 3600.0
    plan = config["budget_plan"]
    assert (plan["at_epoch"], plan["epochs"], plan["max_epochs"], plan["time_budget"]) == (2, 3, 8, 3600.0)
    status = read_json(out / "status.json")
    assert (status["state"], status["epoch"], status["total_epochs"], status["total_steps"]) == \
        ("completed", 3, 3, 15)
    assert a["training_state"]["progress"]["planned_epochs"] == 3
    assert "planned 3 epochs in all" in (out / "train.log").read_text()


def test_a_budget_that_fits_every_epoch_trains_the_most_it_may(images, cache, tmp_path):
    out, told = tmp_path / "budget", tmp_path / "told"
    assert main(cli(images, cache, out, "--time-budget", "1d", "--epochs", "4")) == 0
    assert main(cli(images, cache, told, "--epochs", "4")) == 0
    assert metrics(out) == metrics(told)
    assert read_json(out / "config.json")["budget_plan"]["epochs"] == 4
    assert "(--epochs 4 bounds it)" in (out / "train.log").read_text()


def test_a_budget_too_short_for_more_ends_the_run_at_the_planning_epoch(images, cache, tmp_path):
    out = tmp_path / "short"
    assert main(cli(images, cache, out, "--time-budget", "0.01s", "--attention-every", "3")) == 0
    assert len(metrics(out)) == 2
    status = read_json(out / "status.json")
    assert (status["state"], status["epoch"], status["total_epochs"]) == ("completed", 2, 2)
    assert read_json(out / "config.json")["args"]["epochs"] == 2
    assert "no epoch after the 2 planning ones fits in 0 s; the run ends here, inside its warmup" in \
        (out / "train.log").read_text()
    assert (out / "attention" / "epoch_0002.npz").is_file()  # the last epoch's snapshot, though 2 % 3 != 0
    assert read_checkpoint_payload(out / "last.pt")["training_state"]["progress"]["epoch"] == 2


def test_the_plan_waits_for_the_warmups_end_and_takes_the_mean_epoch_after_the_first(images, cache, tmp_path,
                                                                                      monkeypatch):
    calls = []

    def plan(budget, spent, epoch_seconds, done, most):
        calls.append((done, epoch_seconds))
        return most

    monkeypatch.setattr(trainer_module, "plan_epochs", plan)
    out = tmp_path / "budget"
    end_epoch, plan_when_due = trainer_module.Trainer._end_epoch, trainer_module.Trainer._plan_when_due
    ends = []  # the run's own epoch ends, as each plan read them

    def slow_second(self, status):
        end_epoch(self, status)
        if self.progress.epoch == 2:  # a slow second epoch: its time alone is not the mean
            trainer_module.time.sleep(1.5)

    def seen(self, status, clock, end_seconds):
        ends[:] = self.epoch_ends
        return plan_when_due(self, status, clock, end_seconds)

    monkeypatch.setattr(trainer_module.Trainer, "_end_epoch", slow_second)
    monkeypatch.setattr(trainer_module.Trainer, "_plan_when_due", seen)
    assert main(cli(images, cache, out, "--time-budget", "1h", "--epochs", "5", "--warmup-epochs", "3.5")) == 0
    # Asked at each epoch end from the second, and due at the warmup's end; whether the plan still fits waits
    # two epochs after it.
    assert [done for done, _ in calls] == [2, 3]
    assert read_json(out / "config.json")["budget_plan"]["at_epoch"] == 3
    mean, last = (ends[2] - ends[0]) / 2, ends[2] - ends[1]  # epochs 2 and 3, each from the end of the one before
    assert calls[1][1] == pytest.approx(mean, rel=1e-9, abs=1e-9) and mean - last > 0.2


def test_a_budget_that_runs_out_in_the_warmup_is_planned_there(images, cache, tmp_path):
    out = tmp_path / "short"
    assert main(cli(images, cache, out, "--time-budget", "0.01s", "--warmup-epochs", "4")) == 0
    assert len(metrics(out)) == 2
    assert read_json(out / "config.json")["budget_plan"]["at_epoch"] == 2


def test_a_corrections_cosine_goes_on_from_the_rate_reached_to_the_floor_at_its_end():
    base = dict(warmup=10, total=100, schedule="cosine", floor=0.0)
    reached = schedule_factor(55, **base)
    assert reached == pytest.approx(0.5)  # halfway down the first plan's cosine: (55 - 10) / (100 - 10)
    segments = ((55, reached, 85),)
    assert [schedule_factor(s, **base, segments=segments) for s in (54, 55, 70, 85, 95)] == \
        pytest.approx([schedule_factor(54, **base), 0.5, 0.25, 0.0, 0.0])
    later = ((55, reached, 85), (70, 0.25, 75))
    assert schedule_factor(75, **base, segments=later) == 0.0 and schedule_factor(60, **base, segments=later) == \
        pytest.approx(schedule_factor(60, **base, segments=segments))


def test_a_pace_off_the_plan_corrects_it_and_a_resume_keeps_the_correction(images, cache, tmp_path, monkeypatch):
    monkeypatch.setattr(trainer_module, "BUDGET_TOLERANCE", 0.0)  # off by two epochs is enough
    answers = iter([8, 5])  # the plan at the end of epoch 2, then what fits two epochs later

    def plan(budget, spent, epoch_seconds, done, most):
        return next(answers)

    monkeypatch.setattr(trainer_module, "plan_epochs", plan)
    told = tmp_path / "told"
    assert main(cli(images, cache, told, "--epochs", "8")) == 0
    out = tmp_path / "budget"
    monkeypatch.setenv(FAULT_ENV, "23")  # in epoch 5, after the correction at the end of epoch 4
    assert main(cli(images, cache, out, "--time-budget", "1h", "--epochs", "10")) == 1
    monkeypatch.delenv(FAULT_ENV)
    assert main(["--resume", str(out)]) == 0

    rows, told_rows = metrics(out), metrics(told)
    assert len(rows) == 5 and rows[:4] == told_rows[:4]  # the plan of 8 up to the correction
    assert rows[4]["lr"] == pytest.approx(1e-5)  # the floor (ours: --min-lr 1e-5) at the new last step
    progress = read_checkpoint_payload(out / "last.pt")["training_state"]["progress"]
    reached = told_rows[3]["lr"] / 2e-3  # the rate at the end of epoch 4, as a share of ours' peak 2e-3
    assert progress["budget_segments"] == [[20, pytest.approx(reached), 25]]
    assert (progress["planned_epochs"], progress["budget_base_epochs"], progress["budget_max_epochs"]) == (5, 8, 10)
    plan = read_json(out / "config.json")["budget_plan"]
    assert (plan["epochs"], plan["at_epoch"], [c["epochs"] for c in plan["corrections"]]) == (5, 2, [5])
    assert read_json(out / "status.json")["total_epochs"] == 5


def test_a_resume_after_the_plan_keeps_it(told_three, images, cache, tmp_path, monkeypatch):
    planning(monkeypatch, 3)
    out = tmp_path / "budget"
    monkeypatch.setenv(FAULT_ENV, "12")  # in epoch 3 (5 steps an epoch): after the plan
    assert main(cli(images, cache, out, "--time-budget", "1h", "--epochs", "8")) == 1
    monkeypatch.delenv(FAULT_ENV)
    calls = planning(monkeypatch, 5)  # a second plan would train 5
    assert main(["--resume", str(out)]) == 0
    assert calls == []
    assert metrics(out) == metrics(told_three)
    assert read_json(out / "status.json")["total_epochs"] == 3


def test_a_resume_before_the_plan_plans_at_the_planning_epoch(told_three, images, cache, tmp_path, monkeypatch):
    out = tmp_path / "budget"
    monkeypatch.setenv(FAULT_ENV, "7")  # in epoch 2, before the plan; last.pt holds epoch 1
    assert main(cli(images, cache, out, "--time-budget", "1h", "--epochs", "8")) == 1
    monkeypatch.delenv(FAULT_ENV)
    calls = planning(monkeypatch, 3)
    assert main(["--resume", str(out)]) == 0
    assert len(calls) == 1 and calls[0][3] == 2
    assert metrics(out) == metrics(told_three)


def test_durations_and_what_a_budget_needs(images, cache, tmp_path):
    assert [parse_duration(t) for t in ("600", "600s", "10m", "1.5h", "1d", " 2M ")] == \
        [600, 600, 600, 5400, 86_400, 120]
    for text in ("0", "-5m", "soon", "", "m", "inf", "nan", "400d"):
        with pytest.raises(ValueError):
            parse_duration(text)
    args = parse_args(["--dataset", f"folder:{images}", "--out", str(tmp_path / "a"), "--time-budget", "10m"])
    assert (args.time_budget, args.epochs, args.warmup_epochs) == (600.0, BUDGET_MAX_EPOCHS, 5)
    args = parse_args(["--dataset", f"folder:{images}", "--out", str(tmp_path / "a"), "--time-budget", "10m",
                       "--recipe", "seed"])  # a constant rate: no warmup needed before the plan
    assert (args.warmup_epochs, args.schedule) == (0, "constant")


INVALID = {
    "zero": (["--time-budget", "0"], "--time-budget: expected a duration above 0"),
    "words": (["--time-budget", "soon"], "got 'soon'"),
    "warmup shorter than the planning epochs": (["--time-budget", "5m", "--warmup-epochs", "1"],
                                                "--time-budget with the cosine schedule needs --warmup-epochs 2 or "
                                                "more (got 1)"),
    "no epoch after the plan": (["--time-budget", "5m", "--epochs", "2", "--warmup-epochs", "1.5",
                                 "--schedule", "constant"], "--epochs (the most it may plan) must be above 2, not 2"),
}


@pytest.mark.parametrize("case", INVALID, ids=list(INVALID))
def test_invalid_budgets_fail_with_one_line_before_anything_is_written(case, images, cache, tmp_path, capsys):
    extra, expected = INVALID[case]
    out = tmp_path / "run"
    assert main(["--dataset", f"folder:{images}", "--out", str(out), "--cache-dir", str(cache), *TINY, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("vit.train: error: ") and expected in err and "\n" not in err
    assert not out.exists()


def test_a_resume_cannot_set_a_budget(told_three, capsys):
    assert main(["--resume", str(told_three), "--epochs", "5", "--time-budget", "1h"]) == 2
    assert "--time-budget cannot change when resuming" in capsys.readouterr().err
