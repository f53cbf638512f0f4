"""What a run's arguments may say, read without torch: ``vit.train`` checks them before torch loads (``--help``, a
usage error and a ``--ray`` run's whole client never load it), and the Train page offers the same names.

- ``--augment``: the policies ``vit.training.data.BatchAugment`` implements (``AUGMENTATIONS``).
- ``--dataset``: a built-in dataset or ``folder:PATH`` (``parse_dataset``); ``vit.training.data`` loads it. A
  folder's layout (``folder_layout``: its class folders and their image files) and a new run's dataset as a whole
  (``check_run_data``) are checked here without reading an image: a Ray job's driver (``vit.runs.ray_train``) checks
  a run's dataset before any worker starts and never trains, so it need not load torch for it (with Ray's trainer,
  the other reason it did: bench/results/cpu-2026-11-30b/ray-train-jobs-no-torch-before-after.txt);
  ``vit.training.data``, ``vit.training.run`` and the commands that list a folder import these names from here.
- ``--device``: its spelling is ``torch.device``'s (c10's ``Device(const std::string&)``): a device type torch
  knows, then optionally ``:`` and an index written without a sign or leading zero that ``stoi`` reads
  (``device_spelling``; tests/test_cli_startup.py holds it to ``torch.device`` itself on a table of strings).
  ``check_device`` refuses what is not cpu or cuda; ``vit.training.distributed.parse_device`` then asks torch
  whether this machine has it.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterator
from pathlib import Path

from vit.core.cli import UsageError
from vit.core.runfiles import lies_inside

AUGMENTATIONS = ("none", "crop", "flip-crop", "trivialaugment", "randaugment", "autoaugment", "seed")
MAX_MAGNITUDE = 30  # RandAugment's default 31 magnitude bins are 0..30

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


# The device types torch.device accepts (its error lists them: "Expected one of cpu, cuda, ..."), torch 2.x.
TORCH_DEVICE_TYPES = frozenset({
    "cpu", "cuda", "ipu", "xpu", "mkldnn", "opengl", "opencl", "ideep", "hip", "ve", "fpga", "maia", "xla", "lazy",
    "vulkan", "mps", "meta", "hpu", "mtia", "privateuseone"})
SUPPORTED = ("cpu", "cuda")
MAX_INDEX = 2**31 - 1  # what std::stoi reads; torch refuses a longer index as "Could not parse device index"
_SPEC = re.compile(r"([A-Za-z_]+)(?::(0|[1-9][0-9]*))?")


def device_spelling(spec: str) -> tuple[str, int | None] | None:
    """(type, index or None) of a string ``torch.device`` accepts; None for one it refuses."""
    match = _SPEC.fullmatch(spec)
    if match is None or match[1] not in TORCH_DEVICE_TYPES:
        return None
    index = None if match[2] is None else int(match[2])
    return None if index is not None and index > MAX_INDEX else (match[1], index)


def check_device(spec: str) -> tuple[str, int | None]:
    """The (type, index) of ``--device``: auto -> ("auto", None), cpu, cuda or cuda:N; UsageError otherwise, in the
    words of ``parse_device``. Whether this machine has that device is not asked (that needs torch)."""
    if spec == "auto":
        return "auto", None
    device = device_spelling(spec)
    if device is None:
        raise UsageError(f"--device {spec!r} is not a device; use auto, cpu, cuda or cuda:N")
    if device[0] not in SUPPORTED:
        raise UsageError(f"--device {spec!r} is not supported; use auto, cpu, cuda or cuda:N")
    return device


IMAGE_EXTENSIONS = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


def list_class_folders(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def _is_image_file(path: Path) -> bool:
    """Whether ``path`` is a regular file (links followed) with an image's suffix (``IMAGE_EXTENSIONS``)."""
    return path.suffix.lower() in IMAGE_EXTENSIONS and path.is_file()


def image_files(folder: Path, root: Path | None = None) -> list[Path]:
    """Every image file under ``folder`` (any depth), sorted, that lies inside ``root`` (default ``folder``) once
    links are resolved: a file or folder linked from inside a data root to one outside it is not the root's, or a
    folder limited to the data roots would read anything a link points at."""
    return sorted(_images_inside(folder, folder if root is None else root))


def _images_inside(folder: Path, root: Path) -> Iterator[Path]:
    """The image files under ``folder`` that lie inside ``root`` once links are resolved, in no order."""
    return (p for p in folder.rglob("*") if _is_image_file(p) and lies_inside(p, root))


def skipped_links(folder: Path, root: Path | None = None) -> str:
    """'' or a note for an error message: how many image files under ``folder`` ``image_files`` skips as links
    resolving outside ``root``, and why."""
    root = folder if root is None else root
    count = sum(1 for p in folder.rglob("*") if _is_image_file(p) and not lies_inside(p, root))
    return (f"; {count} image link(s) in it point outside {root} and were skipped (only files inside the data folder "
            "are read, so a link cannot expose others): copy the images in instead") if count else ""


def folder_layout(path: str | os.PathLike) -> tuple[Path, Path | None, list[str]]:
    """Check an image folder quickly: (train root, val root or None, class names).

    Either ``PATH/train/<class>/...`` (with optional ``PATH/val/<class>/...``) or
    ``PATH/<class>/...``. Raises DataError for a missing folder or fewer than two classes.
    """
    root = Path(path)
    if not root.is_dir():
        raise DataError(f"dataset folder {root} does not exist")
    train_root, val_root = root, None
    if (root / "train").is_dir():
        train_root = root / "train"
        val_root = root / "val" if (root / "val").is_dir() else None
    classes = [c for c in list_class_folders(train_root) if _has_image(train_root / c, train_root)]
    if len(classes) < 2:
        raise DataError(f"{train_root} needs at least two class subfolders with images "
                        f"(found {len(classes)}); lay it out as {train_root}/<class>/<image>"
                        f"{skipped_links(train_root)}")
    if val_root is not None:
        extra = sorted(set(list_class_folders(val_root)) - set(classes))
        if extra:
            raise DataError(f"{val_root} has class folders missing from {train_root}: {', '.join(extra)}")
    return train_root, val_root, classes


def _has_image(folder: Path, root: Path) -> bool:
    """Whether ``folder`` holds an image ``image_files`` reads: a link out of ``root`` is skipped there, so here."""
    return next(_images_inside(folder, root), None) is not None


def check_run_data(args: argparse.Namespace) -> tuple[int, list[str] | None]:
    """A new run's (number of classes, class names or None for a built-in dataset), from a quick look at its
    dataset (a folder's layout, not its images); UsageError in one line for one that cannot be used. A Ray job's
    driver asks it too, before any worker starts (``vit.runs.ray_train``)."""
    try:
        kind, value = parse_dataset(args.dataset)
        if kind == "folder":
            _, val_root, class_names = folder_layout(value)
            if val_root is None and not 0 < args.val_fraction < 1:
                raise UsageError(f"{value} has no val/ folder, so --val-fraction must be above 0 "
                                 f"(got {args.val_fraction:g})")
            return len(class_names), class_names
        return _builtin_classes(value), None
    except DataError as e:
        raise UsageError(str(e)) from None


def _builtin_classes(name: str) -> int:
    return 100 if name == "cifar100" else 10
