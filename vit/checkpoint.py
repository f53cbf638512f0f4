"""One-file checkpoints: config, class names, preprocessing, weights and training metadata.

The file is a ``torch.save`` archive of plain data and tensors only, read back with
``torch.load(weights_only=True)`` so an untrusted file can never run code. Writes go to a
temporary file that is renamed into place, so a crash never leaves a half-written checkpoint.
"""

from __future__ import annotations

import errno
import json
import math
import os
import pickle
import pickletools
import shutil
import tempfile
import zipfile
from _compat_pickle import IMPORT_MAPPING, NAME_MAPPING  # pickle's own Python 2 renames, as torch applies them
from dataclasses import dataclass, field
from pathlib import Path

import torch

from vit.model import ViT, ViTConfig

FORMAT = "vit-attention-explorer-checkpoint"
FORMAT_VERSION = 1
# Bounds checked before anything is unpickled or built, so a hostile file costs milliseconds, not minutes.
MAX_PREPROCESSING_PATCHES = 4096  # a 64 x 64 grid; larger than the model's own input needs no more
MAX_SMART_PIXELS = 2**26  # Qwen2.5-VL's processors allow up to 12,845,056 (3,584²); the token gate bounds the work
MAX_LAYERS = 256  # far beyond any published ViT (ViT-22B has 48); building the empty model costs ~3 ms a layer
PICKLE_BASE_BYTES = 3 * 1024 * 1024  # config, class names (ImageNet: 25 KB), metrics (150 KB per 1,000 epochs), a
# long run's loss curve (MAX_STEP_ROWS = 20,000 rows: 1.8 MB); the opcode walk bounds the work within it
PICKLE_BYTES_PER_TENSOR = 512  # a tensor's key and rebuild call take ~150 bytes of pickle
MAX_PICKLE_BYTES = 4 * 1024 * 1024  # the weights-only unpickler reads ~1 MB of opcodes a second
# Dict entries and containers a pickle may build per byte of its size limit: real ones spend 9 or more bytes on each
# (a last.pt with 20,000 step rows: 194,000 in 1.75 MB; timm, torchvision, open_clip, HF weights: 1 per 10-17 bytes)
PICKLE_BYTES_PER_ITEM = 4
MAX_PICKLE_KEY = 2**31  # int keys are an optimizer's parameter indices; ints beyond can be chosen to share a hash
MAX_TENSORS = 16_384  # per file; a whole CLIP or ViT-22B has under 1,000 (a file of a million took 48 s to list)
MAX_SAFETENSORS_HEADER_BYTES = 8 * 2**20  # ~100 bytes a tensor: ViT-B/16's header is 20 kB
MAX_TENSOR_DIMS = 8
SAFETENSORS_DTYPES = {"BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "U16": torch.uint16, "I16": torch.int16,
                      "U32": torch.uint32, "I32": torch.int32, "U64": torch.uint64, "I64": torch.int64,
                      "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64,
                      "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}
_ZIP_MAGIC = b"PK\x03\x04"
_LEGACY_MAGIC = b"\x80\x02\x8a\x0a"  # torch's pre-1.6 format: a pickled magic number, then pickles
_UMASK = os.umask(0)  # read once at import, before any thread could race on it
os.umask(_UMASK)
_FILE_MODE = 0o666 & ~_UMASK


class CheckpointError(ValueError):
    """A checkpoint that cannot be read; the message says why and what to do."""


class ForeignCheckpointError(CheckpointError):
    """A safe torch file that is not one of ours (e.g. a timm or torchvision state dict): ``vit.sources.open`` reads
    it."""


IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # DeiT, DINOv2, torchvision
# "longest_edge_pad": SamImageProcessor's resize of the longer side, then zeros below and right
# (vit.core.images.to_uint8);
# "keep_ratio": timm's ResizeKeepRatio, the aspect kept until the image covers a (height, width) target; "border":
# timm's crop_mode "border", the aspect kept until the image fits inside it, then cropped or padded to the input
RESIZE_MODES = ("square", "shortest_edge", "longest_edge_pad", "keep_ratio", "border")
RESAMPLE_FILTERS = ("nearest", "bilinear", "bicubic", "lanczos")
CROP_RULES = ("torchvision", "transformers", "top_left")  # where a crop starts (vit.core.images.crop_start)
# What resizes (vit.core.images.resize). "pil": PIL's filters (timm, open_clip and torchvision's transforms given PIL
# images; transformers' *ImageProcessorPil). "torchvision": torchvision's antialiased kernels on the uint8 tensor
# (transformers 5's *ImageProcessor, what AutoImageProcessor gives for every HF folder); the two differ by a grey level
# here and there.
BACKENDS = ("pil", "torchvision")


@dataclass(frozen=True)
class Preprocessing:
    """How an image becomes model input: resized, centre-cropped to ``image_size``, then normalised.

    ``image_size`` is a side, or ``(height, width)`` for a model built on rectangles (vit-pytorch's
    ``image_size=(16, 64)``, timm's ``img_size=(224, 320)``).

    Without ``resize_size`` the image is resized straight to ``image_size`` (this project's models); imported
    models keep their library's evaluation transform: resize to ``resize_size`` (square, the shorter side keeping
    the aspect ratio, or timm's ``"keep_ratio"`` to cover a ``(height, width)``) and crop the centre ``image_size``,
    timm's ``"border"`` (fit inside ``resize_size``, then crop or pad each side in the mean's colour), or (SAM's
    ``"longest_edge_pad"``) the longer side to ``resize_size`` and pad to ``image_size``.
    """

    image_size: int | tuple[int, int]  # an int for a square, as ViTConfig.image_size
    num_channels: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    resize_size: int | tuple[int, int] | None = None  # None: no crop, resize straight to image_size
    # "square" stretches to resize_size² (or its (height, width)); "shortest_edge" keeps the aspect ratio;
    # "keep_ratio" (timm, non-square) keeps it and covers resize_size's (height, width); "border" (timm's crop_mode)
    # keeps it and fits inside, then each side is cropped or padded in the mean's colour; "longest_edge_pad" (SAM)
    # brings the longer side to resize_size, keeping the aspect ratio, and pads the normalised image with 0 below and
    # to the right to image_size (no crop: the image sits at the top left of the input)
    resize_mode: str = "square"
    resample: str = "bicubic"  # the PIL filter of the resize
    crop_rule: str = "torchvision"  # the crop's offset: torchvision's round() (timm, open_clip) or HF's int()
    # NaFlex (SigLIP 2, timm naflexvit): each image resized, without a crop, to the largest size at its own aspect
    # ratio whose grid of patch_size patches has at most max_num_patches (vit.core.images.naflex_size); 0: image_size.
    max_num_patches: int = 0
    patch_size: int = 0  # NaFlex's patch side in px, which the size is rounded to; Qwen's merge unit side (28)
    # Qwen-VL's smart_resize (vit.core.images.smart_resize): each image, without a crop, at its own aspect ratio on
    # sides of whole patch_size units, between min_pixels and max_pixels pixels; 0: image_size
    min_pixels: int = 0
    max_pixels: int = 0
    # DPT's keep_aspect_ratio resize (DPT, Depth Anything: ``ensure_multiple_of``): each image scaled as little as it
    # can be toward image_size, one scale for both sides, each side rounded to a multiple of it, without a crop
    # (vit.core.images.keep_aspect_multiple); 0: image_size
    multiple_of: int = 0
    # What resizes: PIL (timm, open_clip, torchvision, ours; transformers' *ImageProcessorPil) or torchvision on uint8
    # tensors (transformers 5's *ImageProcessor, what its AutoImageProcessor picks for an HF folder)
    backend: str = "pil"
    # "border"'s padding colour, 0-255 per channel: () is the mean's colour (timm's crop_mode "border"); open_clip's
    # resize_mode "longest" pads in its preprocess_cfg's fill_color (0, black, by default)
    pad_fill: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        size = self.image_size
        if isinstance(size, (list, tuple)) and len(size) == 2:  # a JSON list; a square pair is its int, as in ViTConfig
            object.__setattr__(self, "image_size", size[0] if size[0] == size[1] else (size[0], size[1]))
        if isinstance(self.resize_size, list) and len(self.resize_size) == 2:  # a JSON list: (height, width)
            object.__setattr__(self, "resize_size", tuple(self.resize_size))
        if isinstance(self.pad_fill, list):  # a JSON list
            object.__setattr__(self, "pad_fill", tuple(self.pad_fill))

    @property
    def fill_colour(self) -> tuple[int, ...]:
        """The colour the padding is drawn in, 0-255 RGB (one value is a grey): "border"'s ``pad_fill``, else the
        normalisation's mean, which SAM's zero padding of the normalised input stands for."""
        values = self.pad_fill or tuple(min(255, max(0, round(m * 255))) for m in self.mean)
        return values * 3 if len(values) == 1 else values[:3]

    @property
    def image_hw(self) -> tuple[int, int]:
        """The size images are brought to, ``(height, width)``."""
        return (self.image_size,) * 2 if isinstance(self.image_size, int) else self.image_size

    @property
    def own_size(self) -> bool:
        """Whether each image is brought to a size of its own (NaFlex's patch budget, Qwen's smart_resize), not to
        ``image_size``."""
        return bool(self.max_num_patches or self.max_pixels or self.multiple_of)

    @property
    def own_size_rule(self) -> str:
        """How a model that sizes each image itself does it, '' for one of one size: 'smart_resize, 3,136 to 1,003,520
        pixels in whole 28-px units' (Qwen-VL), 'NaFlex, at most 256 patches of 16 px' (SigLIP 2)."""
        if self.max_pixels:
            return (f"smart_resize, {self.min_pixels:,} to {self.max_pixels:,} pixels in whole {self.patch_size}-px "
                    "units")
        if self.max_num_patches:
            return f"NaFlex, at most {self.max_num_patches:,} patches of {self.patch_size} px"
        if self.multiple_of:
            return (f"DPT's keep-aspect resize toward {self.size_label} px, each side a multiple of {self.multiple_of} "
                    "px")
        return ""

    @property
    def size_text(self) -> str:
        """The size images are shown at: '224 px', '64×16 px', or 'each image at its own size (smart_resize, …)'
        where ``image_size`` is only the size the config was built at (``own_size``)."""
        rule = self.own_size_rule
        return f"each image at its own size ({rule})" if rule else f"{self.size_label} px"

    @property
    def size_label(self) -> str:
        """``"224"`` for a square, ``"64×16"`` (width × height, as images are described) for a rectangle."""
        height, width = self.image_hw
        return str(height) if height == width else f"{width}×{height}"

    def to_dict(self) -> dict:
        size = list(self.image_size) if isinstance(self.image_size, tuple) else self.image_size
        resize = list(self.resize_size) if isinstance(self.resize_size, tuple) else self.resize_size
        return {"image_size": size, "num_channels": self.num_channels,
                "mean": list(self.mean), "std": list(self.std), "resize_size": resize,
                "resize_mode": self.resize_mode, "resample": self.resample, "crop_rule": self.crop_rule,
                "max_num_patches": self.max_num_patches, "patch_size": self.patch_size, "backend": self.backend,
                "min_pixels": self.min_pixels, "max_pixels": self.max_pixels, "pad_fill": list(self.pad_fill),
                "multiple_of": self.multiple_of}

    @classmethod
    def from_dict(cls, values: dict) -> Preprocessing:
        """From ``to_dict``'s output; checkpoints written before the resize fields get today's defaults (PIL's
        resize, which every checkpoint written before ``backend`` used)."""
        resize = values.get("resize_size")
        if isinstance(resize, (list, tuple)) and len(resize) == 2:  # timm's (height, width) target
            resize = (int(resize[0]), int(resize[1]))
        elif resize is not None:
            resize = int(resize)
        size = values["image_size"]  # an int, or [height, width] (int() refuses any other list)
        return cls((int(size[0]), int(size[1])) if isinstance(size, (list, tuple)) and len(size) == 2 else int(size),
                   int(values["num_channels"]),
                   tuple(float(m) for m in values["mean"]), tuple(float(s) for s in values["std"]),
                   resize_size=resize,
                   resize_mode=str(values.get("resize_mode", "square")),
                   resample=str(values.get("resample", "bicubic")),
                   crop_rule=str(values.get("crop_rule", "torchvision")),
                   max_num_patches=int(values.get("max_num_patches", 0)), patch_size=int(values.get("patch_size", 0)),
                   backend=str(values.get("backend", "pil")), min_pixels=int(values.get("min_pixels", 0)),
                   max_pixels=int(values.get("max_pixels", 0)), multiple_of=int(values.get("multiple_of", 0)),
                   pad_fill=tuple(values.get("pad_fill", ())) if isinstance(values.get("pad_fill", ()), (list, tuple))
                   else values.get("pad_fill"))

    @classmethod
    def default_for(cls, config: ViTConfig) -> Preprocessing:
        """Mean 0.5, std 0.5 per channel: maps [0, 1] pixels to [-1, 1]."""
        return cls(config.image_size, config.num_channels, (0.5,) * config.num_channels,
                   (0.5,) * config.num_channels)


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


def preprocessing_problem(preprocessing: Preprocessing, config: ViTConfig) -> str | None:
    """What makes ``preprocessing`` unusable with a model of ``config``, or None when it fits."""
    p = preprocessing
    if p.num_channels != config.num_channels:
        return f"{p.num_channels} image channel(s) for a model that takes {config.num_channels}"
    if len(p.mean) != p.num_channels or len(p.std) != p.num_channels:
        return f"mean and std need {p.num_channels} value(s) each, got {len(p.mean)} and {len(p.std)}"
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
               for v in (*p.mean, *p.std)):  # a NaN mean made every map NaN
        return f"mean and std must be finite numbers, got {str(list(p.mean))[:60]} and {str(list(p.std))[:60]}"
    if not all(s > 0 for s in p.std):
        return f"std must be positive, got {list(p.std)}"
    if not isinstance(p.image_size, (int, tuple)) or isinstance(p.image_size, bool) \
            or any(isinstance(v, bool) or not isinstance(v, int) for v in p.image_hw):
        return f"image size {str(p.image_size)[:40]} is not a whole number of pixels or a (height, width) pair of them"
    if min(p.image_hw) <= 0 or any(s % q for s, q in zip(p.image_hw, config.patch_hw, strict=True)):
        return f"image size {p.image_size} is not a positive multiple of the patch size {config.patch_size}"
    patches = (p.image_hw[0] // config.patch_hw[0]) * (p.image_hw[1] // config.patch_hw[1])
    if patches > max(config.num_patches, MAX_PREPROCESSING_PATCHES):
        # Every input would get more tokens than the model was built for; attention grows with their square.
        return (f"image size {p.image_size} is larger than the model's own {config.image_size} px and gives "
                f"{patches + 1:,} tokens per image (at most {MAX_PREPROCESSING_PATCHES:,} patches); store the "
                "model's size")
    if p.resize_mode not in RESIZE_MODES:
        return f"resize mode {p.resize_mode!r} is not one of {', '.join(RESIZE_MODES)}"
    if p.resize_mode == "longest_edge_pad":  # SAM: the longer side fits inside the padded input, either way round
        if isinstance(p.resize_size, bool) or not isinstance(p.resize_size, int) \
                or not 1 <= p.resize_size <= min(p.image_hw):
            return (f"the longest edge {p.resize_size} must be a whole number of pixels from 1 to the padded size "
                    f"{p.size_label}")
    elif p.resize_size is not None:
        problem = _resize_problem(p)
        if problem:
            return problem
    if not isinstance(p.pad_fill, tuple) or len(p.pad_fill) not in (0, 1, 3) or any(
            isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 255 for v in p.pad_fill):
        return f"the padding colour {p.pad_fill!r} is not one or three whole numbers from 0 to 255"
    if p.resample not in RESAMPLE_FILTERS:
        return f"resample filter {p.resample!r} is not one of {', '.join(RESAMPLE_FILTERS)}"
    if p.crop_rule not in CROP_RULES:
        return f"crop rule {p.crop_rule!r} is not one of {', '.join(CROP_RULES)}"
    if p.backend not in BACKENDS:
        return f"resize backend {p.backend!r} is not one of {', '.join(BACKENDS)}"
    if p.max_num_patches and not (0 < p.max_num_patches <= MAX_PREPROCESSING_PATCHES
                                  and config.patch_hw == (p.patch_size, p.patch_size) and p.resize_size is None):
        return (f"NaFlex's max_num_patches {p.max_num_patches} needs 1 to {MAX_PREPROCESSING_PATCHES:,} patches, "
                f"the model's square patch size ({config.patch_size}, got {p.patch_size}) and no crop")
    if (p.min_pixels or p.max_pixels) and not (
            0 < p.min_pixels <= p.max_pixels <= MAX_SMART_PIXELS and p.resize_size is None and not p.max_num_patches
            and p.patch_size > 0 and p.patch_size % config.patch_hw[0] == 0
            and config.patch_hw[0] == config.patch_hw[1]):
        return (f"Qwen's smart_resize needs 0 < min_pixels ({p.min_pixels:,}) <= max_pixels ({p.max_pixels:,}) <= "
                f"{MAX_SMART_PIXELS:,}, sides rounded to whole patches ({p.patch_size} px on {config.patch_size} px "
                "patches) and no crop")
    if p.multiple_of and not (0 < p.multiple_of <= max(p.image_hw) and p.resize_size is None
                              and not (p.max_num_patches or p.max_pixels)
                              and all(p.multiple_of % q == 0 for q in config.patch_hw)):
        return (f"DPT's keep-aspect resize needs a multiple ({p.multiple_of}) of the patch size {config.patch_size} "
                f"no larger than the image size {p.size_label}, and no crop")
    return None


def _resize_problem(p: Preprocessing) -> str | None:
    """What makes a resize before a centre crop unusable: each side of the resize target between the crop's and 16
    times it; a rectangular crop needs a ``(height, width)`` target, which a shortest-edge resize is not."""
    resize = p.resize_size
    if isinstance(resize, tuple):
        if len(resize) != 2 or any(isinstance(v, bool) or not isinstance(v, int) for v in resize):
            return f"resize size {str(resize)[:40]} is not a (height, width) pair of whole pixels"
        if p.resize_mode == "shortest_edge":
            return f"resize size {resize} is a pair: the shortest-edge resize takes one side"
    elif isinstance(resize, bool) or not isinstance(resize, int):
        return f"resize size {str(resize)[:40]} is not a whole number of pixels"
    elif isinstance(p.image_size, tuple) and not (p.resize_mode == "shortest_edge" and resize >= max(p.image_hw)):
        # a shortest-edge resize to at least the crop's long side holds the crop whatever the image's aspect
        return (f"image size {p.image_size} is a rectangle: a crop from one resize side must be square or fit in "
                "its short side; give the resize as a (height, width) pair")
    target = resize if isinstance(resize, tuple) else (resize, resize)
    if not all(c <= r <= 16 * c for r, c in zip(target, p.image_hw, strict=True)):
        return f"resize size {resize} must be between the crop size {p.image_size} and 16 times it, side by side"
    return None


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
        with torch.device("meta"):
            expected = {k: tuple(v.shape) for k, v in ViT(config).state_dict().items()}
    except (RuntimeError, ValueError, TypeError, OverflowError, MemoryError) as e:  # sizes past int64, say
        return f"its config declares sizes no model can have ({_first_line(e)})"
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
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, (OSError, RuntimeError)):
            problem = _write_problem(path, e)
            if problem is not None:
                raise problem from e
        raise
    return path


