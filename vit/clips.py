"""A clip in, for a video model (VideoMAE): its frames from an animated GIF (PIL), a folder of frames, or a list of
images, or an upload's bytes (a GIF, or a zip of frames read in memory: ``read_clip_bytes``), sampled to the model's
``num_frames`` and preprocessed frame by frame as its processor does.

Every declared size is checked before a pixel is decoded: the frame count and the frame's width x height from the
file headers, their product against the memory bound (``vit.bounds.memory_limit``), in one line. Video files (MP4,
WebM, ...) need a maintained decoder, PyAV, which is not a dependency here: they are refused in one line that says
to give a GIF or a folder of frames.

Sampling is transformers' ``BaseVideoProcessor.sample_frames``: ``arange(0, n, n / num_frames)`` truncated, so a
clip of ``n`` frames is sampled uniformly from its first frame, and one shorter than ``num_frames`` repeats frames.
"""

from __future__ import annotations

import io
import os
import re
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

import torch
from PIL import Image, ImageSequence, UnidentifiedImageError

from vit import bounds
from vit.checkpoint import Preprocessing
from vit.images import ImageError, open_image
from vit.inference import preprocess

FRAME_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff")
VIDEO_SUFFIXES = (".mp4", ".webm", ".mov", ".avi", ".mkv", ".m4v", ".mpg", ".mpeg")
MAX_FRAMES = 100_000  # frames a clip may declare: an hour at 25 fps; its decoded size is bounded besides
BYTES_PER_PIXEL = 3  # RGB, as decoded


class ClipError(ImageError):
    """A clip that cannot be used; the message says why and what to do."""


@dataclass
class SampledClip:
    """The frames sampled from a clip: RGB images, their indices in it, and its frame count."""

    frames: list[Image.Image]
    indices: list[int]
    total: int


def sample_indices(frames: int, wanted: int) -> list[int]:
    """``wanted`` frame indices spread uniformly over a clip of ``frames`` (transformers' ``sample_frames``)."""
    if frames < 1 or wanted < 1:
        raise ClipError(f"a clip of {frames} frames cannot give {wanted}")
    return torch.arange(0, frames, frames / wanted).int()[:wanted].tolist()


def _check_size(name: str, frames: int, width: int, height: int, decoded: int) -> None:
    """ClipError (one line) when a clip's declared frames or the pixels decoding it means are past the bounds."""
    if frames > MAX_FRAMES:
        raise ClipError(f"{name} declares {frames:,} frames (at most {MAX_FRAMES:,}); cut it shorter first")
    need, limit = decoded * width * height * BYTES_PER_PIXEL, bounds.memory_limit()
    if need > limit:
        raise ClipError(f"{name}: decoding {decoded:,} frames of {width:,}x{height:,} px would hold "
                        f"{need / 2**20:,.0f} MB (at most {limit / 2**20:,.0f} MB, {bounds.ANALYSIS_MEMORY_ENV}); "
                        "give a shorter or smaller clip")


def _natural(text: str) -> list:
    """frame2.png before frame10.png."""
    return [int(part) if part.isdigit() else part.lower() for part in re.split(r"(\d+)", text)]


def _folder_frames(folder: Path, wanted: int) -> SampledClip:
    files = sorted((p for p in folder.iterdir() if p.suffix.lower() in FRAME_SUFFIXES and p.is_file()),
                   key=lambda p: _natural(p.name))
    if not files:
        raise ClipError(f"{folder} holds no frames ({', '.join(FRAME_SUFFIXES)}); give a folder of images")
    indices = sample_indices(len(files), wanted)
    chosen = [files[i] for i in indices]
    try:
        with Image.open(chosen[0]) as first:  # the header alone
            width, height = first.size
    except (OSError, UnidentifiedImageError, ValueError):
        raise ClipError(f"{chosen[0]} is not an image this program can read") from None
    _check_size(str(folder), len(files), width, height, len(chosen))
    return SampledClip([open_image(path).convert("RGB") for path in chosen], indices, len(files))


def _gif_frames(source: Path | BinaryIO, wanted: int, name: str) -> SampledClip:
    try:
        image = Image.open(source)
    except (OSError, UnidentifiedImageError, ValueError):
        raise ClipError(f"{name} is not an image this program can read (an animated GIF, or a folder of frames)") \
            from None
    with image:
        width, height = image.size  # the header's logical screen, before any frame is decoded
        _check_size(name, 1, width, height, 1)
        frames = getattr(image, "n_frames", 1)
        indices = sample_indices(frames, wanted)
        # GIF frames are deltas: reaching the last sampled one decodes each before it, so all of those count
        _check_size(name, frames, width, height, max(indices) + 1)
        out: dict[int, Image.Image] = {}
        try:
            for i, frame in enumerate(ImageSequence.Iterator(image)):
                if i in indices:
                    out[i] = frame.convert("RGB")  # a copy: the iterator reuses the image
                if i >= max(indices):
                    break
        except (OSError, ValueError, EOFError) as e:
            raise ClipError(f"{name} is truncated or corrupt ({str(e).splitlines()[0] if str(e) else e!r}); "
                            "re-export it") from None
    return SampledClip([out[i] for i in indices], indices, frames)


