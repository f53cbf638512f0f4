"""Turning any image a user brings into the model's input, identically at training and inference.

``open_image`` decodes files and uploads (one error type for everything that cannot be
used), reduced at decode to ``MAX_SIDE`` so that no photo costs more memory than display and
model need; ``to_uint8`` applies the evaluation transform shared by the data cache, the CLIs
and the app: EXIF orientation, first frame, transparency composited on white, colour or
greyscale per the model, and a resize to the model's input (a centre crop after it where the model's library
crops; SAM's: its longer side, then padding), by PIL or, as transformers 5's ``*ImageProcessor`` does, by
torchvision on uint8 tensors (``vit.checkpoint.BACKENDS``).
"""

from __future__ import annotations

import functools
import io
import math
import os
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from vit.core.threads import WhileAny

# Decoded images keep at most this long side: twice the largest model input (1,024 px), three times
# the largest display. A 48-MP photo then holds 2048 x 1536 px (9 MB) instead of 144 MB.
MAX_SIDE = 2048
# Uploads to the app: at most this many pixels once decoded; a PNG this size still costs 160 MB while it is
# decoded. JPEGs larger than MAX_SIDE are decoded already reduced (1/2 to 1/8 a side), so photos up to PIL's
# hard limit pass (twice Image.MAX_IMAGE_PIXELS: 179 M pixels; a 200-MP photo does not); what is decoded
# never exceeds Image.MAX_IMAGE_PIXELS (89 M pixels), whatever the format.
UPLOAD_MAX_PIXELS = 40_000_000
# Longest side over shortest side: a 197-byte 40000x1 PNG resized to a 256-px short side would be 10 G pixels.
# Panoramas stay far below; beyond this the image is refused before it is decoded.
MAX_ASPECT = 64
# Pixels an evaluation transform may resize an image to before its centre crop (64 MB of RGB).
MAX_RESIZED_PIXELS = 4096 * 4096
MAX_RESIZED_SIDE = 4096  # px: a side an own-size resize (DPT's keep-aspect) may bring an image to
# Full-size decodes running at once: five users uploading big images hold two of them, not five.
_DECODE_SLOTS = threading.BoundedSemaphore(2)


def _warnings_off() -> Callable[[], None]:
    caught = warnings.catch_warnings()
    caught.__enter__()
    warnings.simplefilter("ignore")
    return lambda: caught.__exit__(None, None, None)


# The warning filters are the process's: off while any session decodes (each decode restoring what it found left
# them off for good once two overlapped).
_WARNINGS_OFF = WhileAny(_warnings_off)


class ImageError(ValueError):
    """An input that cannot be used as an image; the message says why."""


def open_image(source: str | os.PathLike | bytes | BinaryIO, name: str | None = None,
               max_pixels: int | None = None, max_side: int = MAX_SIDE) -> Image.Image:
    """Decode an image (first frame, EXIF orientation applied, long side at most ``max_side``) or raise ``ImageError``.

    ``max_pixels`` refuses images with more pixels once decoded; PIL's own bomb limit applies besides, to
    the pixels decoded: JPEGs are decoded directly at a reduced scale when they are larger than ``max_side``.
    """
    if isinstance(source, (str, os.PathLike)):
        name = name or str(source)
        if not Path(source).exists():
            raise ImageError(f"{name}: no such file")
        if not Path(source).is_file():
            raise ImageError(f"{name} is not a file; give the path of an image")
        try:
            data = Path(source).read_bytes()
        except OSError as e:
            raise ImageError(f"{name} cannot be read ({e.strerror or type(e).__name__})") from None
    elif isinstance(source, (bytes, bytearray)):
        data = bytes(source)
    else:
        data = source.read()
    name = name or "the image"
    if not data:
        raise ImageError(f"{name} is empty (0 bytes); choose an image file")
    # PIL warns about damaged metadata it skips; users see our one-line errors, not those. Its warning for images
    # between its pixel limit and twice it is judged in _decode, after a JPEG's reduced decode.
    with _WARNINGS_OFF():
        image = _decode(data, name, max_pixels, max_side)
        try:
            return ImageOps.exif_transpose(image)
        except Exception:  # a malformed EXIF block should not lose an otherwise good image
            return image