def _write_problem(path: Path, error: BaseException) -> OSError | None:
    """A full or failing disk as one clear OSError; torch reports it as 'unexpected pos 51840 vs 51728'."""
    os_error = next((e for e in (error, error.__context__, error.__cause__) if isinstance(e, OSError)), None)
    if os_error is None and "unexpected pos" not in str(error) and "write" not in str(error).lower():
        return None  # not a failed write: let it through unchanged
    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        free = None
    space = f"{free / 2**20:,.0f} MiB free" if free is not None else "free space unknown"
    if (os_error is not None and os_error.errno in (errno.ENOSPC, errno.EDQUOT)) or (free is not None and
                                                                                   free < 64 * 2**20):
        return OSError(errno.ENOSPC, f"No space left on the disk to write {path} ({space}); free some space, "
                                     "then save again")
    if os_error is not None:
        return OSError(os_error.errno, f"cannot write {path}: {os_error.strerror or os_error} ({space})")
    return OSError(errno.EIO, f"cannot write {path}: the write was cut short ({space}); the disk may be full or "
                              "failing")


def check_archive(path: Path) -> None:
    """Refuse, before unpickling anything, a file that is not a torch zip archive or whose pickle could keep the
    unpickler busy; every torch file this program reads (checkpoints and imported weights) passes here first.

    A bare pickle, or torch's legacy format (pickles), runs to the end of the file and cannot be sized
    beforehand. ``torch.save`` stores every entry uncompressed and writes a pickle (``data.pkl``) of
    ~150 bytes per tensor plus the plain data; a crafted file can pack millions of opcodes into kilobytes
    (compressed) or inflate the pickle far beyond its tensors, which takes minutes to read. Within that size, a
    pickle whose keys share one hash also takes minutes: its opcodes are walked first (``_pickle_problem``).
    """
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise CheckpointError(f"cannot read {path} ({e.strerror or type(e).__name__})") from None
    if magic[:1] == _LEGACY_MAGIC[:1]:  # a pickle's PROTO opcode: torch's pre-1.6 format or a bare pickle
        raise CheckpointError(f"refused to load {path}: it is in torch's legacy (pre-1.6) format or a bare pickle, "
                              "whose pickles could run code or take minutes to read; only torch.save archives "
                              "(torch 1.6 or later) are read")
    if magic != _ZIP_MAGIC:
        raise CheckpointError(f"{path} is not a checkpoint or weights file (not a torch archive)")
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        raise CheckpointError(f"{path} is truncated or corrupt ({_first_line(e)}); re-copy or re-create it") from None
    compressed = next((e.filename for e in entries if e.compress_type != zipfile.ZIP_STORED), None)
    if compressed is not None:
        raise CheckpointError(f"refused to load {path}: its entry {compressed[:80]!r} is compressed, which torch.save "
                              "never does; the file was altered or not written by torch")
    pickles = [e for e in entries if e.filename.endswith("/data.pkl") and e.filename.count("/") == 1]
    tensors = sum(1 for e in entries if e.filename.count("/") == 2 and e.filename.split("/")[1] == "data")
    if tensors > MAX_TENSORS:
        raise CheckpointError(f"refused to load {path}: it holds {tensors:,} tensors, more than the {MAX_TENSORS:,} "
                              "any model this program opens has")
    limit = min(MAX_PICKLE_BYTES, PICKLE_BASE_BYTES + PICKLE_BYTES_PER_TENSOR * tensors)
    for entry in pickles:
        if entry.file_size > limit:
            raise CheckpointError(f"refused to load {path}: its pickle is {entry.file_size:,} bytes for {tensors:,} "
                                  f"tensors (weights need at most {limit:,}); it may be built to stall the reader")
    max_items = limit // PICKLE_BYTES_PER_ITEM
    try:
        with zipfile.ZipFile(path) as archive:
            problems = (_pickle_problem(archive.read(entry), max_items) for entry in pickles)
            problem = next((p for p in problems if p), None)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, IndexError, KeyError, TypeError) as e:
        raise CheckpointError(f"{path} is truncated or corrupt ({_first_line(e)}); re-copy or re-create it") from None
    if problem:
        raise CheckpointError(f"refused to load {path}: its pickle {problem}")


