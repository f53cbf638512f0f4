"""What the training loop does to keep a GPU busy, and that none of it changes what a run computes."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from helpers import TINY_TRAIN, make_image_folder
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from vit.checkpoint import read_checkpoint_payload
from vit.train import main
from vit.training import options
from vit.training.data import Dataset, Split
from vit.training.session import global_batch
from vit.training.trainer import Trainer, resolve_compile_mode

TINY = TINY_TRAIN
TIMING_KEYS = {"epoch_seconds", "images_per_second"}


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("data") / "colours", per_class=12)


def run(images: Path, out: Path, *extra: str) -> tuple[list[dict], dict]:
    """Train a tiny run; its metrics without timing, and last.pt's payload."""
    argv = ["--dataset", f"folder:{images}", "--out", str(out), "--cache-dir", str(images.parent / "cache"),
            "--batch-size", "4", "--epochs", "3", *TINY, *extra]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in rows], read_checkpoint_payload(
        out / "last.pt")


def test_syncing_the_statistics_every_few_steps_gives_the_same_run(images, tmp_path):
    # The running sums stay on the device between syncs; the same float64 additions in the same
    # order, so the metrics, the weights and the saved progress are bit-identical.
    every_step, every_fourth = tmp_path / "every", tmp_path / "fourth"
    recipe = ["--ema", "0.9", "--mixup", "0.4"]
    rows_a, payload_a = run(images, every_step, *recipe, "--sync-every", "1")
    rows_b, payload_b = run(images, every_fourth, *recipe, "--sync-every", "4")
    assert rows_a == rows_b
    assert all(torch.equal(payload_a["state_dict"][k], payload_b["state_dict"][k]) for k in payload_a["state_dict"])
    progress_a, progress_b = (p["training_state"]["progress"] for p in (payload_a, payload_b))
    assert {k: v for k, v in progress_a.items() if k not in ("elapsed", "epoch_seconds")} == \
        {k: v for k, v in progress_b.items() if k not in ("elapsed", "epoch_seconds")}


