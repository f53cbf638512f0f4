"""The checkpoint file: config, class names, preprocessing, weights and training metadata in one ``torch.save``
archive of plain data and tensors (``save_checkpoint``), read back with ``torch.load(weights_only=True)`` after
``vit.checkpoint.torch_files``' checks and every part checked against the others before a model is built
(``load_checkpoint``).
"""

from __future__ import annotations

import functools
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path

import torch

from vit.checkpoint.preprocessing import Preprocessing, preprocessing_problem
from vit.checkpoint.torch_files import (
    CheckpointError,
    ForeignCheckpointError,
    atomic_torch_save,
    check_archive,
    first_line,
)
from vit.model import ViT, ViTConfig

FORMAT = "vit-attention-explorer-checkpoint"
FORMAT_VERSION = 1
MAX_LAYERS = 256  # far beyond any published ViT (ViT-22B has 48); building the empty model costs ~3 ms a layer


MAX_CLASS_NAME_CHARS = 200  # ImageNet-21k's longest synset names are under 100


def class_names_problem(names: object) -> str | None:
    """Why ``names`` cannot be a model's class names, or None: a list of flat strings, each at most
    ``MAX_CLASS_NAME_CHARS`` long. Checked without ``str()``, which would expand a self-referencing list
    (a 1.9 MB pickle of ``L(i+1) = [L(i), L(i)]`` took 80 s and 1.6 GB at depth 23)."""
    if not isinstance(names, (list, tuple)):
        return f"class names must be a list, not {type(names).__name__}"
    for i, name in enumerate(names):
        if not isinstance(name, str):
            return f"class name {i} is a {type(name).__name__}, not text; the file is damaged or not ours"
        if len(name) > MAX_CLASS_NAME_CHARS:
            return f"class name {i} is {len(name):,} characters long; at most {MAX_CLASS_NAME_CHARS}"
    return None


@dataclass
class Checkpoint:
    """A loaded checkpoint; ``model`` is in eval mode on the requested device."""

    model: ViT
    class_names: list[str]
    preprocessing: Preprocessing
    metadata: dict = field(default_factory=dict)
    training_state: dict | None = None  # optimizer, scheduler, EMA, RNG: only for resuming
    path: Path | None = None
    # Which road opened it: "port" (our ViT, the weights mapped onto it) or "library" (the library's own model run
    # with our recording attention, vit.sources.library_road.transformers_models.LibraryModel in ``model``)
    road: str = "port"

    def __post_init__(self) -> None:
        problem = class_names_problem(self.class_names)
        if problem:
            raise CheckpointError(f"{self.path or 'this model'}: {problem}")

    @property
    def config(self) -> ViTConfig:
        return self.model.config

    def __repr__(self) -> str:
        # The dataclass's own repr prints the whole module tree: pages for a ViT-B in a notebook.
        names, shown = self.class_names, 5
        # a library-road model's config is its library's (timm's a dict): its layout holds the patch
        patch = self.model.layout.patch_hw if self.road == "library" else self.config.patch_size
        patch = patch[0] if isinstance(patch, tuple) and patch[0] == patch[1] else patch
        classes = (f"{len(names)} classes ({', '.join(names[:shown])}{', …' if len(names) > shown else ''})"
                   if names else "no classifier")
        return (f"<Checkpoint {self.path.name if self.path else 'in memory'}: "
                f"{self.metadata.get('architecture', 'vit')}, {sum(p.numel() for p in self.model.parameters()):,} "
                f"parameters, {self.preprocessing.size_text} in patches of {patch}, {classes}>")


