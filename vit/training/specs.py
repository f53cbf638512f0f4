"""What a run's arguments may say, read without torch: ``vit.train`` checks them before torch loads (``--help``, a
usage error and a ``--ray`` run's whole client never load it), and the Train page offers the same names.

- ``--augment``: the policies ``vit.training.data.BatchAugment`` implements (``AUGMENTATIONS``).
- ``--dataset``: a built-in dataset or ``folder:PATH`` (``parse_dataset``); ``vit.training.data`` loads it.
- ``--device``: its spelling is ``torch.device``'s (c10's ``Device(const std::string&)``): a device type torch
  knows, then optionally ``:`` and an index written without a sign or leading zero that ``stoi`` reads
  (``device_spelling``; tests/test_cli_startup.py holds it to ``torch.device`` itself on a table of strings).
  ``check_device`` refuses what is not cpu or cuda; ``vit.training.distributed.parse_device`` then asks torch
  whether this machine has it.
"""

from __future__ import annotations

import re

from vit.core.cli import UsageError

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