def read_clip(source: str | os.PathLike | Sequence[Image.Image], wanted: int) -> SampledClip:
    """``wanted`` RGB frames sampled uniformly from a GIF, a folder of frames, or a list of PIL images; ClipError
    (one line) for anything else, or a clip past the bounds, before its frames are decoded."""
    if isinstance(source, (list, tuple)):
        if not source or not all(isinstance(f, Image.Image) for f in source):
            raise ClipError("a clip given as a list needs PIL images, at least one")
        _check_size("the clip", len(source), *source[0].size, len(source))
        indices = sample_indices(len(source), wanted)
        return SampledClip([source[i].convert("RGB") for i in indices], indices, len(source))
    path = Path(source)
    if not path.exists():
        raise ClipError(f"{path}: no such file or folder")
    if path.is_dir():
        return _folder_frames(path, wanted)
    if path.suffix.lower() in VIDEO_SUFFIXES:
        raise ClipError(f"{path}: video files need PyAV, which is not installed here; give an animated GIF or a "
                        "folder of its frames (ffmpeg -i clip.mp4 frames/%05d.png)")
    return _gif_frames(path, wanted, str(path))


def _zip_frames(data: bytes, wanted: int, name: str) -> SampledClip:
    """Frames from a zip's images, in natural order of their names, read in memory (nothing is extracted to disk);
    each sampled entry's declared size is checked before it is inflated, and its image header before it is decoded."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, OSError, ValueError):
        raise ClipError(f"{name} is not a zip file this program can read; zip the frames again") from None
    with archive:
        entries = [info for info in archive.infolist() if not info.is_dir()
                   and PurePosixPath(info.filename).suffix.lower() in FRAME_SUFFIXES
                   and not any(part.startswith((".", "__MACOSX")) for part in PurePosixPath(info.filename).parts)]
        if not entries:
            raise ClipError(f"{name} holds no frames ({', '.join(FRAME_SUFFIXES)}); zip a folder of images")
        if len(entries) > MAX_FRAMES:
            raise ClipError(f"{name} holds {len(entries):,} frames (at most {MAX_FRAMES:,}); cut it shorter first")
        entries.sort(key=lambda info: _natural(info.filename))
        indices = sample_indices(len(entries), wanted)
        chosen = sorted(set(indices))
        inflated = sum(entries[i].file_size for i in chosen)  # as declared: zipfile stops reading an entry there
        if inflated > bounds.memory_limit():
            raise ClipError(f"{name}: its {len(chosen)} sampled frames declare {inflated / 2**20:,.0f} MB "
                            f"(at most {bounds.memory_limit() / 2**20:,.0f} MB); give a shorter or smaller clip")
        files: dict[int, bytes] = {}
        try:
            for i in chosen:
                files[i] = archive.read(entries[i])
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError, RuntimeError):
            raise ClipError(f"{name} is truncated, corrupt or encrypted; zip the frames again") from None
    sizes = {}
    for i, content in files.items():
        frame_name = f"{name}: {PurePosixPath(entries[i].filename).name}"
        try:
            with Image.open(io.BytesIO(content)) as header:  # the header alone
                sizes[i] = header.size
        except (OSError, UnidentifiedImageError, ValueError):
            raise ClipError(f"{frame_name} is not an image this program can read") from None
        _check_size(frame_name, 1, *sizes[i], 1)
    width, height = max(w for w, _ in sizes.values()), max(h for _, h in sizes.values())
    _check_size(name, len(entries), width, height, len(chosen))
    frames = {i: open_image(content, name=f"{name}: {PurePosixPath(entries[i].filename).name}").convert("RGB")
              for i, content in files.items()}
    return SampledClip([frames[i] for i in indices], indices, len(entries))


def read_clip_bytes(data: bytes, name: str, wanted: int) -> SampledClip:
    """``read_clip`` for an upload: an animated GIF, or a zip of frames (``.zip``: its images in natural order of
    their names), held in memory; ``name`` names it in the one-line ClipError."""
    if not data:
        raise ClipError(f"{name} is empty (0 bytes); give an animated GIF or a zip of frames")
    if name.lower().endswith(".zip") or data[:4] == b"PK\x03\x04":
        return _zip_frames(data, wanted, name)
    if PurePosixPath(name).suffix.lower() in VIDEO_SUFFIXES:
        raise ClipError(f"{name}: video files need PyAV, which is not installed here; give an animated GIF or a "
                        "zip of its frames (ffmpeg -i clip.mp4 frames/%05d.png)")
    return _gif_frames(io.BytesIO(data), wanted, name)


def open_clip_frames(source: str | os.PathLike | Sequence[Image.Image], wanted: int) -> list[Image.Image]:
    """``read_clip``'s frames alone."""
    return read_clip(source, wanted).frames


def clip_pixels(frames: Sequence[Image.Image], preprocessing: Preprocessing) -> torch.Tensor:
    """Frames -> the model's input ``(1, frames, C, H, W)``: each frame through the processor's resize, crop and
    normalisation (VideoMAEImageProcessor's settings, ``preprocessing``)."""
    return preprocess(list(frames), preprocessing)[None]  # (1, T, C, H, W)
