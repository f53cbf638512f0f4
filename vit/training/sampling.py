"""The order in which an epoch draws the training images, for one process of ``world``.

By default an epoch is one shuffled pass. With ``--repeat-aug K`` (repeated augmentation) each image is drawn K
times an epoch, each time under its own augmentation, and the epoch is K times longer, in one of two orders:

- ``passes`` (Lee et al. 2021, github.com/aanna0701/SPT_LSA_ViT ``utils/sampler.py``, built in its ``main.py`` as
  ``RASampler(len, batch, 1, ra, shuffle=True, drop_last=True)``): K shuffled passes one after the other, so their
  "100 epochs at ra 3" are 300 passes. Their permutations come from numpy's legacy generator; so do these, and
  ``tests/test_train_sampling.py`` holds the batches equal to theirs for the same seed.
- ``copies`` (DeiT's ``RASampler``, github.com/facebookresearch/deit ``samplers.py``; Hoffer et al. 2020): each image
  of one shuffled pass K times in a row, the list dealt round the processes, so that under several processes the K
  copies train at the same step on different ones (in one process, side by side in a batch). DeiT then cuts each
  process's list to about one pass's length; here the epoch keeps all K copies, its first ``floor(N / 256) * 256 /
  world`` entries per process being DeiT's.

Every global batch is a slice of one sequence: in ``passes`` order each process takes every ``world``-th image of
it (as the default pass does); in ``copies`` order each process takes its own consecutive share, as DeiT's
per-process sampler does.
"""

from __future__ import annotations

import numpy as np
import torch

REPEAT_SAMPLERS = ("passes", "copies")


def steps_per_epoch(num_images: int, batch_size: int, repeats: int = 1) -> int:
    """Optimizer steps in an epoch of ``repeats`` draws of each of ``num_images``, whole global batches only (the
    authors' ``drop_last=True``)."""
    return num_images * repeats // batch_size


def epoch_order(num_images: int, batch_size: int, seed: int, world: int = 1, rank: int = 0, repeats: int = 1,
                sampler: str = "passes") -> torch.Tensor:
    """This process's training indices for one epoch, ``steps * batch_size / world`` of them, step after step.

    ``seed`` fixes the epoch's shuffle (the trainer mixes the run's seed with the epoch). One pass
    (``repeats`` 1) is a ``torch.randperm``, cut to whole batches, each batch dealt round the processes.
    """
    if sampler not in REPEAT_SAMPLERS:
        raise ValueError(f"unknown repeated-augmentation sampler {sampler!r}; choose one of "
                         f"{', '.join(REPEAT_SAMPLERS)}")
    steps = steps_per_epoch(num_images, batch_size, repeats)
    local = batch_size // world
    if repeats > 1 and sampler == "copies":
        return _copies(num_images, repeats, seed, world, rank)[:steps * local]
    if repeats == 1:
        order = torch.randperm(num_images, generator=torch.Generator().manual_seed(seed))
    else:
        draw = np.random.RandomState(seed % 2**32)  # numpy's legacy stream, as the authors' np.random.permutation
        order = torch.from_numpy(np.concatenate([draw.permutation(num_images) for _ in range(repeats)]))
    order = order[:steps * batch_size]
    return order.view(steps, batch_size)[:, rank::world].reshape(-1)


def _copies(num_images: int, repeats: int, seed: int, world: int, rank: int) -> torch.Tensor:
    """DeiT's ``RASampler.__iter__`` before its cut: a permutation, each entry ``repeats`` times, wrapped round to a
    multiple of ``world`` entries, and every ``world``-th one from ``rank``."""
    order = torch.randperm(num_images, generator=torch.Generator().manual_seed(seed))
    order = order.repeat_interleave(repeats)
    total = -(-num_images * repeats // world) * world
    order = torch.cat([order, order[:total - len(order)]])
    return order[rank::world]
