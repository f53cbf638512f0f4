"""How an HF folder's images are prepared: its ``preprocessor_config.json`` read with every value checked
(``hf_preprocessing``), the family's documented defaults where it has none, resized by the backend
``VIT_HF_IMAGE_BACKEND`` names (``hf_backend``): Qwen-VL's ``smart_resize``, SigLIP 2's NaFlex budget, SAM's
longest-edge padding, the crops of DeiT, DINOv2, CLIP and the video processors."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import replace

from vit.checkpoint import BACKENDS, IMAGENET_MEAN, IMAGENET_STD, Preprocessing
from vit.core.images import smart_resize
from vit.model import ViTConfig
from vit.sources.files import SourceError, _one_line
from vit.sources.ports.families import import_clip

_PIL_FILTERS = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic"}  # HF stores PIL's enum values
MAX_MULTIPLE = 2048  # px: DPT's ensure_multiple_of, at most a side
# Which of transformers' two processors an HF folder's images are prepared as (hf_backend)
HF_BACKEND_ENV = "VIT_HF_IMAGE_BACKEND"
# The processor's defaults (Qwen2VLImageProcessor): 56 x 56 to 28 x 28 x 1280 pixels
QWEN_MIN_PIXELS, QWEN_MAX_PIXELS = 56 * 56, 28 * 28 * 1280
# px: a Qwen-VL tower sizes each image by itself; the size its checkpoint names is what its processor makes of a
# square of this side (``qwen_nominal_size``), on both roads (the port, ``import_qwen``; ``merged_towers``)
QWEN_NOMINAL_SIDE = 1024


def _side(value) -> int | None:
    """224, {"height": 224, "width": 224} or {"shortest_edge": 224} -> 224 (square only)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, Mapping):
        if "shortest_edge" in value:
            return _side(value["shortest_edge"])
        if value.get("height") == value.get("width"):
            return _side(value.get("height"))
    return None


class SettingError(ValueError):
    """A preprocessor_config.json setting that cannot be read, its message saying how to set it: removing the file
    would prepare the images otherwise (the family's defaults), so the refusal does not suggest it."""


def _crop_side(value) -> int | tuple[int, int] | None:
    """``_side``, or ``(height, width)`` for a non-square ``{"height": ..., "width": ...}`` (VideoMAE's frames)."""
    side = _side(value)
    if side is None and isinstance(value, Mapping) and all(isinstance(value.get(k), int) and not isinstance(
            value.get(k), bool) for k in ("height", "width")):
        return value["height"], value["width"]
    return side


def hf_backend() -> str:
    """How an HF folder's images are resized: ``"torchvision"``, as transformers 5's ``*ImageProcessor``, the class
    its ``AutoImageProcessor`` gives for every folder (whichever of the two the folder names: both save the same
    ``image_processor_type``), unless ``VIT_HF_IMAGE_BACKEND=pil`` asks for its ``*ImageProcessorPil``."""
    value = os.environ.get(HF_BACKEND_ENV, "").strip().lower() or "torchvision"
    if value not in BACKENDS:
        raise SourceError(f"{HF_BACKEND_ENV}={value[:40]!r} is not a resize backend; set it to pil or torchvision "
                          "(the default), or unset it")
    return value


