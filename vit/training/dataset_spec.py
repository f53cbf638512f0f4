"""What ``--dataset`` names, read without torch: ``vit.train`` checks it with the other arguments before torch loads
(``vit.training.options``), and ``vit.training.data`` loads what it names."""

from __future__ import annotations

BUILTIN_DATASETS = ("cifar10", "cifar100", "mnist", "fashion-mnist")


class DataError(ValueError):
    """A dataset that cannot be used as asked; the message says what to do."""


def parse_dataset(spec: str) -> tuple[str, str]:
    """``'cifar10'`` -> ('builtin', 'cifar10'); ``'folder:PATH'`` -> ('folder', PATH)."""
    if spec.startswith("folder:"):
        path = spec[len("folder:"):]
        if not path:
            raise DataError("--dataset folder: needs a path, e.g. folder:data/my-images")
        return "folder", path
    if spec in BUILTIN_DATASETS:
        return "builtin", spec
    raise DataError(f"unknown dataset {spec!r}; use one of {', '.join(BUILTIN_DATASETS)} or folder:PATH")
