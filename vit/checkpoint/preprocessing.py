"""How an image becomes a model's input (``Preprocessing``: resize, crop, normalise, as the model's library did it),
stored in every checkpoint, and the check that one fits a model's config (``preprocessing_problem``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vit.model import ViTConfig

# Bounds checked before anything is built, so a hostile file costs milliseconds, not minutes.
MAX_PREPROCESSING_PATCHES = 4096  # a 64 x 64 grid; larger than the model's own input needs no more
MAX_SMART_PIXELS = 2**26  # Qwen2.5-VL's processors allow up to 12,845,056 (3,584²); the token gate bounds the work

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