def hf_preprocessing(processor: Mapping | None, config: ViTConfig, architecture: str) -> Preprocessing:
    """HF's image processor settings (``preprocessor_config.json``), else the family's documented defaults:
    ViT resizes to its size bilinearly with mean/std 0.5; DeiT resizes to 256/224 of it and crops, bicubic,
    ImageNet statistics; DINOv2 resizes the shorter side to 256 and crops 224, bicubic, ImageNet statistics.
    Resized as ``hf_backend`` says."""
    backend = hf_backend()
    if config.spatial_merge:  # Qwen-VL: smart_resize, each image at its aspect between min and max pixels
        try:
            return replace(_qwen_preprocessing(processor, config), backend=backend)
        except (ValueError, TypeError, KeyError, ArithmeticError) as e:
            raise SourceError(f"preprocessor_config.json cannot be used ({_one_line(e)}); fix or remove it") from None
    if config.max_num_patches:  # NaFlex: no fixed size; the processor's patch budget per image
        try:
            return replace(_naflex_preprocessing(processor or {}, config), backend=backend)
        except (ValueError, TypeError, KeyError, ArithmeticError) as e:
            raise SourceError(f"preprocessor_config.json cannot be used ({_one_line(e)}); fix or remove it") from None
    if processor:
        try:
            return replace(_processor_preprocessing(processor, config), backend=backend)
        except SettingError as e:  # its own advice: removing the file is none
            raise SourceError(f"preprocessor_config.json cannot be used ({e})") from None
        except (ValueError, TypeError, KeyError, ArithmeticError) as e:
            raise SourceError(f"preprocessor_config.json cannot be used ({_one_line(e)}); fix or remove it") from None
    return replace(_default_preprocessing(config, architecture), backend=backend)


def whole_patches(preprocessing: Preprocessing, config: ViTConfig, declared: int | None) -> Preprocessing:
    """``preprocessing`` for a model whose input side is no whole number of patches (``declared``, the config.json's
    side; SigLIP so400m's 384 px in 14-px patches): its patch convolution never reads the pixels past the last whole
    patch, so our model, built at the patches' ``config.image_size`` (378 px), is fed the library's straight resize to
    the declared side cropped at the top left (``crop_rule="top_left"``, as tintn's stride-P convolution sees an image):
    the same numbers, and every map drawn over exactly the pixels the patches cover. Any other preprocessing as it is
    (a centre crop's offset would move with the crop)."""
    side, patch = config.image_size, config.patch_size
    if not (isinstance(side, int) and isinstance(patch, int)) or preprocessing.resize_size is not None:
        return preprocessing
    resized = preprocessing.image_size if preprocessing.image_size != side else declared
    if not isinstance(resized, int) or not side < resized < side + patch:
        return preprocessing
    return replace(preprocessing, image_size=side, resize_size=resized, resize_mode="square", crop_rule="top_left")