def weights_problem(config: ViTConfig, state_dict: dict) -> str | None:
    """What keeps ``state_dict`` from loading into ``ViT(config)``, or None when every name and shape fits.

    The model is built on the ``meta`` device (shapes only, no memory), so a config that declares
    terabytes of weights is refused before anything is allocated.
    """
    if config.num_layers > MAX_LAYERS:
        return f"its config declares {config.num_layers:,} layers, more than the {MAX_LAYERS} this program builds"
    stored = {}
    for key, value in state_dict.items():
        if not isinstance(value, torch.Tensor):
            return f"weight {str(key)[:80]!r} is a {type(value).__name__}, not a tensor"
        stored[clean_key(str(key))] = value
    try:
        expected = dict(_shapes_of(config))
    except (RuntimeError, ValueError, TypeError, OverflowError, MemoryError) as e:  # sizes past int64, say
        return f"its config declares sizes no model can have ({first_line(e)})"
    mismatches = [f"size mismatch for {k}: {tuple(stored[k].shape)} stored, {shape} in the config"
                  for k, shape in expected.items() if k in stored and tuple(stored[k].shape) != shape]
    problems = mismatches[:2] + ([f"{len(mismatches) - 2} more size mismatches"] if len(mismatches) > 2 else [])
    missing = [k for k in expected if k not in stored]
    unexpected = [k for k in stored if k not in expected]
    if missing:
        problems.append(f"missing {_some(missing)}")
    if unexpected:
        problems.append(f"unexpected {_some(unexpected)}")
    return "; ".join(problems) or None


@functools.lru_cache(maxsize=32)
def _shapes_of(config: ViTConfig) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Every weight's name and shape in ``ViT(config)``, built on the meta device; the last configs' kept: a
    checkpoint is checked each time it is listed or opened, and the build on the meta device, where every call of the
    model's construction passes through torch's device mode in Python, costs as much as a small model's real one.
    ``ViTConfig`` is frozen and turns every list it is given into a tuple, so each config is a key."""
    with torch.device("meta"):
        return tuple((k, tuple(v.shape)) for k, v in ViT(config).state_dict().items())


def _some(names: list[str], shown: int = 3) -> str:
    more = f" and {len(names) - shown:,} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def clean_key(key: str) -> str:
    """A weight name without the wrapper prefixes (``module.``, ``_orig_mod.``) of DDP and torch.compile."""
    for prefix in ("module.", "_orig_mod."):
        while key.startswith(prefix):
            key = key[len(prefix):]
    return key


def save_checkpoint(path: str | os.PathLike, model: ViT, class_names: list[str],
                    preprocessing: Preprocessing | None = None, metadata: dict | None = None,
                    training_state: dict | None = None) -> Path:
    """Atomically write ``model`` with everything needed to use it (and optionally resume it)."""
    config = model.config
    if len(class_names) != config.num_classes:
        raise ValueError(f"{len(class_names)} class names given for a model with "
                         f"{config.num_classes} classes")
    preprocessing = preprocessing or Preprocessing.default_for(config)
    problem = preprocessing_problem(preprocessing, config)
    if problem:
        raise ValueError(problem)
    payload = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "config": config.to_dict(),
        "class_names": [str(name) for name in class_names],
        "preprocessing": preprocessing.to_dict(),
        "metadata": dict(metadata or {}),
        "state_dict": {clean_key(k): v.detach().cpu() for k, v in model.state_dict().items()},
    }
    if training_state is not None:
        payload["training_state"] = training_state
    return atomic_torch_save(payload, path)


def read_checkpoint_payload(path: str | os.PathLike, map_location: str | torch.device = "cpu",
                            mmap: bool = False) -> dict:
    """The checked raw contents of a checkpoint file; raises CheckpointError with one line.

    ``mmap`` maps the tensors instead of reading them: enough to describe a checkpoint cheaply.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint not found: {path}")
    if not path.is_file():
        raise CheckpointError(f"{path} is not a file; give the path of a .pt checkpoint")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path} is empty; it is not a checkpoint")
    check_archive(path)
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError:
        # torch wraps every weights-only refusal (a GLOBAL for a class or function) in this error.
        raise CheckpointError(
            f"refused to load {path}: it contains Python objects other than tensors and plain "
            "data, which could run code; only load checkpoints written by this program") from None
    except Exception as e:  # the weights-only unpickler raises KeyError, IndexError, ... on garbage
        raise CheckpointError(f"{path} is truncated or corrupt ({first_line(e)}); "
                              "re-copy or re-create it") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ForeignCheckpointError(f"{path} is a torch file but not a ViT Attention Explorer checkpoint")
    version = payload.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(f"{path} has checkpoint format version {version!r}; this program reads "
                              f"version {FORMAT_VERSION}: use a matching release")
    for key in ("config", "class_names", "preprocessing", "state_dict"):
        if key not in payload:
            raise CheckpointError(f"{path} lacks its {key!r} entry; the file is damaged")
    return payload