class _Item:
    """What the pickle walk knows of a stack item other than text, an int or a tuple: its type, a global's dotted
    name (for what a call returns, the function's), whether it is a mapping (its keys were checked as it was
    filled), its entries so far, and for a list the type of its first element that is not a safe key, or not a
    pair with a safe key."""

    __slots__ = ("type", "name", "mapping", "size", "bad_key", "bad_pair")

    def __init__(self, type_: str, name: str = "", mapping: bool = False) -> None:
        self.type, self.name, self.mapping = type_, name, mapping
        self.size, self.bad_key, self.bad_pair = 0, None, None


_HASHING_CALLS = {"builtins.set": "set element", "builtins.frozenset": "set element",
                  "collections.Counter": "dictionary key", "collections.OrderedDict": "dictionary key"}
_LINEAR_CODECS = {"latin1", "latin-1", "latin_1", "iso-8859-1", "ascii", "utf-8", "utf8", "utf_8"}
_REBUILD_FROM_TYPE = "torch._tensor._rebuild_from_type_v2"  # calls its first argument with its third
_WHY_KEYS = ("; weights and checkpoints key their data by names (and small numbers), and other keys can be "
             "chosen to share one hash, which stalls the reader for minutes")


def _type_name(item: object) -> str:
    return item.type if isinstance(item, _Item) else type(item).__name__


