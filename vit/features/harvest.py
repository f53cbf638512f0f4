"""A layer's residual stream, every token of every image, streamed in bounded memory.

The activations are read at the model's own hook point (``blocks.{l}.hook_resid_post``, the stream after block
``l + 1`` counted from 1) on its one forward, which stops there: the blocks after it are not run. They reach the
trainer through ``ShuffleBuffer``, which holds at most ``capacity`` rows and hands out random batches (SAELens's
mixing buffer: fill, shuffle, give out half, refill), so neighbouring tokens of one image are spread over many
batches and no dataset's worth of activations is ever in memory.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import torch
from torch import Tensor

from vit.checkpoint import Checkpoint
from vit.core.images import open_image
from vit.core.inference import preprocess
from vit.training.specs import image_files as data_image_files

MAX_IMAGE_PIXELS = 40_000_000  # as the explorer's uploads: a decompression bomb in the folder is one line


def image_files(root: Path) -> list[Path]:
    """Every image file under ``root`` (any depth), sorted; ValueError when there is none."""
    if not root.is_dir():
        raise ValueError(f"--data {root} is not a folder; give a folder of images (any depth)")
    files = data_image_files(root)
    if not files:
        raise ValueError(f"no images under {root}; give a folder of .jpg/.png images")
    return files


def split_files(files: Sequence[Path], train: int, holdout: int, seed: int) -> tuple[list[Path], list[Path]]:
    """A seeded shuffle of ``files`` split into up to ``train`` training and ``holdout`` held-out images, disjoint.

    With fewer files than asked for, a fifth (at least one) is held out and the rest trains.
    """
    if len(files) < 2:
        raise ValueError(f"{len(files)} image(s): at least 2 are needed, one to train on and one to hold out")
    order = list(files)
    random.Random(seed).shuffle(order)
    held = min(holdout, max(1, len(order) // 5)) if len(order) < train + holdout else holdout
    return order[held:held + train], order[:held]


def split_record(train: Sequence[Path], held: Sequence[Path], root: Path) -> dict:
    """``split_files``'s result as JSON (paths relative to ``root``), for a resume to read the same images."""
    return {"train": [p.relative_to(root).as_posix() for p in train],
            "held_out": [p.relative_to(root).as_posix() for p in held]}


def read_split(record: object, root: Path) -> tuple[list[Path], list[Path]]:
    """``split_record``'s JSON back as ``(train, held_out)`` paths under ``root``; ValueError in one line for
    anything else (a run folder may come from anywhere: no path may lead out of ``root``)."""
    from vit.core.runfiles import lies_inside

    parts = [record.get(key) if isinstance(record, dict) else None for key in ("train", "held_out")]
    if not all(isinstance(part, list) and part and all(isinstance(name, str) for name in part) for part in parts):
        raise ValueError("does not hold lists of training and held-out file names")
    for name in (name for part in parts for name in part):
        if Path(name).is_absolute() or not lies_inside(root / name, root):
            raise ValueError(f"names {name[:100]!r}, which is not a file under {root}")
    train, held = ([root / name for name in part] for part in parts)
    return train, held


def image_batches(checkpoint: Checkpoint, files: Sequence[Path], batch_size: int, device: torch.device
                  ) -> Iterator[Tensor]:
    """The images of ``files`` as the model sees them (its own preprocessing), ``(B, C, H, W)`` batches in order."""
    for start in range(0, len(files), batch_size):
        images = [open_image(path, max_pixels=MAX_IMAGE_PIXELS) for path in files[start:start + batch_size]]
        yield preprocess(images, checkpoint.preprocessing).to(device)


class _Stop(Exception):
    """Raised by the hook once it has the layer's output: the blocks after it are not run."""


@torch.no_grad()
def layer_tokens(model: torch.nn.Module, images: Tensor, hook_name: str) -> Tensor:
    """The tensor at ``hook_name`` for ``images`` ``(B, C, H, W)`` -> ``(B, T, D)``, the forward stopped there."""
    found: list[Tensor] = []

    def keep(x: Tensor, hook) -> None:
        found.append(x)
        raise _Stop

    try:
        model.run_with_hooks(images, [(hook_name, keep)])
    except _Stop:
        pass
    return found[0]


class ShuffleBuffer:
    """At most ``capacity`` rows of width ``d``; ``add`` returns the random batches of ``batch_size`` rows that
    fall out once it is full, ``drain`` the rest at the end (last batch possibly smaller)."""

    def __init__(self, capacity: int, d: int, batch_size: int, generator: torch.Generator,
                 device: torch.device | str = "cpu") -> None:
        if capacity < 2 * batch_size:
            raise ValueError(f"the buffer ({capacity:,} rows) must hold at least two batches of {batch_size:,}")
        self.rows = torch.empty(capacity, d, device=device)
        self.size, self.batch_size, self.generator = 0, batch_size, generator

    def add(self, rows: Tensor) -> list[Tensor]:
        out: list[Tensor] = []
        while len(rows):
            take = min(len(rows), len(self.rows) - self.size)
            self.rows[self.size:self.size + take] = rows[:take]
            self.size += take
            rows = rows[take:]
            if self.size == len(self.rows):
                out += self._give_out(len(self.rows) // 2)
        return out

    def drain(self) -> list[Tensor]:
        return self._give_out(self.size)

    def _give_out(self, count: int) -> list[Tensor]:
        """Shuffle the buffer, hand out ``count`` rows (whole batches while at least one is left), keep the rest."""
        order = torch.randperm(self.size, generator=self.generator).to(self.rows.device)
        self.rows[:self.size] = self.rows[order]
        given = self.rows[:count].clone()
        self.rows[:self.size - count] = self.rows[count:self.size].clone()
        self.size -= count
        return list(given.split(self.batch_size))


def activation_batches(model: torch.nn.Module, batches: Iterable[Tensor], hook_name: str, buffer: ShuffleBuffer
                       ) -> Iterator[Tensor]:
    """Shuffled ``(batch_size, D)`` rows of every token's activation at ``hook_name``, over all ``batches`` of
    images, through ``buffer``."""
    for images in batches:
        tokens = layer_tokens(model, images, hook_name)  # (B, T, D)
        yield from buffer.add(tokens.reshape(-1, tokens.shape[-1]).float())
    yield from buffer.drain()


def token_rows(token_batches: Iterable[Tensor], buffer: ShuffleBuffer) -> Iterator[Tensor]:
    """``activation_batches`` for activations harvested elsewhere (a Ray cluster's actors): each ``(B, T, D)``
    batch, in file order, through ``buffer``. The buffer's output depends on the rows' order only, not on how they
    are split into batches, so the same files give the same shuffled batches as the local harvest."""
    for tokens in token_batches:
        yield from buffer.add(tokens.reshape(-1, tokens.shape[-1]).float())
    yield from buffer.drain()
