"""Repeated augmentation (``--repeat-aug K``): the epoch's order against the authors' own samplers, vendored
unchanged in tests/reference/ (DeiT's ``samplers.py``, Lee et al.'s ``utils/sampler.py``), and the trainer's use
of it; uniform drop path as Lee et al.'s one shared ``DropPath``."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import TINY_TRAIN
from reference.deit.samplers import RASampler as DeitRASampler
from reference.spt_lsa_vit.sampler import RASampler as LeeRASampler

from vit.core.cli import UsageError
from vit.model import ViT, ViTConfig
from vit.train import main
from vit.training import options
from vit.training.data import Dataset, Split
from vit.training.sampling import epoch_order, steps_per_epoch
from vit.training.trainer import Trainer

TINY = TINY_TRAIN


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("epoch", [0, 5])
def test_copies_are_deits_rasampler_for_each_process(world, epoch):
    # DeiT's sampler asks torch.distributed for the world unless told: here it is told, per rank. Its epoch seeds
    # the shuffle; ours takes the seed it is given (the trainer's mixes the run's seed and the epoch).
    n, repeats, batch = 1000, 3, 24
    for rank in range(world):
        theirs = DeitRASampler(list(range(n)), num_replicas=world, rank=rank, shuffle=True, num_repeats=repeats)
        theirs.set_epoch(epoch)
        ours = epoch_order(n, batch, seed=epoch, world=world, rank=rank, repeats=repeats, sampler="copies").tolist()
        assert len(ours) == steps_per_epoch(n, batch, repeats) * batch // world
        cut = list(theirs)  # DeiT cuts every process's list to floor(n / 256) * 256 / world entries: one pass
        assert len(cut) == 768 // world and ours[:len(cut)] == cut
        theirs.num_selected_samples = theirs.num_samples  # the same sampler without its cut: all K copies
        assert ours == list(theirs)[:len(ours)]


def test_copies_train_at_the_same_step_on_different_processes():
    # DeiT's point: "each augmented version of a sample will be visible to a different process".
    n, repeats, batch, world = 60, 3, 12, 3
    shares = [epoch_order(n, batch, 7, world, rank, repeats, "copies").view(-1, batch // world) for rank in
              range(world)]
    for step in range(steps_per_epoch(n, batch, repeats)):
        for share in shares:
            for image in share[step].tolist():
                others = [r for r, s in enumerate(shares) if image in s[step].tolist()]
                assert others == list(range(world)), (step, image, others)


@pytest.mark.parametrize("seed", [0, 3])
def test_passes_are_lee_et_als_rasampler_batches(seed):
    # Their main.py: RASampler(len(train_dataset), args.batch_size, 1, args.ra, shuffle=True, drop_last=True), its
    # permutations numpy's (np.random.permutation on the global stream, which their script seeds).
    n, batch, repeats = 50, 8, 3
    np.random.seed(seed)
    theirs = list(LeeRASampler(n, batch, 1, repeats, shuffle=True, drop_last=True))
    ours = epoch_order(n, batch, seed=seed, repeats=repeats, sampler="passes").view(-1, batch).tolist()
    assert len(ours) == len(theirs) == n * repeats // batch
    assert ours == theirs
    counts = np.bincount(np.concatenate(theirs), minlength=n)  # every image drawn K times, bar the last batch's cut
    assert counts.max() == repeats and counts.sum() == len(theirs) * batch


def test_passes_under_several_processes_deal_each_of_their_batches_round():
    n, batch, repeats, world = 50, 8, 3, 2
    np.random.seed(1)
    theirs = list(LeeRASampler(n, batch, 1, repeats, shuffle=True, drop_last=True))
    shares = [epoch_order(n, batch, 1, world, rank, repeats, "passes").view(-1, batch // world) for rank in
              range(world)]
    for step, batch_indices in enumerate(theirs):
        assert sorted(torch.cat([s[step] for s in shares]).tolist()) == sorted(batch_indices)


def test_one_pass_is_unchanged_by_the_option():
    # --repeat-aug 1 (the default) keeps the order runs had before it: one torch.randperm, sharded by batch.
    generator = torch.Generator().manual_seed(11)
    permutation = torch.randperm(30, generator=generator)[:28].view(7, 4)
    for sampler in ("passes", "copies"):
        assert torch.equal(epoch_order(30, 4, 11, 2, 1, 1, sampler), permutation[:, 1::2].reshape(-1))


def tiny_trainer(*extra: str) -> Trainer:
    args = options.parse_args(["--dataset", "folder:unused", "--out", "unused-run", *TINY, "--batch-size", "4",
                               *extra])
    options.resolve_model(args, num_classes=2)
    images = torch.randint(0, 256, (16, 3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    split = Split(images, torch.arange(16) % 2)
    return Trainer(options.settings_from_args(args), Dataset("tiny", ["a", "b"], split, split, (0.5,) * 3,
                                                             (0.25,) * 3, True), None)


def test_an_epoch_of_repeat_aug_k_is_k_passes():
    plain, repeated = tiny_trainer("--epochs", "4"), tiny_trainer("--epochs", "4", "--repeat-aug", "3")
    assert (plain.steps_per_epoch, repeated.steps_per_epoch) == (4, 12)
    assert repeated.total_steps == 48
    order = repeated.epoch_order(0)
    assert len(order) == 48 and np.bincount(order.numpy(), minlength=16).tolist() == [3] * 16
    assert not torch.equal(repeated.epoch_order(1), order)  # a new shuffle every epoch


def test_repeat_aug_options_are_checked():
    with pytest.raises(UsageError, match="--repeat-aug: expected an integer in 1..64, got '0'"):
        options.build_parser().parse_args(["--repeat-aug", "0"])
    with pytest.raises(UsageError, match="--repeat-aug K"):
        options.parse_args(["--dataset", "folder:x", "--out", "unused-run", "--repeat-aug-sampler", "copies"])


@pytest.mark.slow
def test_a_resumed_repeat_aug_run_matches_an_uninterrupted_one(tmp_path):
    from helpers import make_image_folder

    images = make_image_folder(tmp_path / "data", per_class=12)
    common = ["--dataset", f"folder:{images}", "--cache-dir", str(tmp_path / "cache"), "--batch-size", "4", *TINY,
              "--schedule", "constant", "--warmup-epochs", "0", "--repeat-aug", "2", "--repeat-aug-sampler",
              "copies", "--augment", "autoaugment", "--attention-every", "0"]
    assert main([*common, "--out", str(tmp_path / "straight"), "--epochs", "2"]) == 0
    assert main([*common, "--out", str(tmp_path / "split"), "--epochs", "1"]) == 0
    assert main(["--resume", str(tmp_path / "split"), "--epochs", "2"]) == 0

    def rows(run):
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(x).items() if k not in ("epoch_seconds", "images_per_second")}
                for x in lines]

    assert rows("split") == rows("straight")
    status = json.loads((tmp_path / "straight" / "status.json").read_text())
    assert status["total_steps"] == 2 * (22 * 2 // 4)  # 22 training images, each twice an epoch


def test_uniform_drop_path_is_the_rate_in_every_block():
    # Lee et al.'s models/vit.py: one DropPath(stochastic_depth) that every block's two residuals share.
    uniform = ViT(ViTConfig(num_layers=4, drop_path=0.1, drop_path_schedule="uniform"))
    assert [block.drop_path_rate for block in uniform.blocks] == [0.1] * 4
    linear = ViT(ViTConfig(num_layers=4, drop_path=0.1))  # timm's: torch.linspace(0, rate, depth)
    assert [block.drop_path_rate for block in linear.blocks] == pytest.approx(torch.linspace(0, 0.1, 4).tolist())
    with pytest.raises(ValueError, match="drop_path_schedule"):
        ViTConfig(drop_path_schedule="cosine")
    args = options.parse_args(["--dataset", "folder:x", "--out", "unused-run", "--preset", "cifar-m",
                               "--drop-path-schedule", "uniform"])
    assert options.resolve_model(args, num_classes=10).drop_path_schedule == "uniform"