def _key_type(item: object) -> str | None:
    """None for a safe dictionary key (text, or an int under ``MAX_PICKLE_KEY``); otherwise its type's name."""
    if type(item) is str or (type(item) is int and -MAX_PICKLE_KEY < item < MAX_PICKLE_KEY):
        return None
    return "int of 2**31 or more in size" if type(item) is int else _type_name(item)


def _pair_type(item: object) -> str | None:
    """None for a (safe key, value) pair, as a dict's update takes them; otherwise the offending type."""
    return _key_type(item[0]) if type(item) is tuple and len(item) == 2 else _type_name(item)


def _first(check, items) -> str | None:
    return next((problem for problem in map(check, items) if problem), None)


def _elements_problem(items: object, pairs: bool) -> str | None:
    """The type of the first element that a set, Counter or dict built from ``items`` would hash unsafely, or
    None."""
    if type(items) is str or (isinstance(items, _Item) and items.mapping):
        return None  # characters, or keys that were checked as the mapping was filled
    if type(items) is tuple:
        return _first(_pair_type if pairs else _key_type, items)
    if isinstance(items, _Item) and items.type == "list":
        return items.bad_pair if pairs else items.bad_key
    return _type_name(items)


def _size(items: object) -> int:
    return items.size if isinstance(items, _Item) else len(items) if type(items) in (tuple, str) else 0


