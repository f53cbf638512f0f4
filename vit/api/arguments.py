"""What the notebook API's functions take, read as the engine takes it, and the files its results write.

An image is a PIL image, a file, an ``(H, W, 3)`` uint8 array or a ``(3, H, W)`` / ``(1, 3, H, W)`` tensor in [0, 1]
(unnormalised: the checkpoint's own preprocessing resizes and normalises every image, as it does a file's). Layers,
heads, tokens and classes count from 0 and a negative one from the end, as Python indexes the arrays; a class is
its index or its name.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vit.checkpoint import Checkpoint
from vit.core.images import ImageError, open_image
from vit.core.inference import TRAINING_SIZE, InputSize
from vit.core.runfiles import (
    atomic_write_with,
)
from vit.explain.views.overlay import (
    write_png,
)

ImageLike = Image.Image | np.ndarray | torch.Tensor | str | os.PathLike


def pil_image(image: ImageLike) -> Image.Image:
    """A PIL image of ``image`` (see the module docstring for what an image may be); ImageError in one line."""
    if isinstance(image, Image.Image):
        return image
    if isinstance(image, torch.Tensor):
        return _tensor_image(image)
    if isinstance(image, np.ndarray):
        return _array_image(image)
    if isinstance(image, (str, os.PathLike, bytes, bytearray)) or hasattr(image, "read"):
        return open_image(image)
    raise ImageError(f"cannot read an image from a {type(image).__name__}; give a PIL image, a file, an (H, W, 3) "
                     "uint8 array or a (3, H, W) tensor in [0, 1]")


def _array_image(array: np.ndarray) -> Image.Image:
    """An ``(H, W)``, ``(H, W, 1|3|4)`` uint8 array, as PIL reads one."""
    if array.dtype != np.uint8:
        raise ImageError(f"a numpy image must be uint8 (0 to 255), got {array.dtype}; for floats in [0, 1] pass "
                         "torch.from_numpy(array).permute(2, 0, 1)")
    if not (array.ndim == 2 or array.ndim == 3 and array.shape[2] in (1, 3, 4)):
        raise ImageError(f"a numpy image must be (height, width, channels) with 1, 3 or 4 channels, got shape "
                         f"{array.shape}")
    return Image.fromarray(array[..., 0] if array.ndim == 3 and array.shape[2] == 1 else array)


def _tensor_image(tensor: torch.Tensor) -> Image.Image:
    """A ``(C, H, W)`` or ``(1, C, H, W)`` tensor, floats in [0, 1] or uint8, as torchvision's ``to_pil_image``
    converts it (to 8 bits: the checkpoint's preprocessing then treats it as it treats a file)."""
    from torchvision.transforms.functional import to_pil_image

    if tensor.dim() == 4:
        if tensor.shape[0] != 1:
            raise ImageError(f"give one image at a time, got a batch of {tensor.shape[0]}; pass images[i]")
        tensor = tensor[0]
    if tensor.dim() != 3 or tensor.shape[0] not in (1, 3, 4):
        raise ImageError(f"an image tensor must be (channels, height, width) with 1, 3 or 4 channels, got shape "
                         f"{tuple(tensor.shape)}; for (height, width, channels) use tensor.permute(2, 0, 1)")
    tensor = tensor.detach().cpu()
    if tensor.is_floating_point():
        low, high = float(tensor.min()), float(tensor.max())
        if low < 0 or high > 1:
            raise ImageError(f"an image tensor's values must be in [0, 1], these run from {low:.3g} to {high:.3g}; "
                             "pass it unnormalised (the checkpoint's preprocessing normalises it)")
    elif tensor.dtype != torch.uint8:
        raise ImageError(f"an image tensor must hold floats in [0, 1] or uint8, got {tensor.dtype}")
    return to_pil_image(tensor)


def input_size(size: int | InputSize | None) -> InputSize:
    """The input size ``size`` asks for: a side in pixels, an ``InputSize``, or None for the model's own."""
    if size is None:
        return TRAINING_SIZE
    return size if isinstance(size, InputSize) else InputSize(int(size))


def checked_index(value: int, count: int, what: str, has: str) -> int:
    """``value`` as an index from 0 into ``count`` things, a negative one counted from the end (as Python indexes);
    ValueError naming the valid range."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{what} must be a whole number, got {value!r}")
    if not -count <= value < count:
        raise ValueError(f"{what} {value} is out of range: {has}, numbered 0 to {count - 1} "
                         f"(or -{count} to -1 from the end)")
    return int(value) % count


def target_class(checkpoint: Checkpoint, target: int | str | None) -> int | None:
    """The index of class ``target`` (an index or a name; None stays None: the predicted class)."""
    if target is None:
        return None
    names = list(checkpoint.class_names)
    if isinstance(target, str):
        if target not in names:
            raise ValueError(f"{target!r} is not one of this model's classes; checkpoint.class_names lists them")
        return names.index(target)
    return checked_index(target, len(names), "target", f"this model has {len(names)} classes")


def needs_port(checkpoint: Checkpoint, what: str) -> None:
    """``MechanismError`` (a ValueError) in one line where ``checkpoint`` opened by the library road: ``what`` reads
    or edits our ViT's hook points (each head's output, the residual stream, the classifier's weights), which a
    model its library runs has not."""
    if checkpoint.road == "library":
        from vit.explain.mechanism.components import MechanismError

        raise MechanismError(f"{what} reads and edits this project's ViT at its hook points, and this model opened "
                             "as its library builds it (the library road), which has none; vit.explain draws its "
                             "maps and vit.pca, vit.similarity its dense views, and a family with a port opens on it")


def needs_classifier(checkpoint: Checkpoint, what: str) -> None:
    """ValueError where ``checkpoint`` has no classifier for ``what`` to read."""
    if checkpoint.model.head is None:
        raise ValueError(f"{what} reads a classifier's logits and this model has none (an image encoder); "
                         "vit.explain draws its attention maps")


def save_as(path: str | os.PathLike, picture: Image.Image, arrays: dict[str, np.ndarray]) -> Path:
    """``path``: ``.png`` writes ``picture``, ``.npz`` the arrays; anything else is refused. Written atomically: a
    kill mid-write leaves the earlier file whole."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".png":
        write_png(path, picture)
    elif suffix == ".npz":
        atomic_write_with(path, lambda f: np.savez_compressed(f, **arrays))
    else:
        raise ValueError(f"cannot save as {path.suffix or 'a file without a suffix'}; give a .png or .npz path")
    return path