def tiny_trainer(*extra: str) -> Trainer:
    args = options.parse_args(["--dataset", "folder:unused", "--out", "unused-run", *TINY, "--batch-size", "4",
                             *extra], check_out=False)
    options.resolve_model(args, num_classes=2)
    images = torch.randint(0, 256, (16, 3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    split = Split(images, torch.arange(16) % 2)
    return Trainer(options.settings_from_args(args), Dataset("tiny", ["a", "b"], split, split, (0.5,) * 3,
                                                           (0.25,) * 3, True), None)


def test_ema_update_is_torchs_averaged_model_update():
    torch.manual_seed(0)
    trainer = tiny_trainer("--ema", "0.8")
    reference = AveragedModel(trainer.model, multi_avg_fn=get_ema_multi_avg_fn(0.8))
    for step in range(4):
        trainer.step(torch.arange(4 * step % 16, 4 * step % 16 + 4))
        reference.update_parameters(trainer.model)
        for ours, theirs in zip(trainer.ema.module.parameters(), reference.module.parameters(), strict=True):
            assert torch.equal(ours, theirs)
    assert int(trainer.ema.n_averaged) == int(reference.n_averaged) == 4
    assert trainer.ema.n_averaged.device == trainer.device  # the counter lives with the weights


def test_ema_warmup_is_timms_model_ema_v3_with_warmup():
    # Without a warmup the first weights keep decay^steps of the average: 10 % after the first H100 run's 11,397
    # steps at 0.9998, whose validated EMA weights reached 78 %. timm's ModelEmaV3(use_warmup=True) is the reference,
    # updated with step = the number of optimizer steps so far, as timm's train.py calls it.
    from timm.utils.model_ema import ModelEmaV3

    torch.manual_seed(0)
    trainer = tiny_trainer("--ema", "0.9", "--ema-warmup")
    reference = ModelEmaV3(trainer.model, decay=0.9, use_warmup=True)
    for step in range(1, 7):
        trainer.step(torch.arange(4 * step % 16, 4 * step % 16 + 4))
        reference.update(trainer.model, step=step)
        for ours, theirs in zip(trainer.ema.module.parameters(), reference.module.parameters(), strict=True):
            torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-7)
    assert reference.get_decay(6) < 0.9 == reference.get_decay(60)  # the warmup took effect, and ends at the cap


def test_ema_warmup_without_ema_is_refused_with_one_line(images, tmp_path, capsys):
    assert main(["--dataset", f"folder:{images}", "--out", str(tmp_path / "run"), "--ema-warmup"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "--ema-warmup needs --ema DECAY (the decay it warms up to)")


def test_step_returns_its_statistics_on_the_device_without_waiting():
    trainer = tiny_trainer()
    stats = trainer.step(torch.arange(4))
    assert stats.shape == (2,) and stats.dtype == torch.float64 and stats.device == trainer.device
    assert 0 <= stats[1] <= 4 and stats[0] > 0  # (mean loss, hits)


@pytest.mark.parametrize(("seconds", "writes"), [("0", 3), ("1e6", 2)])
def test_last_pt_is_written_after_the_first_and_last_epoch_and_then_by_time(images, tmp_path, monkeypatch, seconds,
                                                                           writes):
    saved = []
    original = Trainer._save_last
    monkeypatch.setattr(Trainer, "_save_last", lambda self: (saved.append(self.progress.epoch), original(self))[1])
    rows, payload = run(images, tmp_path / "run", "--checkpoint-seconds", seconds)
    assert len(rows) == 3 and len(saved) == writes
    assert saved[0] == 1 and saved[-1] == 3
    assert payload["training_state"]["progress"]["epoch"] == 3


def test_scale_batch_multiplies_the_batch_by_the_processes_and_the_rates_by_their_square_root():
    trainer = tiny_trainer("--scale-batch", "--lr", "1e-3")
    settings = trainer.settings
    assert global_batch(settings, 1) == (4, 1.0)  # one process: nothing changes
    assert global_batch(settings, 4) == (16, 2.0)
    assert global_batch(settings, 2) == (8, math.sqrt(2))
    unscaled = tiny_trainer("--lr", "1e-3").settings
    assert global_batch(unscaled, 4) == (4, 1.0)  # --batch-size is then the global batch


def test_compile_mode_and_speed_options_may_change_on_resume_but_not_scale_batch():
    assert {"compile_mode", "sync_every", "checkpoint_seconds"} <= set(options.RESUME_OPTIONS)
    assert "scale_batch" not in options.RESUME_OPTIONS


def test_compile_mode_without_compile_is_refused_with_one_line(images, tmp_path, capsys):
    argv = ["--dataset", f"folder:{images}", "--out", str(tmp_path / "run"), *TINY, "--compile-mode",
            "reduce-overhead"]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().endswith("--compile-mode reduce-overhead needs --compile")
    assert not (tmp_path / "run").exists()


# -- compiled training (--compile) ----------------------------------------------------------------


def test_compile_mode_auto_is_cuda_graphs_on_one_gpu_and_default_elsewhere():
    # Issue 89: a small ViT's step on a GPU is launch-bound; CUDA graphs took it from 21.3 to 8.9 ms on an H100.
    assert options.parse_args(["--dataset", "folder:x", "--out", "y"], check_out=False).compile_mode == "auto"
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert resolve_compile_mode("auto", cuda, 1) == "reduce-overhead"
    assert resolve_compile_mode("auto", cpu, 1) == "default"
    assert resolve_compile_mode("auto", cuda, 2) == "default"  # DDP's gradient hooks: not captured
    for mode in ("default", "reduce-overhead", "max-autotune"):  # what is asked is kept
        assert resolve_compile_mode(mode, cuda, 1) == resolve_compile_mode(mode, cpu, 4) == mode


@pytest.mark.scenario
def test_a_compiled_cpu_run_records_the_default_mode_and_an_eager_run_none(images, tmp_path):
    """Long (~13 s of CPU): inductor spawns the C++ compiler (a real process, so a scenario, out of the lane)."""
    compiled, eager = tmp_path / "compiled", tmp_path / "eager"
    run(images, compiled, "--compile")
    run(images, eager)
    assert json.loads((compiled / "config.json").read_text())["compile_mode"] == "default"
    assert json.loads((eager / "config.json").read_text())["compile_mode"] is None
    assert "mode default" in (compiled / "train.log").read_text()


def test_a_compiled_forward_runs_as_one_graph_even_where_dynamo_cannot_read_the_hook_table(monkeypatch):
    # torch 2.11's dynamo could not trace ContextVar.get: a graph break at every hook point, then a recompile per
    # block (each has its own drop-path rate) until the limit, made a compiled cifar-m step 2.5x slower than eager
    # on an H100. The shim stands in for such a torch: any compiled read of the hook table breaks the graph.
    import torch._dynamo

    from vit.model import ViT, ViTConfig, hooks

    # torch 2.11 on the H100 then broke at every read of the relevance rules too (norms, attention, MLP): both
    # context variables, wherever a module of the engine holds them.
    for var in (hooks._hooks, hooks._rules):
        shim = type("Untraceable", (), {"get": staticmethod(torch._dynamo.disable(var.get)),
                                        "set": staticmethod(var.set), "reset": staticmethod(var.reset)})()
        for module in [m for name, m in sys.modules.items() if name.startswith("vit.")]:
            for attribute, value in list(vars(module).items()):
                if value is var:
                    monkeypatch.setattr(module, attribute, shim)
    model = ViT(ViTConfig(image_size=16, patch_size=4, hidden_size=32, num_layers=3, num_heads=2, mlp_size=64,
                          drop_path=0.1)).train()
    explained = torch._dynamo.explain(model)(torch.randn(2, 3, 16, 16))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    with model.hooks([("blocks.0.hook_resid_post", lambda x, hook: x * 0)]):  # eager forwards still read it
        assert not model(torch.randn(2, 3, 16, 16))[0].isnan().any()
        assert torch.equal(model.blocks[0].hook_resid_post(torch.ones(1)), torch.zeros(1))


@pytest.mark.scenario
def test_the_compiled_augmentation_takes_a_batch_of_another_size():
    """Long (~10 s of CPU): inductor spawns the C++ compiler (a real process, so a scenario, out of the lane)."""
    # With dynamic shapes the second size failed to trace (torch.randint of a symbolic batch size): bench_gpu's
    # ViT-B/16 row after its CIFAR rows on an H100 (torch 2.11), and here on torch 2.15's CPU.
    from vit.training.data import BatchAugment
    from vit.training.trainer import compiled_augmentation

    plain = BatchAugment("crop")
    augment = compiled_augmentation(plain, "default")
    for batch, size in ((4, 8), (3, 8), (2, 12)):
        plain.prepare(size, size, "cpu")
        images = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8)
        assert augment(images).shape == images.shape


def test_the_trainer_builds_the_augmentation_space_before_anything_is_compiled():
    # Built inside a CUDA-graph replay (--compile-mode reduce-overhead), its tensors were overwritten by the next
    # replay ("accessing tensor output of CUDAGraphs that has been overwritten", H100, torch 2.11).
    trainer = tiny_trainer("--augment", "trivialaugment")
    space = trainer.augment._spaces[(8, 8, torch.device("cpu"))]  # the data's size, where the batches are
    assert trainer.augment.prepare(8, 8, "cpu") is space


def test_mix_prob_mixes_that_share_of_the_batches_and_leaves_the_others_their_labels():
    # Lee et al. 2021 (the 93.6 % ViT of cifar-m's shape) mix half the batches; DeiT every batch (the default).
    torch.manual_seed(0)
    images, labels = torch.rand(4, 3, 8, 8), torch.tensor([0, 1, 0, 1])
    for share, low, high in ((1.0, 200, 200), (0.5, 80, 120), (0.0, 0, 0)):
        trainer = tiny_trainer("--mixup", "0.4", "--cutmix", "1.0", "--mix-prob", str(share))
        mixed = 0
        for _ in range(200):
            out, targets = trainer.mixer(images, labels)
            if targets.ndim == 2:  # soft targets: a mixed batch
                mixed += 1
            else:
                assert torch.equal(out, images) and torch.equal(targets, labels)
        assert low <= mixed <= high, (share, mixed)


def test_random_erasing_sets_one_box_of_torchvisions_sizes_per_chosen_image_to_the_mean():
    from torchvision.transforms import v2

    from vit.training.data import random_erasing

    torch.manual_seed(0)
    images = torch.rand(400, 3, 32, 32) + 1  # never 0 before erasing
    out = random_erasing(images, 1.0)
    erased = out == 0
    assert torch.equal(erased[:, :1].expand_as(erased), erased)  # the same box in every channel
    box = erased[:, 0]  # (B, H, W)
    rows, cols = box.any(2), box.any(1)
    h, w = rows.sum(1), cols.sum(1)
    assert torch.equal(box.sum((1, 2)), h * w)  # one rectangle
    assert torch.equal(out[~erased], images[~erased])  # nothing else changes
    assert (h * w > 0).float().mean() > 0.95  # a box fits at nearly every try on 32 px, as torchvision's does
    # torchvision's own box rule, drawn 400 times: the same range of areas (2-33 % of 1,024 pixels, sides rounded).
    reference = torch.tensor([v2.RandomErasing.get_params(images[0], scale=(0.02, 0.33), ratio=(0.3, 3.3),
                                                            value=[0])[2:4] for _ in range(400)])
    ours, theirs = (h * w)[h * w > 0].float(), reference.prod(1).float()
    assert ours.min() >= 16 and ours.max() <= 380 and theirs.min() >= 16 and theirs.max() <= 380
    assert abs(ours.mean() - theirs.mean()) < 0.1 * theirs.mean()
    assert abs(ours.median() - theirs.median()) < 0.15 * theirs.median()
    half = (random_erasing(images, 0.5) == 0).flatten(1).any(1).float().mean()
    assert 0.4 < half < 0.6
    assert torch.equal(random_erasing(images, 0.0), images)


def test_a_step_erases_its_normalised_batch_with_the_runs_probability(monkeypatch):
    from vit.training import trainer as trainer_module

    seen = []
    real = trainer_module.random_erasing
    monkeypatch.setattr(trainer_module, "random_erasing", lambda x, p: seen.append((x.shape, p)) or real(x, p))
    tiny_trainer("--random-erasing", "0.25").step(torch.arange(4))
    tiny_trainer().step(torch.arange(4))  # off by default
    assert seen == [(torch.Size([4, 3, 8, 8]), 0.25)]