def check_aspect(name: str, width: int, height: int, error: type[ImageError] = ImageError) -> None:
    """``error`` (one line) for a ``width`` x ``height`` px image or frame more than ``MAX_ASPECT`` times as long as it
    is wide, before it is decoded (its resize to a model's short side would be that many times longer)."""
    if width and height and max(width, height) > MAX_ASPECT * min(width, height):
        raise error(f"{name} is {width:,}×{height:,} px, more than {MAX_ASPECT} times as long as it is wide; crop it "
                    "to a less extreme shape")


def _decode(data: bytes, name: str, max_pixels: int | None, max_side: int) -> Image.Image:
    try:
        image = Image.open(io.BytesIO(data))
        image.seek(0)
        check_aspect(name, *image.size)
        if max(image.size) > max_side:
            # JPEG's DCT scaling decodes at 1/2, 1/4 or 1/8 size directly; other formats ignore it.
            scale = max_side / max(image.size)
            image.draft(None, (math.ceil(image.width * scale), math.ceil(image.height * scale)))
        limit = Image.MAX_IMAGE_PIXELS  # over twice it, Image.open has refused already
        if limit is not None and image.width * image.height > limit:  # what is decoded, after draft()
            raise ImageError(f"{name} is too large to decode safely (over {limit:,} pixels); downscale it first")
        if max_pixels is not None and image.width * image.height > max_pixels:
            raise ImageError(f"{name} is too large ({image.width:,}×{image.height:,} px; at most "
                             f"{max_pixels:,} pixels); downscale it first")
        with _DECODE_SLOTS:
            image.load()
            reduce_to_side(image, max_side)
    except ImageError:
        raise
    except Image.DecompressionBombError:
        raise ImageError(f"{name} is too large to decode safely (over {2 * Image.MAX_IMAGE_PIXELS:,} "
                         "pixels); downscale it first") from None
    except UnidentifiedImageError:
        raise ImageError(f"{name} is not an image this program can read (jpg, png, webp, bmp, "
                         "gif, tiff)") from None
    except (OSError, ValueError, SyntaxError, EOFError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ImageError(f"{name} is truncated or corrupt ({reason}); re-export it") from None
    if image.width == 0 or image.height == 0:
        raise ImageError(f"{name} has no pixels")
    return image


def reduce_to_side(image: Image.Image, max_side: int = MAX_SIDE) -> Image.Image:
    """``image`` with its long side at most ``max_side``, as ``open_image`` reduces every decode: in place, so the
    EXIF orientation stays with the image; ``reduce()`` first, then Lanczos. Returns ``image``."""
    if max(image.size) > max_side:
        image.thumbnail((max_side, max_side), Image.Resampling.LANCZOS, reducing_gap=3.0)
    return image


def to_mode(image: Image.Image, num_channels: int) -> Image.Image:
    """RGB (3 channels) or L (1 channel), compositing transparency on white and scaling 16-bit."""
    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        pixels = np.asarray(image, dtype=np.float64)
        top = 65535.0 if image.mode != "F" or pixels.max(initial=0) > 1 else 1.0
        image = Image.fromarray(np.clip(pixels / top * 255.0 + 0.5, 0, 255).astype(np.uint8), "L")
    if image.mode == "P" or (image.mode in ("1", "L", "RGB") and "transparency" in image.info):
        # Palette and tRNS transparency become a real alpha channel, composited below.
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        image = Image.alpha_composite(white, rgba)
    return image.convert("RGB" if num_channels == 3 else "L")


def _hw(size: int | tuple[int, int]) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


def resized_size(image_size: tuple[int, int], resize_size: int | tuple[int, int],
                 resize_mode: str) -> tuple[int, int]:
    """``(width, height)`` an image is resized to before the centre crop or the padding (``to_uint8``'s rule).

    ``resize_size`` is a side, or ``(height, width)`` for ``"square"`` (stretched to it), ``"keep_ratio"``
    (timm's ``ResizeKeepRatio``: the aspect kept, scaled until it covers ``(height, width)``, each side rounded) and
    ``"border"`` (timm's crop_mode "border", ``ResizeKeepRatio(longest=1)``: scaled until it fits inside it)."""
    width, height = image_size
    if resize_mode == "longest_edge_pad":
        # SamImageProcessor._get_preprocess_shape: each side scaled by longest / max(h, w), rounded half up; at least
        # 1 px, where HF would make an empty side of a strip 130+ times as long as wide and fail
        scale = resize_size * 1.0 / max(width, height)
        return max(1, int(width * scale + 0.5)), max(1, int(height * scale + 0.5))
    if resize_mode in ("keep_ratio", "border"):
        target_h, target_w = _hw(resize_size)
        # timm's ratio with longest=0 (the side that covers its target first) or longest=1 (the side that fits
        # inside it last); a side rounded to 0 px, where timm's resize fails, keeps 1
        ratio = (min if resize_mode == "keep_ratio" else max)(height / target_h, width / target_w)
        size = max(1, round(width / ratio)), max(1, round(height / ratio))
    elif resize_mode != "shortest_edge":
        target_h, target_w = _hw(resize_size)
        return target_w, target_h
    else:
        short, long = min(width, height), max(width, height)
        new_long = int(resize_size * long / short)
        size = (resize_size, new_long) if width <= height else (new_long, resize_size)
    if size[0] * size[1] > MAX_RESIZED_PIXELS:  # checked before any pixel is resized
        raise ImageError(f"a {width:,}×{height:,}-px image resized to cover the model's input would be "
                         f"{size[0]:,}×{size[1]:,} px (at most {MAX_RESIZED_PIXELS:,} pixels); crop it to a "
                         "less extreme shape")
    return size


def crop_start(resized: int, crop: int, rule: str = "torchvision") -> int:
    """Where a centre crop of ``crop`` px starts in a side of ``resized`` px. When the margin is odd the libraries
    differ by one pixel: torchvision's ``center_crop`` rounds half the margin (to even: 25.5 -> 26, 24.5 -> 24), as
    timm and open_clip use it; transformers' image processors truncate it (``int((size - crop) / 2)``); ``top_left``
    starts at 0, as a stride-P convolution sees an image whose side is no multiple of P (tintn's)."""
    if rule == "top_left":
        return 0
    if rule == "transformers":
        return int((resized - crop) / 2)
    return int(round((resized - crop) / 2.0))


def border_start(resized: int, crop: int) -> int:
    """Where timm's ``CenterCropOrPad`` (crop_mode "border") starts a crop of ``crop`` px in a side of ``resized``
    px: negative where the side is padded, by half the shortfall, rounded down (the rest goes after); else the
    centre crop's start (``crop_start``, torchvision's rounding)."""
    return -((crop - resized) // 2) if crop > resized else crop_start(resized, crop)


def naflex_size(height: int, width: int, patch_size: int, max_num_patches: int, eps: float = 1e-5
                ) -> tuple[int, int]:
    """NaFlex's input ``(height, width)`` for an image of ``height x width`` px: the largest scale whose sides, each
    rounded up to whole patches (at least one), give at most ``max_num_patches`` patches; the same binary search over
    the scale as HF ``get_image_size_for_max_num_patches`` (SigLIP 2), so the grid is the one the model was trained
    on, step for step."""

    def scaled(scale: float, size: int) -> int:
        return max(patch_size, math.ceil(size * scale / patch_size) * patch_size)

    low, high = eps / 10, 100.0
    while high - low >= eps:
        scale = (low + high) / 2
        if (scaled(scale, height) / patch_size) * (scaled(scale, width) / patch_size) <= max_num_patches:
            low = scale
        else:
            high = scale
    return scaled(low, height), scaled(low, width)


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen-VL's input ``(height, width)`` for an image of ``height x width`` px (HF ``smart_resize``, step for step):
    each side rounded to a multiple of ``factor`` (a merge unit, 28 px), then scaled down or up, at the image's aspect
    ratio, so the area lies between ``min_pixels`` and ``max_pixels``. ImageError past Qwen's aspect bound (200)."""
    if max(height, width) / min(height, width) > 200:
        raise ImageError(f"a {width:,}×{height:,}-px image is more than 200 times as long as it is wide, which Qwen's "
                         "processor refuses; crop it to a less extreme shape")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def keep_aspect_multiple(height: int, width: int, target_hw: tuple[int, int], multiple: int) -> tuple[int, int]:
    """DPT's input ``(height, width)`` for an image of ``height x width`` px (HF ``DPTImageProcessor``'s
    ``get_resize_output_image_size`` with ``keep_aspect_ratio``, step for step): the one scale, of the two that bring
    a side to ``target_hw``, that is nearer 1 (the image scaled as little as it can be), then each side rounded to a
    multiple of ``multiple`` (``constrain_to_multiple_of``: Python's round to the nearest multiple). ImageError where
    a side would come out at 0 px or pass ``MAX_RESIZED_SIDE`` px (a long strip keeps its aspect)."""
    scale_h, scale_w = target_hw[0] / height, target_hw[1] / width
    if abs(1 - scale_w) < abs(1 - scale_h):
        scale_h = scale_w
    else:
        scale_w = scale_h

    size = round(scale_h * height / multiple) * multiple, round(scale_w * width / multiple) * multiple
    if max(size) > MAX_RESIZED_SIDE or min(size) < 1:
        raise ImageError(f"a {width:,}×{height:,}-px image kept at its aspect ratio comes out at "
                         f"{size[1]:,}×{size[0]:,} px, outside 1 to {MAX_RESIZED_SIDE:,} px a side; crop it to a less "
                         "extreme shape")
    return size


def to_uint8(image: Image.Image, image_size: int | tuple[int, int], num_channels: int,
             resize_size: int | tuple[int, int] | None = None, resize_mode: str = "square", resample: str = "bicubic",
             crop_rule: str = "torchvision", backend: str = "pil", fill: tuple[int, ...] = (0, 0, 0)
             ) -> torch.Tensor:
    """The evaluation transform up to normalisation: a ``(C, H, W)`` uint8 tensor.

    Without ``resize_size``: resized straight to ``image_size`` square, or to ``(height, width)`` when ``image_size``
    is a pair (the explorer's other input sizes). With it: resized by ``resize_mode`` (``resized_size``), then the
    centre ``image_size`` (a side, or ``(height, width)``) is cropped, where ``crop_start`` places it by
    ``crop_rule``. ``"longest_edge_pad"`` (SAM) returns the resized image alone, ``(C, h, w)`` with its longer side
    ``resize_size``: its padding is added after normalisation (``pad_normalized``), as zeros no uint8 value gives.
    ``"border"`` (timm's crop_mode "border") crops or pads each side to ``image_size`` (``border_start``), the
    padding in the colour ``fill`` (timm's: the mean's, ``Preprocessing.fill_colour``). ``backend`` resizes with PIL
    or with torchvision (``resize``).
    """
    image = to_mode(image, num_channels)
    crop_h, crop_w = _hw(image_size)
    if resize_size is None:
        return resize(image, (crop_w, crop_h), resample, backend)
    size = resized_size(image.size, resize_size, resize_mode)
    pixels = resize(image, size, resample, backend)  # (C, h, w)
    if resize_mode == "longest_edge_pad":
        return pixels
    if resize_mode == "border":
        channels, height, width = pixels.shape
        left, top = border_start(width, crop_w), border_start(height, crop_h)
        colour = torch.tensor(fill[:channels], dtype=torch.uint8)
        canvas = colour.view(channels, 1, 1).expand(channels, crop_h, crop_w).clone()  # (C, crop_h, crop_w)
        y0, x0 = max(0, top), max(0, left)  # the part of the resized image inside the crop
        y1, x1 = min(height, top + crop_h), min(width, left + crop_w)
        canvas[:, y0 - top:y1 - top, x0 - left:x1 - left] = pixels[:, y0:y1, x0:x1]
        return canvas
    left, top = crop_start(size[0], crop_w, crop_rule), crop_start(size[1], crop_h, crop_rule)
    return pixels[:, top:top + crop_h, left:left + crop_w].contiguous()


def resize(image: Image.Image, size: tuple[int, int], resample: str = "bicubic", backend: str = "pil"
           ) -> torch.Tensor:
    """``image`` (already in the model's mode) resized to ``size = (width, height)``: a ``(C, H, W)`` uint8 tensor.
    ``"torchvision"`` is transformers' ``TorchvisionBackend.resize``: ``tvF.resize`` of the uint8 tensor with
    antialias, nearest as ``NEAREST_EXACT``."""
    if backend == "torchvision":
        from torchvision.transforms.v2 import InterpolationMode
        from torchvision.transforms.v2 import functional as tvF

        modes = {"nearest": InterpolationMode.NEAREST_EXACT, "bilinear": InterpolationMode.BILINEAR,
                 "bicubic": InterpolationMode.BICUBIC, "lanczos": InterpolationMode.LANCZOS}
        return tvF.resize(_chw(image), [size[1], size[0]], interpolation=modes[resample], antialias=True).contiguous()
    if image.size != size:
        image = image.resize(size, Image.Resampling[resample.upper()])
    return _chw(image)


def _chw(image: Image.Image) -> torch.Tensor:
    array = np.asarray(image, dtype=np.uint8)
    if array.ndim == 2:
        array = array[:, :, None]
    return torch.from_numpy(array.copy()).permute(2, 0, 1).contiguous()  # (C, H, W)


def pad_normalized(image: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """A normalised ``(..., C, h, w)`` image padded with 0 below and to the right to ``shape = (H, W)``: SAM's
    padding (``SamImageProcessor.pad`` after its normalisation), so the padding reads as the mean colour."""
    h, w = image.shape[-2:]
    if h > shape[0] or w > shape[1]:
        raise ValueError(f"a {w}x{h} image does not fit in a {shape[1]}x{shape[0]} padded input")
    return torch.nn.functional.pad(image, (0, shape[1] - w, 0, shape[0] - h), value=0.0)


def on_padded_canvas(image: Image.Image, size: tuple[int, int], colour: tuple[int, ...],
                     offset: tuple[int, int] = (0, 0)) -> Image.Image:
    """``image`` at ``offset = (x, y)`` (the top left by default, as SAM pads; timm's crop_mode "border" centres it)
    on a ``size = (width, height)`` canvas in the colour the padding stands for (``colour``, 0-255 RGB: the
    preprocessing's ``fill_colour``), in the image's mode: the padded input as a picture; what lies outside the canvas
    is cut off."""
    canvas = Image.new(image.mode, size, colour[0] if image.mode == "L" else colour)
    canvas.paste(image, offset)
    return canvas


@functools.lru_cache(maxsize=64)
def _channel_tensors(mean: tuple[float, ...], std: tuple[float, ...], device: torch.device
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    # Built once per statistics and device: on a GPU each torch.tensor(list) is a blocking host copy.
    return (torch.tensor(mean, device=device).view(1, -1, 1, 1), torch.tensor(std, device=device).view(1, -1, 1, 1))


def normalize(batch: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """uint8 ``(B, C, H, W)`` -> float32 normalised with per-channel mean and std of [0, 1] pixels."""
    mean_t, std_t = _channel_tensors(tuple(mean), tuple(std), batch.device)
    return (batch.float() / 255.0 - mean_t) / std_t