def _call_problem(function: object, args: object) -> tuple[str | None, int]:
    """Why calling ``function`` (an allowed global) with ``args`` could stall the unpickler, or None; and the
    entries the call fills."""
    while True:
        if type(args) is not tuple:
            return "calls a function with arguments that are not a tuple, which pickle never writes", 0
        name = function.name if isinstance(function, _Item) and function.type == "global" else ""
        if name != _REBUILD_FROM_TYPE or len(args) < 3:
            break
        function, args = args[0], args[2]
    if name in _HASHING_CALLS and args:
        problem = _elements_problem(args[0], pairs=name == "collections.OrderedDict") if len(args) == 1 else "tuple"
        return problem and f"has a {_HASHING_CALLS[name]} of type {problem}{_WHY_KEYS}", _size(args[0])
    if name == "builtins.bytearray" and args and type(args[0]) is int:
        return f"asks for a bytearray of {args[0]:,} bytes; torch.save stores bytes as text", 0
    if name in ("_codecs.encode", "builtins.bytearray") and len(args) > 1 and not (
            type(args[1]) is str and args[1].lower() in _LINEAR_CODECS):  # bytearray(text, codec) encodes too
        codec = repr(args[1][:40]) if type(args[1]) is str else f"a {_type_name(args[1])}"
        return f"encodes text with the codec {codec}, which can take minutes; torch.save uses 'latin1'", 0
    return None, 0


