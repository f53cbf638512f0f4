"""The Train page asks for what a strong from-scratch ViT recipe needs beyond the basics: mixup and CutMix (and the
share of batches mixed), random erasing, drop path, the precision and torch.compile; each reaches ``vit.train``
as its own flag, and the CLI's own rules judge each field."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from streamlit.testing.v1 import AppTest
from test_training_page import errors, fill_tiny_run, folders, submit  # noqa: F401 - folders: a fixture

from vit.runs.launch import RunParams, cli_args, validate_params
from vit.runs.manager import RunManager
from vit.training.options import parse_args
from vit.training.trainer import UsageError

ROOT = Path(__file__).resolve().parent.parent
PAGE = str(ROOT / "app_pages" / "training.py")
TIMEOUT = 300
RECIPE = dict(mixup=0.8, cutmix=1.0, mix_prob=0.5, random_erasing=0.25, drop_path=0.1, precision="fp32",
              compile=True)


def test_the_recipe_fields_reach_the_cli_as_its_own_flags(tmp_path):
    argv = cli_args(RunParams(name="r", dataset="cifar10", **RECIPE), tmp_path / "r", tmp_path / "data")
    args = parse_args([*argv, "--device", "cpu"])  # what the training process reads
    assert (args.mixup, args.cutmix, args.mix_prob, args.random_erasing, args.drop_path, args.precision,
            args.compile) == (0.8, 1.0, 0.5, 0.25, 0.1, "fp32", True)
    assert "--compile" in argv and argv[argv.index("--compile") + 1].startswith("--")  # a switch: no value
    left_out = cli_args(RunParams(name="r", dataset="cifar10"), tmp_path / "r", tmp_path / "data")
    assert not {"--mixup", "--cutmix", "--mix-prob", "--random-erasing", "--drop-path", "--precision",
                "--compile"} & set(left_out)  # empty fields: the recipe's and the preset's values


def test_a_time_budget_reaches_the_cli_bounded_by_the_pages_epochs(tmp_path):
    from vit.runs.launch import MAX_EPOCHS

    argv = cli_args(RunParams(name="r", dataset="cifar10", time_budget="10m"), tmp_path / "r", tmp_path / "data")
    args = parse_args([*argv, "--device", "cpu"])
    assert (args.time_budget, args.epochs) == (600.0, MAX_EPOCHS)  # the CLI alone would plan up to 10,000
    argv = cli_args(RunParams(name="r", dataset="cifar10", time_budget="1h", epochs=40), tmp_path / "r",
                    tmp_path / "data")
    assert parse_args([*argv, "--device", "cpu"]).epochs == 40
    for budget, field, words in (("soon", "time_budget", "expected a duration above 0"),
                                 ("10m", "time_budget", "needs --warmup-epochs 2 or more")):
        problems = validate_params(RunParams(name="r", dataset="cifar10", time_budget=budget, warmup_epochs=1.0),
                                   tmp_path / "runs", tmp_path / "data")
        assert set(problems) == {field} and words in problems[field], problems


@pytest.mark.parametrize("field, value, words", [
    ("mixup", -1.0, "0 (off) or a number in"), ("random_erasing", 1.5, "1"), ("mix_prob", 2.0, "1"),
    ("drop_path", 1.0, "1"),
    ("precision", "fp16", "fp16")])
def test_a_bad_recipe_field_is_named_with_the_clis_own_rule(tmp_path, field, value, words):
    problems = validate_params(RunParams(name="r", dataset="cifar10", **{field: value}), tmp_path / "runs",
                               tmp_path / "data")
    assert set(problems) == {field} and words in problems[field], problems


@pytest.mark.parametrize("field", ["mixup", "cutmix"])
@pytest.mark.parametrize("alpha", [1e-300, 5e-324])
def test_an_alpha_that_float32_rounds_to_0_is_refused_naming_the_flag(tmp_path, field, alpha):
    """Issue 62, item 4: torchvision draws the mixing weight from a float32 Beta(alpha, alpha); such an alpha passed
    the rule and the run failed at its start with torch's Dirichlet message."""
    assert torch.tensor(alpha).item() == 0  # what the run would hand torch
    flag = "--" + field
    with pytest.raises(UsageError, match=f"^argument {flag}: expected 0 \\(off\\) or a number in "):
        parse_args(["--dataset", "cifar10", "--out", str(tmp_path / "r"), flag, repr(alpha)])
    problems = validate_params(RunParams(name="r", dataset="cifar10", **{field: alpha}), tmp_path / "runs",
                               tmp_path / "data")
    assert set(problems) == {field} and "expected 0 (off) or a number in" in problems[field], problems
    assert parse_args(["--dataset", "cifar10", "--out", str(tmp_path / "r"), flag, "0"]).__dict__[field] == 0


@pytest.mark.parametrize("mixer", ["MixUp", "CutMix"])
def test_the_smallest_alpha_accepted_mixes_a_batch_in_torchvision(mixer, monkeypatch):
    from torchvision.transforms import v2

    # torch's distributions check their arguments by default, until anything in this process imports torch._dynamo
    # (a compiled run's test, on the same xdist worker), which turns the check off for the whole process: a run has
    # it on, as here
    monkeypatch.setattr(torch.distributions.Distribution, "_validate_args", True)

    from vit.training.options import MIN_MIX_ALPHA

    images, labels = torch.rand(4, 3, 8, 8), torch.tensor([0, 1, 2, 0])
    mixed, soft = getattr(v2, mixer)(alpha=MIN_MIX_ALPHA, num_classes=3)(images, labels)
    assert torch.isfinite(mixed).all() and torch.allclose(soft.sum(1), torch.ones(4))
    with pytest.raises(ValueError, match="Dirichlet"):  # what a smaller alpha did at the run's start
        getattr(v2, mixer)(alpha=1e-300, num_classes=3)(images, labels)


def test_the_page_launches_a_run_with_the_recipe_fields(folders):  # noqa: F811
    images, runs_dir = folders
    at = AppTest.from_file(PAGE).run(timeout=TIMEOUT)
    assert not at.exception
    assert at.selectbox(key="train_precision").value == "auto" and not at.checkbox(key="train_compile").value
    fill_tiny_run(at, images, "mixed")
    for field in ("mixup", "cutmix", "mix_prob", "random_erasing", "drop_path"):
        at.number_input(key=f"train_{field}").set_value(RECIPE[field])
    at.text_input(key="train_time_budget").set_value("1.5h")  # with the 2 planning epochs and 1 more
    at.number_input(key="train_epochs").set_value(3)
    at.number_input(key="train_warmup_epochs").set_value(2.0)
    at.selectbox(key="train_precision").set_value("fp32")
    at.checkbox(key="train_compile").check()
    at = submit(at)
    assert not at.exception and errors(at) == [], errors(at)
    manager = RunManager(runs_dir)
    try:
        record = json.loads((runs_dir / ".launch" / "mixed" / "launch.json").read_text())
        command = record["sessions"][0]["command"]
        args = parse_args([*command[command.index("vit.train") + 1:], "--device", "cpu"])
        assert (args.mixup, args.cutmix, args.mix_prob, args.random_erasing, args.drop_path, args.precision,
                args.compile) == (0.8, 1.0, 0.5, 0.25, 0.1, "fp32", True)
        assert (args.time_budget, args.epochs, args.warmup_epochs) == (5400.0, 3, 2.0)
    finally:
        if manager.get("mixed").active:
            manager.stop("mixed")
        deadline = time.time() + TIMEOUT
        while manager.get("mixed").active and time.time() < deadline:
            time.sleep(0.5)
