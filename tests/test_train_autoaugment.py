"""``--augment autoaugment``: torchvision's own ``v2.AutoAugment(AutoAugmentPolicy.CIFAR10)`` is the reference."""

from __future__ import annotations

import pytest
import torch
from torchvision.transforms import v2

from vit.training.autoaugment import apply_autoaugment, autoaugment_table, draw_autoaugment
from vit.training.data import BatchAugment

BLENDS = ("Color", "Contrast", "Sharpness")  # torchvision's float32 blend may differ by one grey level (test_data)


def replay_torchvision_draws(transform: v2.AutoAugment, height: int, width: int) -> tuple[int, list, list]:
    """The sub-policy, applied ops and sign flips that ``transform.forward`` draws next from torch's global
    generator, in its order: one randint, then per op a rand and, for an applied signed op with magnitudes, one
    more."""
    k = int(torch.randint(len(transform._policies), ()))
    applies, flips = [], []
    for name, probability, _ in transform._policies[k]:
        applied = bool(torch.rand(()) <= probability)
        magnitudes_fn, signed = transform._AUGMENTATION_SPACE[name]
        flip = applied and magnitudes_fn(10, height, width) is not None and signed and bool(torch.rand(()) <= 0.5)
        applies.append(applied)
        flips.append(flip)
    return k, applies, flips


def test_autoaugment_gives_torchvisions_images_for_torchvisions_draws():
    transform = v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10)
    n = 300
    images = torch.randint(0, 256, (n, 3, 16, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    images[::7] = images[::7] // 4 + 60  # low contrast: autocontrast and equalize change them
    expected, policy, applies, flips = [], [], [], []
    for i in range(n):
        torch.manual_seed(i)
        expected.append(transform(images[i]))
        torch.manual_seed(i)
        k, applied, flipped = replay_torchvision_draws(transform, 16, 16)
        policy.append(k)
        applies.append(applied)
        flips.append(flipped)
    table = autoaugment_table(16, 16)
    ours = apply_autoaugment(images, table, torch.tensor(policy), torch.tensor(applies), torch.tensor(flips))
    assert len(set(policy)) == 25 and 0.2 < torch.tensor(applies).double().mean() < 0.9  # every sub-policy ran
    for i in range(n):
        names = [name for (name, _, _), on in zip(transform._policies[policy[i]], applies[i], strict=True) if on]
        diff = (ours[i].int() - expected[i].int()).abs()
        if set(names) & set(BLENDS):
            assert diff.max() <= 1 and (diff > 0).double().mean() <= 0.06, (i, names)
        else:
            assert diff.max() == 0, (i, names)


def test_the_gpus_whole_batch_path_gives_the_cpus_images():
    # On a GPU every op runs on the whole batch and torch.where picks (no data-dependent shapes, compilable).
    table = autoaugment_table(32, 32)
    images = torch.randint(0, 256, (200, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    draws = draw_autoaugment(table, len(images), "cpu", torch.Generator().manual_seed(3))
    assert torch.equal(apply_autoaugment(images, table, *draws, by_subset=False),
                       apply_autoaugment(images, table, *draws, by_subset=True))


def test_the_policy_is_torchvisions_cifar10_one():
    table = autoaugment_table(32, 32)
    policies = v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10)._policies
    assert table.ops.shape == (25, 2)
    assert [[table.space.names[o] for o in row] for row in table.ops.tolist()] == [[n for n, _, _ in p]
                                                                                     for p in policies]
    assert table.probs.flatten().tolist() == pytest.approx([p for pol in policies for _, p, _ in pol])
    assert "Invert" in table.space.names  # AutoAugment's op that TrivialAugment lacks


def test_draws_follow_each_sub_policys_probabilities():
    table = autoaugment_table(32, 32)
    policy, applies, flips = draw_autoaugment(table, 200_000, "cpu", torch.Generator().manual_seed(0))
    counts = torch.bincount(policy, minlength=25).double() / len(policy)
    assert (counts - 1 / 25).abs().max() < 0.005
    rate = torch.stack([applies[policy == k].double().mean(0) for k in range(25)])
    assert (rate - table.probs.double()).abs().max() < 0.02
    assert abs(flips.double().mean() - 0.5) < 0.01


def test_batch_augment_autoaugment_augments_each_image_on_its_own():
    images = torch.randint(0, 256, (1, 3, 32, 32), dtype=torch.uint8).expand(64, -1, -1, -1).contiguous()
    torch.manual_seed(0)
    out = BatchAugment("autoaugment")(images)
    assert out.shape == images.shape and out.dtype == torch.uint8
    assert len({tuple(o.flatten().tolist()) for o in out}) > 40