def _state_problem(state: object) -> str | None:
    """Why BUILD with ``state`` could stall the unpickler, or None: it updates an object's ``__dict__`` from the
    state (or from each half of a (state, slots) pair), hashing its keys."""
    def settled(part: object) -> bool:
        return isinstance(part, _Item) and (part.mapping or part.type == "None")

    if settled(state) or (type(state) is tuple and len(state) == 2 and all(map(settled, state))):
        return None
    problem = _elements_problem(state, pairs=True)
    return problem and f"has a dictionary key of type {problem}{_WHY_KEYS}"


def _pop(stack: list, count: int) -> list:
    if count > len(stack):
        raise IndexError("the pickle pops more than its stack holds")
    items = stack[len(stack) - count:]
    del stack[len(stack) - count:]
    return items


def _pickle_problem(data: bytes, max_items: int) -> str | None:
    """Why unpickling ``data`` could stall the reader, or None; read before anything is unpickled.

    A dictionary or set whose keys share one hash takes quadratic time to fill: Python hashes ints, floats and
    tuples of them deterministically (``hash(k * (2**61 - 1)) == 0``), so 780 KB of such keys took torch's
    weights-only unpickler 87 s. The opcodes are walked with ``pickletools.genops`` (nothing is built or run)
    over a stack of what each item is, the way ``pickletools.dis`` tracks it, and every key that would be hashed,
    by SETITEMS or by a call to ``set``, ``Counter`` or ``OrderedDict`` or a BUILD, must be text or a small int.
    The dict entries and containers built are counted (at most ``max_items``: a flood of them costs the unpickler
    seconds and memory), and the allowed calls that do unbounded work from a few bytes are refused: ``bytearray(n)``
    and text encoded with a slow codec (punycode is quadratic). Malformed opcodes raise ValueError, IndexError or
    KeyError.
    """
    stack: list = []
    marks: list[list] = []
    memo: dict = {}
    built = 0  # dict entries and containers
    for opcode, arg, _ in pickletools.genops(data):
        group, problem = _OPCODE_GROUPS[opcode.name], None
        if group == "get":
            stack.append(memo[arg])
        elif group == "put":
            memo[arg if arg is not None else len(memo)] = stack[-1]  # MEMOIZE takes the next index
        elif group == "value":  # text and ints are kept as they are; keys and codec names are read from them
            stack.append(arg if type(arg) in (int, str) else _SHARED_ITEMS[opcode.name])
        elif group == "push":  # one item of a known type: containers are followed as they fill, the rest shared
            shared = _SHARED_ITEMS.get(opcode.name)
            if shared is None:
                built += 1
            stack.append(shared or _Item(opcode.stack_after[0].name, mapping=opcode.name == "EMPTY_DICT"))
        elif group == "mark":
            built += 1
            marks.append(stack)
            stack = []
        elif group == "setitems":
            name = opcode.name
            items, stack = (_pop(stack, 2), stack) if name == "SETITEM" else (stack, marks.pop())
            is_set = name in ("ADDITEMS", "FROZENSET")
            keys = items if is_set else items[::2]
            built += len(keys)
            problem = _first(_key_type, keys)
            if problem:
                return f"has a {'set element' if is_set else 'dictionary key'} of type {problem}{_WHY_KEYS}"
            if name in ("DICT", "FROZENSET"):
                built += 1
                stack.append(_Item(opcode.stack_after[0].name, mapping=name == "DICT"))
            if isinstance(stack[-1], _Item) and (stack[-1].mapping or stack[-1].type == "set"):
                stack[-1].size += len(keys)
        elif group == "append":
            items, stack = (_pop(stack, 1), stack) if opcode.name == "APPEND" else (stack, marks.pop())
            if opcode.name == "LIST":
                built += 1
                stack.append(_Item("list"))
            target = stack[-1]
            if isinstance(target, _Item) and target.type == "list":
                target.size += len(items)
                target.bad_key = target.bad_key or _first(_key_type, items)
                target.bad_pair = target.bad_pair or _first(_pair_type, items)
        elif group == "tuple":
            items, stack = (stack, marks.pop()) if opcode.name == "TUPLE" else (
                _pop(stack, len(opcode.stack_before)), stack)
            built += 1
            stack.append(tuple(items))
        elif group == "global":
            module, attribute = arg.split(" ", 1) if opcode.name == "GLOBAL" else map(str, _pop(stack, 2))
            if (module, attribute) in NAME_MAPPING:
                module, attribute = NAME_MAPPING[module, attribute]
            else:
                module = IMPORT_MAPPING.get(module, module)
            stack.append(_Item("global", f"{module}.{attribute}"))
        elif group == "call":
            function, args = _pop(stack, len(opcode.stack_before))[:2]
            problem, filled = _call_problem(function, args)
            built += filled + 1
            called = function.name if isinstance(function, _Item) else ""
            stack.append(_Item(called.rpartition(".")[2] or "object", called,
                               mapping=called in ("collections.OrderedDict", "collections.Counter")))
        elif group == "build":
            state = _pop(stack, 1)[0]
            problem = _state_problem(state)
            built += _size(state)
        else:  # the rest pop and push items the walk does not follow
            before = opcode.stack_before
            if group == "marked":
                stack = marks.pop()
                before = before[:before.index(pickletools.markobject)]
            popped = _pop(stack, len(before))
            stack += popped * 2 if opcode.name == "DUP" else [_SHARED_ITEMS["any"]] * len(opcode.stack_after)
        if problem:
            return problem
        if built > max_items:
            return (f"builds over {max_items:,} dictionary entries and containers, more than weights and checkpoints "
                    "of its size hold; it may be built to stall the reader")
    return None


