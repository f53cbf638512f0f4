"""Which of a run's weights the Train page opens in the explorer: ``best.pt`` (the epoch with the highest validation
accuracy, the first on a tie) and ``last.pt`` (the latest saved epoch), each named with its epoch and accuracy.

Issue 76: "Open in explorer" opened best.pt without a word; after 60 epochs on a tiny validation split that was
epoch 1's weights. Both are offered, each saying which weights it is. The epoch and the accuracy are the ones the
checkpoint itself records (its metadata), not read off metrics.jsonl: a resume can roll the metrics back past the
epoch best.pt was saved at.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

from vit.checkpoint import CheckpointError, read_checkpoint_payload
from vit.core.runfiles import BEST_CHECKPOINT, LAST_CHECKPOINT

WHICH = {"best": BEST_CHECKPOINT, "last": LAST_CHECKPOINT}


@dataclass(frozen=True)
class SavedWeights:
    """One of a run's checkpoints: ``which`` ("best" or "last"), its path, the epochs trained when it was saved and
    its validation accuracy (None where the checkpoint does not record them)."""

    which: str
    path: Path
    epoch: int | None
    val_acc: float | None

    @property
    def label(self) -> str:
        """'best weights: epoch 1, val acc 12.5 %', as the link to open them says ('best weights' alone where the
        checkpoint records neither)."""
        known = ([] if self.epoch is None else [f"epoch {self.epoch}"]) + \
            ([] if self.val_acc is None else [f"val acc {100 * self.val_acc:.1f} %"])
        return f"{self.which} weights" + (f": {', '.join(known)}" if known else "")

    @property
    def help(self) -> str:
        """What these weights are, for the link's tooltip."""
        if self.which == "best":
            return (f"{self.path.name}: the weights of the epoch with the highest validation accuracy (the first on a "
                    "tie). On a small validation split an early epoch can win by chance.")
        return f"{self.path.name}: the latest saved weights (saved at the run's end, and while it trains)."


def _number(value: object, kind: type) -> int | float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return kind(value) if kind is float or isinstance(value, int) else None


@functools.lru_cache(maxsize=64)
def _recorded(path: str, mtime_ns: int, size: int) -> tuple[int | None, float | None]:
    """(epochs, val_acc) from a checkpoint's metadata, per version of the file (the page asks every few seconds)."""
    try:
        metadata = read_checkpoint_payload(path, mmap=True).get("metadata") or {}
    except CheckpointError:
        return None, None
    if not isinstance(metadata, dict):
        return None, None
    return _number(metadata.get("epochs"), int), _number(metadata.get("val_acc"), float)


def saved_weights(run_dir: str | os.PathLike) -> list[SavedWeights]:
    """The run's best and last weights that exist, best first, each with the epoch and accuracy it records."""
    found = []
    for which, name in WHICH.items():
        path = Path(run_dir) / name
        try:
            stat = path.stat()
        except OSError:
            continue
        if not path.is_file():
            continue
        epoch, val_acc = _recorded(str(path), stat.st_mtime_ns, stat.st_size)
        found.append(SavedWeights(which, path, epoch, val_acc))
    return found
