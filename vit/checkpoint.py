"""One-file checkpoints: config, class names, preprocessing, weights and training metadata.

The file is a ``torch.save`` archive of plain data and tensors only, read back with
``torch.load(weights_only=True)`` so an untrusted file can never run code. Writes go to a
temporary file that is renamed into place, so a crash never leaves a half-written checkpoint.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from vit.model import ViT, ViTConfig

FORMAT = "vit-attention-explorer-checkpoint"
FORMAT_VERSION = 1
_UMASK = os.umask(0)  # read once at import, before any thread could race on it
os.umask(_UMASK)
_FILE_MODE = 0o666 & ~_UMASK


class CheckpointError(ValueError):
    """A checkpoint that cannot be read; the message says why and what to do."""


class ForeignCheckpointError(CheckpointError):
    """A safe torch file that is not one of ours (e.g. a timm or torchvision state dict): ``vit.sources`` reads it."""


RESIZE_MODES = ("square", "shortest_edge")
RESAMPLE_FILTERS = ("nearest", "bilinear", "bicubic", "lanczos")


@dataclass(frozen=True)
class Preprocessing:
    """How an image becomes model input: resized, centre-cropped to ``image_size`` square, then normalised.

    Without ``resize_size`` the image is resized straight to ``image_size`` square (this
    project's models); imported models keep their library's evaluation transform: resize to
    ``resize_size`` (square, or the shorter side keeping the aspect ratio) and crop the centre.
    """

    image_size: int
    num_channels: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    resize_size: int | None = None  # None: no crop, resize straight to image_size
    resize_mode: str = "square"  # "square" stretches to resize_size²; "shortest_edge" keeps the aspect ratio
    resample: str = "bicubic"  # the PIL filter of the resize

    def to_dict(self) -> dict:
        return {"image_size": self.image_size, "num_channels": self.num_channels,
                "mean": list(self.mean), "std": list(self.std), "resize_size": self.resize_size,
                "resize_mode": self.resize_mode, "resample": self.resample}

    @classmethod
    def from_dict(cls, values: dict) -> Preprocessing:
        """From ``to_dict``'s output; checkpoints written before the resize fields get today's defaults."""
        resize = values.get("resize_size")
        return cls(int(values["image_size"]), int(values["num_channels"]),
                   tuple(float(m) for m in values["mean"]), tuple(float(s) for s in values["std"]),
                   resize_size=int(resize) if resize is not None else None,
                   resize_mode=str(values.get("resize_mode", "square")),
                   resample=str(values.get("resample", "bicubic")))

    @classmethod
    def default_for(cls, config: ViTConfig) -> Preprocessing:
        """Mean 0.5, std 0.5 per channel: maps [0, 1] pixels to [-1, 1]."""
        return cls(config.image_size, config.num_channels, (0.5,) * config.num_channels,
                   (0.5,) * config.num_channels)


@dataclass
class Checkpoint:
    """A loaded checkpoint; ``model`` is in eval mode on the requested device."""

    model: ViT
    class_names: list[str]
    preprocessing: Preprocessing
    metadata: dict = field(default_factory=dict)
    training_state: dict | None = None  # optimizer, scheduler, EMA, RNG: only for resuming
    path: Path | None = None

    @property
    def config(self) -> ViTConfig:
        return self.model.config


def preprocessing_problem(preprocessing: Preprocessing, config: ViTConfig) -> str | None:
    """What makes ``preprocessing`` unusable with a model of ``config``, or None when it fits."""
    p = preprocessing
    if p.num_channels != config.num_channels:
        return f"{p.num_channels} image channel(s) for a model that takes {config.num_channels}"
    if len(p.mean) != p.num_channels or len(p.std) != p.num_channels:
        return f"mean and std need {p.num_channels} value(s) each, got {len(p.mean)} and {len(p.std)}"
    if not all(s > 0 for s in p.std):
        return f"std must be positive, got {list(p.std)}"
    if p.image_size <= 0 or p.image_size % config.patch_size:
        return f"image size {p.image_size} is not a positive multiple of the patch size {config.patch_size}"
    if p.resize_size is not None and not p.image_size <= p.resize_size <= 16 * p.image_size:
        return f"resize size {p.resize_size} must be between the crop size {p.image_size} and 16 times it"
    if p.resize_mode not in RESIZE_MODES:
        return f"resize mode {p.resize_mode!r} is not one of {', '.join(RESIZE_MODES)}"
    if p.resample not in RESAMPLE_FILTERS:
        return f"resample filter {p.resample!r} is not one of {', '.join(RESAMPLE_FILTERS)}"
    return None


def _clean_key(key: str) -> str:
    # Weights saved from DDP or torch.compile carry wrapper prefixes.
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
        "state_dict": {_clean_key(k): v.detach().cpu() for k, v in model.state_dict().items()},
    }
    if training_state is not None:
        payload["training_state"] = training_state
    return atomic_torch_save(payload, path)


def atomic_torch_save(payload: object, path: str | os.PathLike) -> Path:
    """``torch.save`` to a temporary file in the same folder, fsync, then rename over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, _FILE_MODE)  # mkstemp makes 0600; checkpoints are ordinary files
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_checkpoint_payload(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    """The checked raw contents of a checkpoint file; raises CheckpointError with one line."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint not found: {path}")
    if not path.is_file():
        raise CheckpointError(f"{path} is not a file; give the path of a .pt checkpoint")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path} is empty; it is not a checkpoint")
    try:
        with open(path, "rb") as f:
            is_zip = f.read(4) == b"PK\x03\x04"  # torch.save's format; a cut-off one has no central directory
    except OSError as e:
        raise CheckpointError(f"cannot read {path} ({e.strerror or type(e).__name__})") from None
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        # torch wraps every weights-only failure in this error; only a blocked GLOBAL means the file
        # asked for Python objects, anything else is a file that was never a torch pickle.
        if "GLOBAL" in str(e) or zipfile.is_zipfile(path):
            raise CheckpointError(
                f"refused to load {path}: it contains Python objects other than tensors and plain "
                "data, which could run code; only load checkpoints written by this program") from None
        raise CheckpointError(f"{path} is not a checkpoint (not a torch archive)") from None
    except Exception as e:  # the weights-only unpickler raises KeyError, IndexError, ... on garbage
        if is_zip or "zip" in str(e).lower():
            raise CheckpointError(f"{path} is truncated or corrupt ({_first_line(e)}); "
                                  "re-copy or re-create it") from None
        raise CheckpointError(f"{path} is not a checkpoint (not a torch archive)") from None
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


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> Checkpoint:
    """Load a checkpoint safely (no code runs from the file) into an eval-mode ``ViT``."""
    payload = read_checkpoint_payload(path, map_location)
    try:
        config = ViTConfig.from_dict(payload["config"])
        preprocessing = Preprocessing.from_dict(payload["preprocessing"])
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise CheckpointError(f"{path} has an invalid config: {_first_line(e)}") from None
    problem = preprocessing_problem(preprocessing, config)
    if problem:
        raise CheckpointError(f"{path} has invalid preprocessing: {problem}")
    if not isinstance(payload["class_names"], (list, tuple)) or not isinstance(payload["state_dict"], dict):
        raise CheckpointError(f"{path} has malformed class names or weights; the file is damaged")
    class_names = [str(name) for name in payload["class_names"]]
    if len(class_names) != config.num_classes:
        raise CheckpointError(f"{path} names {len(class_names)} classes but its model has "
                              f"{config.num_classes}")
    model = ViT(config)
    state_dict = {_clean_key(str(k)): v for k, v in payload["state_dict"].items()}
    try:
        model.load_state_dict(state_dict, strict=True)
    except (RuntimeError, TypeError, AttributeError) as e:
        raise CheckpointError(f"the weights in {path} do not fit its stored config: "
                              f"{_mismatch_summary(e)}") from None
    model.to(map_location).eval()
    return Checkpoint(model=model, class_names=class_names, preprocessing=preprocessing,
                      metadata=dict(payload.get("metadata") or {}),
                      training_state=payload.get("training_state"), path=Path(path))


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    line = text[0] if text else type(error).__name__
    if len(line) > 160:  # torch appends paragraphs of advice; its first sentence says what failed
        line = line.split(". ", 1)[0]
    return line if len(line) <= 160 else line[:157] + "..."


def _mismatch_summary(error: RuntimeError) -> str:
    lines = [line.strip() for line in str(error).splitlines()[1:] if line.strip()]
    summary = "; ".join(lines) or _first_line(error)
    return summary if len(summary) < 300 else summary[:297] + "..."