def _opcode_group(opcode: pickletools.OpcodeInfo) -> str:
    for group, names in (("get", "GET BINGET LONG_BINGET"), ("put", "PUT BINPUT LONG_BINPUT MEMOIZE"),
                         ("mark", "MARK"), ("setitems", "SETITEM SETITEMS DICT ADDITEMS FROZENSET"),
                         ("append", "APPEND APPENDS LIST"), ("tuple", "TUPLE TUPLE1 TUPLE2 TUPLE3 EMPTY_TUPLE"),
                         ("global", "GLOBAL STACK_GLOBAL"), ("call", "REDUCE NEWOBJ NEWOBJ_EX"), ("build", "BUILD")):
        if opcode.name in names.split():
            return group
    pushes = [a.name for a in opcode.stack_after]
    if not opcode.stack_before and pushes in (["int"], ["int_or_bool"], ["str"], ["bytes_or_str"]):
        return "value"
    if not opcode.stack_before and len(pushes) == 1:
        return "push"
    return "marked" if pickletools.markobject in opcode.stack_before else "other"


_OPCODE_GROUPS = {opcode.name: _opcode_group(opcode) for opcode in pickletools.opcodes}
# One item for every push of a type the walk does not follow (a float, None, a persistent id...): millions of
# one-byte opcodes then cost no allocation. Lists, dicts and sets get their own, as they are filled.
_SHARED_ITEMS = {opcode.name: _Item(opcode.stack_after[0].name) for opcode in pickletools.opcodes
                 if _OPCODE_GROUPS[opcode.name] in ("value", "push")
                 and opcode.stack_after[0].name not in ("list", "dict", "set")} | {"any": _Item("any")}


