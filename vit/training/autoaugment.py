"""AutoAugment (Cubuk et al. 2019) with its CIFAR-10 policy on uint8 batches, each image drawing its own sub-policy.

torchvision's ``v2.AutoAugment(AutoAugmentPolicy.CIFAR10)`` augments one image: it draws one of 25 sub-policies,
then applies each of its two ops with the op's probability, at its magnitude bin of 10, the sign flipped half the
time for a signed op. Here every image of a batch draws the same way, and the ops run batched through
``vit.training.image_ops.apply_ops`` (torchvision's arithmetic; ``tests/test_train_autoaugment.py`` holds the images
equal to torchvision's own transform's for the same draws). Lee et al. 2021 train their CIFAR ViTs with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vit.training.image_ops import OpSpace, _v2, apply_ops

NUM_BINS = 10  # AutoAugment's magnitude bins (torchvision's forward asks its space for 10)


@dataclass(frozen=True)
class AutoAugmentTable:
    """The policy's sub-policies as tensors: for sub-policy k and step j, op ``ops[k, j]`` of ``space``, applied
    with probability ``probs[k, j]`` at bin ``bins[k, j]`` (0 for ops without a magnitude)."""

    space: OpSpace
    ops: torch.Tensor  # (25, 2) long
    probs: torch.Tensor  # (25, 2) float32, as torchvision compares its float32 draw with them
    bins: torch.Tensor  # (25, 2) long


def autoaugment_table(height: int, width: int, device: torch.device | str = "cpu") -> AutoAugmentTable:
    """torchvision's CIFAR-10 AutoAugment policy and op space for images of this size, read from the library."""
    v2 = _v2()
    transform = v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10)
    space = transform._AUGMENTATION_SPACE
    rows, signed = [], []
    for magnitudes_fn, is_signed in space.values():
        values = magnitudes_fn(NUM_BINS, height, width)
        rows.append(torch.zeros(NUM_BINS, dtype=torch.float64) if values is None else values.double())
        signed.append(is_signed)
    names = tuple(space)
    policies = transform._policies
    ops = torch.tensor([[names.index(name) for name, _, _ in policy] for policy in policies])
    probs = torch.tensor([[p for _, p, _ in policy] for policy in policies], dtype=torch.float32)
    bins = torch.tensor([[b or 0 for _, _, b in policy] for policy in policies])
    return AutoAugmentTable(OpSpace(names, torch.stack(rows).to(device), torch.tensor(signed, device=device)),
                            ops.to(device), probs.to(device), bins.to(device))


def draw_autoaugment(table: AutoAugmentTable, batch: int, device: torch.device | str,
                     generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per image: its sub-policy ``(B,)``, whether each of its two ops applies ``(B, 2)`` and whether each
    magnitude's sign is flipped ``(B, 2)`` (``rand <= p`` and ``rand <= 0.5``, as torchvision draws them)."""
    policy = torch.randint(len(table.ops), (batch,), device=device, generator=generator)
    applies = torch.rand(batch, 2, device=device, generator=generator) <= table.probs[policy]
    flips = torch.rand(batch, 2, device=device, generator=generator) <= 0.5
    return policy, applies, flips


def apply_autoaugment(images: torch.Tensor, table: AutoAugmentTable, policy: torch.Tensor, applies: torch.Tensor,
                      flips: torch.Tensor, by_subset: bool | None = None) -> torch.Tensor:
    """Image i of a uint8 batch ``(B, C, H, W)`` through sub-policy ``policy[i]``: each step's op where
    ``applies[i, j]``, its magnitude negated where ``flips[i, j]`` and the op is signed. ``by_subset`` as
    ``apply_ops``'s (default: on the CPU)."""
    for step in range(2):
        op = table.ops[policy, step]
        magnitude = table.space.magnitudes[op, table.bins[policy, step]]
        magnitude = torch.where(table.space.signed[op] & flips[:, step], -magnitude, magnitude)
        out = apply_ops(images, table.space, op, magnitude, by_subset)
        images = torch.where(applies[:, step].view(-1, 1, 1, 1), out, images)
    return images