def channel_numbers(value, name: str, channels: int) -> tuple[float, ...]:
    """A per-channel statistic: a list of finite numbers (at least one per channel), or one number for all."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value] * channels
    if not isinstance(value, (list, tuple)) or not 1 <= len(value) <= 16 \
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value):
        raise ValueError(f"{name} must be a list of numbers, got {str(value)[:40]}")
    if len(value) < channels:
        raise ValueError(f"{name} has {len(value)} values for {channels} channels")
    return tuple(float(v) for v in value)[:channels]


def _rescaled(processor: Mapping, mean: tuple[float, ...], std: tuple[float, ...]):
    """``(mean, std)`` as ``Preprocessing`` applies them to pixels in [0, 1] (``p / 255``), for a processor that
    rescales by ``rescale_factor`` (not 1/255: ViViT's 1/127.5), shifts by -1 after it (``offset``: ViViT's) or does
    not rescale: ``(p r - o - m) / s`` is ``(p / 255 - (o + m) / 255r) / (s / 255r)``."""
    rescale = processor.get("rescale_factor", 1 / 255) if processor.get("do_rescale", True) else 1.0
    if isinstance(rescale, bool) or not isinstance(rescale, (int, float)) or not 0 < rescale <= 1:
        raise ValueError(f"rescale_factor must be a number in (0, 1], got {str(rescale)[:40]}")
    offset = 1.0 if processor.get("offset") and processor.get("do_rescale", True) else 0.0
    if rescale == 1 / 255 and not offset:
        return mean, std
    scale = 255 * rescale
    return tuple((offset + m) / scale for m in mean), tuple(v / scale for v in std)


def _processor_preprocessing(processor: Mapping, config: ViTConfig) -> Preprocessing:
    """``preprocessor_config.json``'s settings, every value checked before use."""
    channels = config.num_channels
    mean = processor.get("image_mean", (0.5,) * channels) if processor.get("do_normalize", True) else (0.0,) * 3
    std = processor.get("image_std", (0.5,) * channels) if processor.get("do_normalize", True) else (1.0,) * 3
    mean, std = channel_numbers(mean, "image_mean", channels), channel_numbers(std, "image_std", channels)
    if not all(s > 0 for s in std):
        raise ValueError("image_std must be positive")
    mean, std = _rescaled(processor, mean, std)
    size = _side(processor.get("size")) or config.image_size
    shortest = isinstance(processor.get("size"), Mapping) and "shortest_edge" in processor["size"]
    crop = _crop_side(processor.get("crop_size")) if processor.get("do_center_crop") else None
    resample = processor.get("resample")
    if isinstance(resample, bool) or not isinstance(resample, (int, str, type(None))):
        raise ValueError(f"resample must be a PIL filter number, got {str(resample)[:40]}")
    resample = _PIL_FILTERS.get(resample, "bilinear")
    if not processor.get("do_resize", True):
        size, shortest = crop or config.image_size, False
    elif _is_sam_processor(processor):  # SamImageProcessor: the longer side to longest_edge, padded to pad_size
        longest = processor["size"]["longest_edge"]
        pad = processor.get("pad_size", {"height": 1024, "width": 1024})
        if not isinstance(pad, Mapping) or not all(isinstance(pad.get(k), int) and not isinstance(pad.get(k), bool)
                                                   for k in ("height", "width")):
            raise ValueError(f"pad_size must be {{'height': ..., 'width': ...}} in pixels, got {str(pad)[:40]}")
        if isinstance(longest, bool) or not isinstance(longest, int):
            raise ValueError(f"size's longest_edge must be a whole number of pixels, got {str(longest)[:40]}")
        return Preprocessing((pad["height"], pad["width"]), channels, tuple(mean)[:channels], tuple(std)[:channels],
                             resize_size=longest, resize_mode="longest_edge_pad", resample=resample)
    if processor.get("keep_aspect_ratio") and processor.get("do_resize", True) and not crop:  # DPT's, at its aspect
        multiple = processor.get("ensure_multiple_of", 1)
        if isinstance(multiple, bool) or not isinstance(multiple, int) or not 1 <= multiple <= MAX_MULTIPLE:
            raise SettingError(f"ensure_multiple_of must be a whole number of pixels from 1 to {MAX_MULTIPLE}, got "
                               f"{str(multiple)[:40]}; set it to one in the file (the Hub's ZoeDepth folders say 32; "
                               "transformers 5's ZoeDepthImageProcessor writes its class default, 1/32): removed, the "
                               "file's aspect-keeping resize would be lost")
        return Preprocessing(size, channels, tuple(mean)[:channels], tuple(std)[:channels], resample=resample,
                             multiple_of=multiple)
    if crop:
        return Preprocessing(crop, channels, tuple(mean)[:channels], tuple(std)[:channels], resize_size=size,
                             resize_mode="shortest_edge" if shortest else "square", resample=resample,
                             crop_rule="transformers")
    hw = _crop_side(processor.get("size"))  # a {"height", "width"} size that is not square: as the processor sizes
    return Preprocessing(hw if isinstance(hw, tuple) else size, channels, tuple(mean)[:channels],
                         tuple(std)[:channels], resample=resample)


def _is_sam_processor(processor: Mapping) -> bool:
    """SamImageProcessor's settings: ``size`` a longest edge alone, and padding to ``pad_size`` (``do_pad``, which
    it writes; its default for a file that names the class). Without the padding images would come out at their own
    shapes, which SAM's fixed grid does not take; such a file keeps the square resize."""
    size = processor.get("size")
    sam = str(processor.get("image_processor_type", "")).startswith("SamImageProcessor")
    return (isinstance(size, Mapping) and "longest_edge" in size and "shortest_edge" not in size
            and bool(processor.get("do_pad", sam)))