def safetensors_shapes(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every tensor of a ``.safetensors`` file as a ``meta`` tensor (name, dtype, shape), from its header alone.

    The header is checked before anything else is read: at most ``MAX_SAFETENSORS_HEADER_BYTES`` and
    ``MAX_TENSORS`` entries, known dtypes, at most ``MAX_TENSOR_DIMS`` dimensions, and each tensor's bytes
    exactly where the header says, inside the file. Callers compare these names and shapes with the model
    before reading any data, so a file declaring a 3 GB tensor the model has no place for costs nothing.
    Raises CheckpointError with one line.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            prefix = f.read(8)
            length = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
            if not 2 <= length <= min(MAX_SAFETENSORS_HEADER_BYTES, size - 8):
                raise CheckpointError(
                    f"{path} is not a readable safetensors file (its header declares {length:,} bytes; a file of "
                    f"{size:,} bytes holds at most {min(MAX_SAFETENSORS_HEADER_BYTES, max(size - 8, 0)):,})")
            text = f.read(length)
    except OSError as e:
        raise CheckpointError(f"cannot read {path} ({e.strerror or type(e).__name__})") from None
    try:
        header = json.loads(text.decode("utf-8"))
    except RecursionError:
        raise CheckpointError(f"{path} is not a readable safetensors file (its header is nested too deeply)") from None
    except ValueError as e:  # also UnicodeDecodeError
        raise CheckpointError(f"{path} is not a readable safetensors file (its header is not JSON: "
                              f"{_first_line(e)})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path} is not a readable safetensors file (its header is not a JSON object)")
    header.pop("__metadata__", None)
    if len(header) > MAX_TENSORS:
        raise CheckpointError(f"refused to load {path}: it lists {len(header):,} tensors, more than the "
                              f"{MAX_TENSORS:,} any model this program opens has")
    data_bytes = size - 8 - length
    shapes = {}
    for name, entry in header.items():
        problem = _safetensors_entry_problem(entry, data_bytes)
        if problem:
            raise CheckpointError(f"{path} is not a readable safetensors file (tensor {name[:80]!r}: {problem})")
        shapes[name] = torch.empty(entry["shape"], dtype=SAFETENSORS_DTYPES[entry["dtype"]], device="meta")
    return shapes


def _safetensors_entry_problem(entry: object, data_bytes: int) -> str | None:
    if not isinstance(entry, dict) or entry.get("dtype") not in SAFETENSORS_DTYPES:
        return "not a tensor of a known dtype"
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if not isinstance(shape, list) or len(shape) > MAX_TENSOR_DIMS or not all(
            type(n) is int and n >= 0 for n in shape):
        return f"its shape must be at most {MAX_TENSOR_DIMS} sizes >= 0"
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(type(n) is int for n in offsets):
        return "its data offsets must be two numbers"
    begin, end = offsets
    numel = 1
    for n in shape:
        numel *= n
    if not 0 <= begin <= end <= data_bytes or end - begin != numel * SAFETENSORS_DTYPES[entry["dtype"]].itemsize:
        return f"its data ({begin:,} to {end:,}) does not match its shape {shape} or lies outside the file"
    return None


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
        raise CheckpointError(f"{path} is truncated or corrupt ({_first_line(e)}); "
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
        raise CheckpointError(f"{path} has an invalid config: {_first_line(e)}") from None
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


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    line = text[0] if text else type(error).__name__
    if len(line) > 160:  # torch appends paragraphs of advice; its first sentence says what failed
        line = line.split(". ", 1)[0]
    return line if len(line) <= 160 else line[:157] + "..."


def _mismatch_summary(error: RuntimeError) -> str:
    lines = [line.strip() for line in str(error).splitlines()[1:] if line.strip()]
    return _clip("; ".join(lines) or _first_line(error))


def _clip(text: str, limit: int = 300) -> str:
    return text if len(text) < limit else text[:limit - 3] + "..."