def check_payload(path: str | os.PathLike, payload: dict) -> tuple[ViTConfig, Preprocessing, list[str]]:
    """The config, preprocessing and class names of a payload whose every part fits together.

    Checks types, the preprocessing against the config and every stored weight's name and shape
    against the config, all before a model is built; raises CheckpointError with one line.
    """
    try:
        config = ViTConfig.from_dict(payload["config"])
        preprocessing = Preprocessing.from_dict(payload["preprocessing"])
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as e:
        raise CheckpointError(f"{path} has an invalid config: {first_line(e)}") from None
    problem = preprocessing_problem(preprocessing, config)
    if problem:
        raise CheckpointError(f"{path} has invalid preprocessing: {problem}")
    if not isinstance(payload["class_names"], (list, tuple)) or not isinstance(payload["state_dict"], dict):
        raise CheckpointError(f"{path} has malformed class names or weights; the file is damaged")
    if not isinstance(payload.get("metadata") or {}, dict) or not isinstance(payload.get("training_state") or {},
                                                                             dict):
        raise CheckpointError(f"{path} has malformed metadata or training state; the file is damaged")
    problem = class_names_problem(payload["class_names"])
    if problem:
        raise CheckpointError(f"{path}: {problem}")
    class_names = list(payload["class_names"])
    if len(class_names) != config.num_classes:
        raise CheckpointError(f"{path} names {len(class_names)} classes but its model has "
                              f"{config.num_classes}")
    problem = weights_problem(config, payload["state_dict"])
    if problem:
        raise CheckpointError(f"the weights in {path} do not fit its stored config: {_clip(problem)}")
    return config, preprocessing, class_names


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> Checkpoint:
    """Load a checkpoint safely (no code runs from the file) into an eval-mode ``ViT``.

    The tensors are mapped, not read, until every name and shape has been checked against the stored config,
    so a file declaring gigabytes the model has no place for is refused at once. ``map_location="meta"``
    checks the whole file and builds the model without reading or allocating any weights.
    """
    payload = read_checkpoint_payload(path, mmap=True)
    config, preprocessing, class_names = check_payload(path, payload)
    state_dict = {clean_key(str(k)): v for k, v in payload["state_dict"].items()}
    if torch.device(map_location).type == "meta":
        with torch.device("meta"):
            model = ViT(config)
        state_dict = {k: v.to("meta") for k, v in state_dict.items()}
    else:
        model = ViT(config)  # every stored shape fits the config, so this allocates no more than the file holds
    try:
        model.load_state_dict(state_dict, strict=True)  # copies from the mapping: the file's pages are read here
    except (RuntimeError, TypeError, AttributeError) as e:
        raise CheckpointError(f"the weights in {path} do not fit its stored config: "
                              f"{_mismatch_summary(e)}") from None
    model.to(map_location).eval()
    return Checkpoint(model=model, class_names=class_names, preprocessing=preprocessing,
                      metadata=dict(payload.get("metadata") or {}),
                      training_state=payload.get("training_state"), path=Path(path))



def _mismatch_summary(error: RuntimeError) -> str:
    lines = [line.strip() for line in str(error).splitlines()[1:] if line.strip()]
    return _clip("; ".join(lines) or first_line(error))


def _clip(text: str, limit: int = 300) -> str:
    return text if len(text) < limit else text[:limit - 3] + "..."