def _naflex_preprocessing(processor: Mapping, config: ViTConfig) -> Preprocessing:
    """``Siglip2ImageProcessor``'s settings (its defaults where the file has none: bilinear, mean/std 0.5, the
    model's own patch budget): each image resized to its NaFlex size, without a crop."""
    channels = config.num_channels
    mean = channel_numbers(processor.get("image_mean", 0.5), "image_mean", channels)
    std = channel_numbers(processor.get("image_std", 0.5), "image_std", channels)
    budget = processor.get("max_num_patches", config.max_num_patches)
    patch = processor.get("patch_size", config.patch_size)
    for name, value in (("max_num_patches", budget), ("patch_size", patch)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive whole number, got {str(value)[:40]}")
    if patch != config.patch_size:
        raise ValueError(f"patch_size {patch} differs from the model's {config.patch_size}")
    resample = _PIL_FILTERS.get(processor.get("resample", 2), "bilinear")
    return Preprocessing(config.image_size, channels, mean, std, resample=resample, max_num_patches=budget,
                         patch_size=patch)


def _default_preprocessing(config: ViTConfig, architecture: str) -> Preprocessing:
    """The family's documented defaults, for a folder without ``preprocessor_config.json``."""
    channels, side = config.num_channels, config.image_size
    if architecture.startswith("Dinov2"):
        crop = 224 if 224 % config.patch_size == 0 else side
        return Preprocessing(crop, channels, IMAGENET_MEAN[:channels], IMAGENET_STD[:channels],
                             resize_size=crop * 256 // 224, resize_mode="shortest_edge", resample="bicubic",
                             crop_rule="transformers")
    if architecture.startswith("DINOv3"):  # DINOv3ViTImageProcessor: 224 square, bilinear, ImageNet statistics
        return Preprocessing(224 - 224 % config.patch_size, channels, IMAGENET_MEAN[:channels],
                             IMAGENET_STD[:channels], resample="bilinear")
    # CLIPImageProcessor (AIMv2's too): shorter side 224, centre crop, bicubic, OpenAI statistics
    if architecture.startswith(("CLIP", "Aimv2")):
        return Preprocessing(side, channels, import_clip.OPENAI_MEAN[:channels], import_clip.OPENAI_STD[:channels],
                             resize_size=side, resize_mode="shortest_edge", resample="bicubic",
                             crop_rule="transformers")
    if architecture.startswith("Siglip"):  # SiglipImageProcessor: 224 square, bicubic (its class's resample), 0.5
        return Preprocessing(side, channels, (0.5,) * channels, (0.5,) * channels, resample="bicubic")
    # Sam2ImageProcessor: 1024 square, bilinear, ImageNet statistics. SamImageProcessor: the same statistics and
    # filter, its longest edge resized to the model's side (1024) and padded with zeros to that square.
    if architecture.startswith("Sam2"):
        return Preprocessing(side, channels, IMAGENET_MEAN[:channels], IMAGENET_STD[:channels], resample="bilinear")
    if architecture.startswith("Sam"):
        return Preprocessing(side, channels, IMAGENET_MEAN[:channels], IMAGENET_STD[:channels], resize_size=side,
                             resize_mode="longest_edge_pad", resample="bilinear")
    if architecture.startswith("InternVL"):  # InternVL's build_transform: the tile's square, bicubic, ImageNet's
        return Preprocessing(side, channels, IMAGENET_MEAN[:channels], IMAGENET_STD[:channels], resample="bicubic")
    if architecture.startswith(("Beit", "Data2VecVision")):  # BeitImageProcessor: 224 square, bicubic, mean/std 0.5
        return Preprocessing(side, channels, (0.5,) * channels, (0.5,) * channels, resample="bicubic")
    if architecture.startswith("VideoMAE"):  # VideoMAEImageProcessor: the short side to 224, crop, bilinear, 0.5
        return Preprocessing(side, channels, (0.5,) * channels, (0.5,) * channels, resize_size=min(config.image_hw),
                             resize_mode="shortest_edge", resample="bilinear", crop_rule="transformers")
    if architecture.startswith("Timesformer"):  # TimesformerVideoProcessor: the short side to 224, crop, ImageNet's
        return Preprocessing(side, channels, IMAGENET_MEAN[:channels], IMAGENET_STD[:channels],
                             resize_size=min(config.image_hw), resize_mode="shortest_edge", resample="bilinear",
                             crop_rule="transformers")
    if architecture.startswith("VJEPA2"):  # VJEPA2VideoProcessor: the short side to crop * 256 / 224, crop, ImageNet's
        return Preprocessing(side, channels, IMAGENET_MEAN[:channels], IMAGENET_STD[:channels],
                             resize_size=int(side * 256 / 224), resize_mode="shortest_edge", resample="bilinear",
                             crop_rule="transformers")
    if architecture.startswith("DeiT"):
        return Preprocessing(side, channels, IMAGENET_MEAN[:channels], IMAGENET_STD[:channels],
                             resize_size=side * 256 // 224, resize_mode="square", resample="bicubic",
                             crop_rule="transformers")
    return Preprocessing(side, channels, (0.5,) * channels, (0.5,) * channels, resample="bilinear")


def qwen_nominal_size(unit: int, min_pixels: int = 0, max_pixels: float = math.inf) -> tuple[int, int]:
    """What Qwen-VL's image processor makes of a ``QWEN_NOMINAL_SIDE`` px square, as transformers'
    ``Qwen2VLImageProcessor`` sizes every image (``smart_resize`` with ``factor`` its merge unit, ``unit`` px, and its
    ``min_pixels`` / ``max_pixels``): the size a Qwen tower's checkpoint names. Without bounds (a config read from
    config.json alone, before any processor): the square's sides rounded to whole units."""
    return smart_resize(QWEN_NOMINAL_SIDE, QWEN_NOMINAL_SIDE, unit, min_pixels, max_pixels)


def _qwen_preprocessing(processor: Mapping | None, config: ViTConfig) -> Preprocessing:
    """``Qwen2VLImageProcessor``'s settings (its defaults where the file has none): bicubic, OpenAI's statistics, each
    image ``smart_resize``d to sides of whole merge units between ``min_pixels`` and ``max_pixels`` pixels (read from
    ``size``'s ``shortest_edge`` / ``longest_edge``, or the older top-level ``min_pixels`` / ``max_pixels``); its
    ``image_size`` the nominal one (``qwen_nominal_size``)."""
    processor = dict(processor or {})
    size = processor.get("size") if isinstance(processor.get("size"), Mapping) else {}
    low = processor.get("min_pixels", size.get("shortest_edge", QWEN_MIN_PIXELS))
    high = processor.get("max_pixels", size.get("longest_edge", QWEN_MAX_PIXELS))
    for name, value in (("min_pixels", low), ("max_pixels", high)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive whole number of pixels, got {str(value)[:40]}")
    patch, merge = processor.get("patch_size", config.patch_hw[0]), processor.get("merge_size", config.spatial_merge)
    if (patch, merge) != (config.patch_hw[0], config.spatial_merge):
        raise ValueError(f"patch_size {patch} and merge_size {merge} differ from the model's "
                         f"{config.patch_hw[0]} and {config.spatial_merge}")
    channels = config.num_channels
    mean = channel_numbers(processor.get("image_mean", import_clip.OPENAI_MEAN), "image_mean", channels)
    std = channel_numbers(processor.get("image_std", import_clip.OPENAI_STD), "image_std", channels)
    resample = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic"}.get(processor.get("resample", 3), "bicubic")
    side = qwen_nominal_size(patch * merge, low, high)  # named only: each image is sized by itself
    return Preprocessing(side[0] if side[0] == side[1] else side, channels, mean, std, resample=resample,
                         patch_size=patch * merge, min_pixels=low, max_pixels=high)
