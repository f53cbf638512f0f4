"""What every road of the door (``vit.sources.open``) shares: the build of our ``ViT`` checked against its config on
the meta device, a config's refusal in one line, the class names a model without its own gets, the finished
``Checkpoint`` (its preprocessing bounded, its metadata, what was assumed), and where a refusal sends the user."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import torch

from vit.checkpoint import Checkpoint, Preprocessing, preprocessing_problem, weights_problem
from vit.model import ViT, ViTConfig
from vit.sources.files import SourceError, _one_line
from vit.sources.ports.libraries import import_torchvision

# Where a refusal sends the user: every family's own list of what opens is longer than a line (together 2,200
# characters); the README's table links the docs' page of each kind, which lists them.
README_FAMILIES = "the README's table \"What it opens\" links a page listing every model this program opens"
WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin")
MAX_INPUT_SIZE = 2048  # the largest published ViTs take 518 px (DINOv2) to 1024 px


def build_model(config: ViTConfig, state: Mapping[str, torch.Tensor], origin: str,
                map_location: str | torch.device = "cpu") -> ViT:
    """Our ``ViT`` holding ``state``, after checking every key and shape against ``config`` on the meta device."""
    problem = weights_problem(config, dict(state))  # the same check our own checkpoints get, before any allocation
    if problem:
        raise SourceError(f"the weights of {origin} do not fit its config: {problem}")
    with torch.device("meta"):
        skeleton = ViT(config)  # no memory: shapes only; the weights are assigned below
    skeleton.load_state_dict({k: v.contiguous() for k, v in state.items()}, strict=True, assign=True)
    return skeleton.to(map_location).eval()


def _config(origin: str, make) -> ViTConfig:
    try:
        return make()
    except (ValueError, TypeError, KeyError, AttributeError, ArithmeticError) as e:
        raise SourceError(f"{origin}: {_one_line(e)}") from None


# -- class names --------------------------------------------------------------------------------------------------

def default_class_names(num_classes: int) -> list[str]:
    """ImageNet's names (torchvision's metadata) for 1000 classes, else 'class 0', 'class 1', ..."""
    if num_classes == 1000:
        return import_torchvision.imagenet_class_names()
    return [f"class {i}" for i in range(num_classes)]


# -- the finished checkpoint ------------------------------------------------------------------------------------------

def _finish(model: ViT, class_names: list[str], preprocessing: Preprocessing, path: Path, kind: str,
            architecture: str, guessed_from: str | None = None) -> Checkpoint:
    problem = preprocessing_problem(preprocessing, model.config)
    if max(preprocessing.image_hw) > MAX_INPUT_SIZE:  # every image would be resized to this: bound the memory
        problem = f"an input of {preprocessing.size_label} px (at most {MAX_INPUT_SIZE} px are supported)"
    if problem:
        raise SourceError(f"{path} has unusable preprocessing settings: {problem}")
    metadata = {"source": {"kind": kind, "path": str(path), "architecture": architecture},
                "architecture": architecture, "parameters": sum(p.numel() for p in model.parameters())}
    if guessed_from:  # no preprocessing config came with the weights: say what was assumed, and from what
        p = preprocessing
        how = (f"the longer side resized to {p.resize_size} px ({p.resample}), padded to {p.size_label} px"
               if p.resize_mode == "longest_edge_pad" else
               f"resize to {_size_text(p.resize_size) or p.size_label} px ({p.resize_mode}, {p.resample}), "
               f"centre {p.size_label} px")
        metadata["preprocessing_guessed"] = (
            f"No {guessed_from} came with these weights, so the images are prepared with assumed defaults: {how}, "
            f"mean {tuple(round(v, 4) for v in p.mean)}, std {tuple(round(v, 4) for v in p.std)}. If the model was "
            "trained otherwise, its predictions and maps are off.")
    return Checkpoint(model=model, class_names=class_names, preprocessing=preprocessing, metadata=metadata, path=path)


def _size_text(size: int | tuple[int, int] | None) -> str | None:
    """``256`` for a side, ``320×224`` (width × height, as images are described) for a ``(height, width)``."""
    return f"{size[1]}×{size[0]}" if isinstance(size, tuple) else None if size is None else str(size)


def unsupported(what: str, name: str, supported: Iterable[str], family: Callable[[str], str] = str) -> str:
    """'``what`` is not supported', in one line: the supported names of the family closest to ``name``'s (each
    name's ``family``, compared by difflib, case ignored), when one is close, then where the README lists every
    family."""
    families: dict[str, list[str]] = {}
    for known in supported:
        families.setdefault(family(known).lower(), []).append(known)
    closest = difflib.get_close_matches(family(name).lower(), families, n=1, cutoff=0.6)
    near = f"the closest supported: {', '.join(families[closest[0]])}; " if closest else ""
    return f"{what} is not supported; {near}{README_FAMILIES}"


