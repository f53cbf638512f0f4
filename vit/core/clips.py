"""A clip in, for a video model (VideoMAE, TimeSformer): its frames from a video file (MP4, WebM, MKV, MOV, AVI,
MPEG: PyAV), an animated GIF (PIL), a folder of frames, or a list of images, or an upload's bytes (a video, a GIF,
or a zip of frames, read in memory: ``read_clip_bytes``), sampled to the model's ``num_frames`` and preprocessed
frame by frame as its processor does.

Every declared size is checked before a pixel is decoded: the frame count and the frame's width x height from the
file headers, their product against the memory bound (``vit.costs.bounds.memory_limit``), and its shape against the
uploads' aspect bound (``vit.core.images.MAX_ASPECT``), in one line. A frame's size is checked again before that frame
is decoded wherever a container lets frames differ: a GIF's image descriptors widen the canvas PIL decodes every later
frame at (read off its blocks before PIL opens it, and counted as PIL holds it), a TIFF's pages each have their own
size, and a video stream's frames may grow past the size its headers declare (each decoded frame is checked, sampled or
not). A video decoder holds a few reference frames, not the clip, so a video's memory is its sampled frames; what grows
with its length is the decoding, bounded by ``MAX_DECODE_PIXELS`` over every declared frame (a file with one keyframe
must be decoded to its end), which refuses a 10-minute 4K file before its first frame.

A video is read in two passes. First its packets are demuxed, not decoded: their timestamps name every frame in
presentation order and say which are keyframes, and FFmpeg's ``filter_units`` bitstream filter reads off their
headers which frames no other frame refers to (B-frames, mostly; H.264 and HEVC). Then only what the sampled frames
need is decoded: the keyframe intervals that hold sampled frames are dealt to up to one decoder a core (each with a
container of its own, at once: PyAV lets go of the GIL), each jumping to the keyframe before a sampled frame when it
lies past what it has decoded and decoding forward otherwise, never sent a frame that nothing refers to unless it is
sampled, and converting the sampled frames alone to RGB (``bench/bench_video_decode.py``: 16 frames of a 10-s
1080p MP4 in 0.9-1.0 s on 2 cores, where a loop over every frame takes 5 s). A frame's index is its place in a
decode of every frame.

Sampling is transformers' ``BaseVideoProcessor.sample_frames``: ``arange(0, n, n / num_frames)`` truncated, so a
clip of ``n`` frames is sampled uniformly from its first frame, and one shorter than ``num_frames`` repeats frames
for a video model (its frame count is its own) but gives each frame once for a VLM (``once``: its processor reads the
frames it is given, and transformers' own sampler never repeats one);
with ``ends``, ``PeVideoVideoProcessor.sample_frames``'s: ``int(i * (n - 1) / (num_frames - 1))``, its first and last
frame among them.
"""

from __future__ import annotations

import bisect
import io
import math
import os
import re
import zipfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import BinaryIO

import torch
from PIL import Image, ImageSequence, UnidentifiedImageError

from vit.checkpoint import Preprocessing
from vit.core import threads
from vit.core.images import ImageError, check_aspect, open_image
from vit.core.inference import preprocess
from vit.costs import bounds

FRAME_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff")
VIDEO_SUFFIXES = (".mp4", ".webm", ".mov", ".avi", ".mkv", ".m4v", ".mpg", ".mpeg", ".ts", ".mts", ".m2ts")
MAX_FRAMES = 100_000  # frames a clip may declare: an hour at 25 fps; its decoded size is bounded besides
MAX_FPS = 1000  # a clip's frames a second, at most, where its file does not say (``at_rate``)
# transformers' own assumption for a clip whose rate is unknown (``VideoMetadata.sampled_fps``: ``self.fps or 24``)
DEFAULT_FPS = 24.0
BYTES_PER_PIXEL = 3  # RGB, as decoded
# What PIL holds of an image it decodes (a GIF, a TIFF's page): an RGB frame kept is 4 bytes a pixel (RGBX), and while
# a GIF frame past the first is decoded PIL holds besides, per pixel of its canvas, the frame in palette (1), converted
# to RGB (4) and cropped (4): measured 12.4 bytes a pixel in all for a 12,000² frame kept (1.8 GB)
PIL_RGB_BYTES = 4
PIL_DECODING_BYTES = 9
# Pixels a video's decoding may go through, counted over every declared frame (a file with one keyframe needs them
# all): ~69 s of 1080p at 30 fps, ~15 CPU s of H.264 decoding (bench/bench_video_decode.py); a 10-minute 4K file at
# 30 fps is 35 times it
MAX_DECODE_PIXELS = 2**32
TS_DISCONT = 0x200  # FFmpeg's AVFMT_TS_DISCONT: a format whose timestamps may jump (MPEG-PS, MPEG-TS)
SEEK_TO_PTS = 0x4000000  # AVFMT_SEEK_TO_PTS: a format that seeks by presentation timestamps (MP4), not decoding ones
PROBED_STREAMS = 64  # streams a file's first open probes without decoding (PyAV reads the first nb_streams)
DECODER_FRAMES = 16  # reference frames a decoder may hold (H.264's and HEVC's most)
BALANCED = 1.25  # a decoder's share of the work counts as fair up to this many times its part
VIDEO_HELP = "give a shorter or smaller clip (ffmpeg -i in.mp4 -t 60 -vf scale=-2:720 out.mp4)"


class ClipError(ImageError):
    """A clip that cannot be used; the message says why and what to do."""


@dataclass
class SampledClip:
    """The frames sampled from a clip: RGB images, their indices in it, its frame count, and its frames per second
    where its file says (a video's, an animation's from its frames' display times; None for a folder, a zip or a
    list of frames)."""

    frames: list[Image.Image]
    indices: list[int]
    total: int
    fps: float | None = None

    def metadata(self) -> dict | None:
        """transformers' ``VideoMetadata`` of the sampled frames (each one's time is its index over ``fps``, as a
        VLM's video processor writes the frames' timestamps into the prompt), or None where the rate is unknown."""
        if not self.fps:
            return None
        return {"total_num_frames": self.total, "fps": self.fps, "duration": self.total / self.fps,
                "frames_indices": list(self.indices)}


def check_fps(fps: object) -> float:
    """``fps`` as a number of frames a second, above 0 and at most ``MAX_FPS``; ValueError in one line otherwise."""
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not math.isfinite(fps) \
            or not 0 < fps <= MAX_FPS:
        raise ValueError(f"fps must be a number of frames a second above 0 and at most {MAX_FPS}, got "
                         f"{repr(fps)[:40]}")
    return float(fps)


def at_rate(clip: SampledClip, fps: float | None) -> SampledClip:
    """``clip`` with its frames ``fps`` a second (None: as it is), so each sampled frame keeps its time, which a VLM's
    processor writes into the prompt (``metadata``): ``vit.ask_vlm(video=..., fps=...)``'s path and the explorer's
    clip upload's. ValueError (one line) for a rate out of range, or for a clip whose file gives its own rate (a
    video's, a GIF's), which is not overridden."""
    if fps is None:
        return clip
    rate = check_fps(fps)
    if clip.fps:
        raise ValueError(f"this clip's file gives its own rate ({clip.fps:g} frames a second); fps= is for a folder, "
                         "a zip or a list of frames")
    return replace(clip, fps=rate)


def _rate(stamps: list[int], stream) -> float | None:
    """A video stream's frames per second: its frames over the span their timestamps cover, else its declared
    average rate (None where neither says)."""
    if len(stamps) > 1 and stamps[-1] > stamps[0] and stream.time_base:
        return (len(stamps) - 1) / float((stamps[-1] - stamps[0]) * stream.time_base)
    rate = stream.average_rate
    return float(rate) if rate else None


def sample_indices(frames: int, wanted: int, ends: bool = False, once: bool = False) -> list[int]:
    """``wanted`` frame indices spread uniformly over a clip of ``frames`` (transformers' ``sample_frames``); with
    ``ends`` from its first frame to its last (``PeVideoVideoProcessor.sample_frames``; one frame: the first). A clip
    shorter than ``wanted`` repeats frames for a video model, whose frame count is its own; with ``once`` (a VLM's
    processor, which reads the frames it is given) it gives each of its frames once instead, as transformers' own
    sampler never repeats one."""
    if frames < 1 or wanted < 1:
        raise ClipError(f"a clip of {frames} frames cannot give {wanted}")
    if once:
        wanted = min(wanted, frames)
    if ends:
        return [int(i * (frames - 1) / (wanted - 1)) if wanted > 1 else 0 for i in range(wanted)]
    return torch.arange(0, frames, frames / wanted).int()[:wanted].tolist()


def _check_size(name: str, frames: int, width: int, height: int, decoded: int) -> None:
    """ClipError (one line) when a clip's declared frames, the pixels decoding ``decoded`` frames of ``width`` x
    ``height`` means, or that shape are past the bounds."""
    check_aspect(name, width, height, ClipError)
    if frames > MAX_FRAMES:
        raise ClipError(f"{name} declares {frames:,} frames (at most {MAX_FRAMES:,}); cut it shorter first")
    need, limit = decoded * width * height * BYTES_PER_PIXEL, bounds.memory_limit()
    if need > limit:
        raise ClipError(f"{name}: decoding {decoded:,} frames of {width:,}x{height:,} px would hold "
                        f"{need / 2**20:,.0f} MB (at most {limit / 2**20:,.0f} MB, {bounds.ANALYSIS_MEMORY_ENV}); "
                        "give a shorter or smaller clip")


def _check_held(name: str, sampled: int, width: int, height: int) -> None:
    """ClipError (one line) when the ``sampled`` frames PIL decodes, each at most ``width`` x ``height`` px, and the
    decoding of one such frame, are past the memory bound: what PIL holds, where ``_check_size`` counts 3 bytes a
    pixel of the frames decoded (a GIF's widened canvas holds more than its RGB while it is decoded)."""
    need, limit = (sampled * PIL_RGB_BYTES + PIL_DECODING_BYTES) * width * height, bounds.memory_limit()
    if need > limit:
        raise ClipError(f"{name}: {sampled:,} sampled frames of {width:,}x{height:,} px would hold {need / 2**20:,.0f} "
                        f"MB as they are decoded (at most {limit / 2**20:,.0f} MB, {bounds.ANALYSIS_MEMORY_ENV}); "
                        "give a shorter or smaller clip")


def _natural(text: str) -> list:
    """frame2.png before frame10.png."""
    return [int(part) if part.isdigit() else part.lower() for part in re.split(r"(\d+)", text)]


def _bomb(name: str) -> ClipError:
    return ClipError(f"{name} is too large to decode safely (over {2 * Image.MAX_IMAGE_PIXELS:,} pixels a frame); "
                     "give a smaller clip")


def _opened(source: Path | BinaryIO, name: str, hint: str = " (an animated GIF, or a folder of frames)"
            ) -> Image.Image:
    """``Image.open``: the header alone; ClipError (one line) for a file PIL cannot read, or one it refuses as a
    decompression bomb (not an OSError: past twice ``Image.MAX_IMAGE_PIXELS``)."""
    try:
        return Image.open(source)
    except Image.DecompressionBombError:
        raise _bomb(name) from None
    except (OSError, UnidentifiedImageError, ValueError):
        raise ClipError(f"{name} is not an image this program can read{hint}") from None


def _frame(source: Path | bytes, name: str) -> Image.Image:
    """One frame of a folder or a zip, decoded (``open_image``) as RGB; what it refuses raised as the ClipError it is
    (the one type a clip's reader raises, and the page catches)."""
    try:
        return open_image(source, name=name).convert("RGB")
    except ClipError:
        raise
    except ImageError as e:
        raise ClipError(str(e)) from None


def _folder_frames(folder: Path, wanted: int, ends: bool = False, once: bool = False) -> SampledClip:
    files = sorted((p for p in folder.iterdir() if p.suffix.lower() in FRAME_SUFFIXES and p.is_file()),
                   key=lambda p: _natural(p.name))
    if not files:
        raise ClipError(f"{folder} holds no frames ({', '.join(FRAME_SUFFIXES)}); give a folder of images")
    indices = sample_indices(len(files), wanted, ends, once)
    chosen = [files[i] for i in indices]
    with _opened(chosen[0], str(chosen[0]), "") as first:  # the header alone
        width, height = first.size
    _check_size(str(folder), len(files), width, height, len(chosen))
    return SampledClip([_frame(path, str(path)) for path in chosen], indices, len(files))


def _gif_canvases(file: BinaryIO, name: str) -> list[tuple[int, int]] | None:
    """Each frame's canvas as Pillow decodes it, read off a GIF's blocks before any pixel is: its logical screen
    widened to the right and bottom edges of every image descriptor up to that frame (``GifImageFile._seek`` widens
    the image to a frame that reaches past it, and decodes that frame and every later one at that size: a 16 x 16
    screen holds 12,000² frames). The blocks are walked as Pillow walks them, so that both count the same frames.
    None for a file that is not a GIF; ClipError (one line) past ``MAX_FRAMES``, or for a descriptor cut off."""
    file.seek(0)
    head = file.read(13)
    if len(head) < 13 or head[:6] not in (b"GIF87a", b"GIF89a"):
        return None
    width, height = int.from_bytes(head[6:8], "little"), int.from_bytes(head[8:10], "little")
    if head[10] & 0x80:  # the global colour table
        file.seek(3 << ((head[10] & 7) + 1), os.SEEK_CUR)

    def block() -> bytes | None:  # GifImageFile.data: one data sub-block, None at its terminator or the file's end
        size = file.read(1)
        return file.read(size[0]) if size and size[0] else None

    canvases: list[tuple[int, int]] = []
    while True:  # one frame: the blocks up to its image descriptor, as GifImageFile._seek reads them
        byte = file.read(1)
        while byte and byte != b";":
            if byte == b"!":  # an extension: its label, then its sub-blocks
                label, first = file.read(1), block()
                if label == b"\xfe":  # a comment: up to its terminator
                    while first:
                        first = block()
                else:  # the first sub-block (NETSCAPE's loop count: two) read, then up to a terminator
                    if label == b"\xff" and not canvases and first and first.startswith(b"NETSCAPE2.0"):
                        block()
                    while block():
                        pass
            elif byte == b",":  # an image descriptor: left, top, width, height, flags
                descriptor = file.read(9)
                if len(descriptor) < 9:
                    raise ClipError(f"{name} is truncated or corrupt (an image descriptor cut off); re-export it")
                left, top, w, h = (int.from_bytes(descriptor[i:i + 2], "little") for i in range(0, 8, 2))
                if descriptor[8] & 0x80:  # its local colour table
                    file.seek(3 << ((descriptor[8] & 7) + 1), os.SEEK_CUR)
                if not file.read(1):  # the LZW code size
                    raise ClipError(f"{name} is truncated or corrupt (an image descriptor cut off); re-export it")
                width, height = max(width, left + w), max(height, top + h)
                canvases.append((width, height))
                while block():  # its image data
                    pass
                if len(canvases) > MAX_FRAMES:
                    raise ClipError(f"{name} holds more than {MAX_FRAMES:,} frames; cut it shorter first")
                break
            byte = file.read(1)  # Pillow steps over a byte that starts no block
        else:
            break
    if not canvases:
        raise ClipError(f"{name} is not an image this program can read (a GIF that holds no frame)")
    file.seek(0)
    return canvases


def _gif_frames(file: BinaryIO, wanted: int, name: str, ends: bool = False, once: bool = False) -> SampledClip:
    """``wanted`` frames of an animated GIF (or any image PIL reads, one frame or many: APNG, WebP, TIFF): each
    frame's size checked before it is decoded, a GIF's from its image descriptors before PIL opens it."""
    canvases = _gif_canvases(file, name)
    first = canvases and canvases[0]
    if canvases:  # PIL's open reads frame 0's descriptor and sizes its disposal: the canvas checked first
        _check_size(name, len(canvases), *canvases[0], 1)
    with _opened(file, name) as image:
        frames = len(canvases) if canvases else getattr(image, "n_frames", 1)
        indices = sample_indices(frames, wanted, ends, once)
        last, sampled = max(indices), len(set(indices))
        # GIF frames are deltas: reaching the last sampled one decodes each before it, so all of those count, each at
        # the canvas PIL has widened to by then (it only grows): the last one's
        width, height = canvases[last] if canvases else image.size
        if canvases and (width, height) != first:
            name = f"{name} (its later frames widen its {first[0]:,}x{first[1]:,} px first frame)"
        _check_size(name, frames, width, height, last + 1)
        _check_held(name, sampled, width, height)
        out: dict[int, Image.Image] = {}
        durations: list = []  # each frame's display time in ms up to the last sampled, as its file says
        try:
            for i, frame in enumerate(ImageSequence.Iterator(image)):
                durations.append(frame.info.get("duration"))
                # its header read, no pixel of it decoded yet: a TIFF's page (a GIF's canvas) may be larger than the
                # first, and every frame up to the last sampled is decoded
                width, height = max(width, frame.width), max(height, frame.height)
                check_aspect(name, *frame.size, ClipError)
                _check_size(name, frames, width, height, last + 1)
                _check_held(name, sampled, width, height)
                if i in indices:
                    out[i] = frame.convert("RGB")  # a copy: the iterator reuses the image
                if i >= last:
                    break
        except ClipError:
            raise
        except Image.DecompressionBombError:  # PIL's own limit on a canvas it widens
            raise _bomb(name) from None
        except (OSError, ValueError, EOFError, IndexError, SyntaxError) as e:  # IndexError: a block cut off
            raise ClipError(f"{name} is truncated or corrupt ({str(e).splitlines()[0] if str(e) else e!r}); "
                            "re-export it") from None
        if len(out) < sampled:
            raise ClipError(f"{name} is truncated or corrupt (it ends before frame {last + 1}); re-export it")
    return SampledClip([out[i] for i in indices], indices, frames, _gif_rate(durations))


def _gif_rate(durations: list) -> float | None:
    """An animation's frames per second from its frames' display times (ms): their count over their sum, or None
    where a frame says none or 0 (which players show at a rate of their own)."""
    if not durations or not all(isinstance(d, (int, float)) and d > 0 for d in durations):
        return None
    return 1000.0 * len(durations) / float(sum(durations))


def _head(path: Path) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read(12)
    except OSError:
        return b""


def _is_video(head: bytes) -> bool:
    """An MP4 / MOV (``ftyp`` box), a Matroska / WebM (EBML) or an AVI (RIFF) by its first bytes, whatever its name."""
    return head[4:8] == b"ftyp" or head[:4] == b"\x1aE\xdf\xa3" or (head[:4] == b"RIFF" and head[8:12] == b"AVI ")


def _check_decoding(name: str, frames: int, width: int, height: int) -> None:
    """ClipError (one line) when decoding ``frames`` frames of ``width`` x ``height`` is past ``MAX_DECODE_PIXELS``."""
    if frames > MAX_FRAMES:
        raise ClipError(f"{name} declares {frames:,} frames (at most {MAX_FRAMES:,}); cut it shorter first")
    if frames * width * height > MAX_DECODE_PIXELS:
        raise ClipError(f"{name}: {frames:,} frames of {width:,}x{height:,} px are {frames * width * height / 1e9:,.1f}"
                        f" gigapixels to decode (at most {MAX_DECODE_PIXELS / 1e9:,.1f}); {VIDEO_HELP}")


def _declared_frames(container, stream) -> int | None:
    """The frame count a video's headers declare: the stream's own (MP4, MOV), else its duration x its frame rate
    (WebM and MKV keep no count); None when it declares neither."""
    if stream.frames:
        return int(stream.frames)
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    if stream.duration is not None and stream.time_base:
        seconds = float(stream.duration * stream.time_base)
    elif container.duration:
        seconds = container.duration / 1_000_000  # AV_TIME_BASE
    else:
        return None
    return max(1, math.ceil(seconds * float(rate))) if rate else None


def _reference_filter(stream):
    """FFmpeg's ``filter_units`` bitstream filter set to drop the packets no other frame refers to
    (``discard=nonref``: the rule of the decoder's own ``skip_frame = NONREF``, read off each packet's headers, for
    H.264 and HEVC); None for a codec it cannot read."""
    import av
    from av.bitstream import BitStreamFilterContext

    try:
        return BitStreamFilterContext("filter_units=discard=nonref", stream)
    except (av.FFmpegError, ValueError):
        return None


def _frame_timestamps(container, stream, name: str, width: int, height: int
                      ) -> tuple[list[int], list[int], set[int] | None, dict[int, int], bool]:
    """Every frame's presentation timestamp in order, the keyframes', the frames other frames refer to (None when
    the codec's packets do not say), the timestamp a seek to each keyframe takes (its decoding one, but where
    the format seeks by presentation: MP4, MOV), and whether the packets came in presentation order, from the
    packets (demuxed, not decoded); ClipError when there are more than the headers let through."""
    import av

    stamps, keys, references, seeks = [], [], set(), {}
    by_pts = bool(container.format.flags & SEEK_TO_PTS)
    references_filter = _reference_filter(stream)
    for packet in container.demux(stream):
        if packet.size == 0 or packet.is_discard:  # the flush packet; an edit list's dropped frames
            continue
        if packet.pts is None:
            raise ClipError(f"{name} has frames without timestamps; re-encode it (ffmpeg -i in -c:v libx264 out.mp4)")
        stamps.append(packet.pts)
        if packet.is_keyframe:
            keys.append(packet.pts)
            seeks[packet.pts] = packet.pts if by_pts or packet.dts is None else packet.dts  # AVI: frames by decoding
        if references_filter is not None:
            pts = packet.pts
            try:
                if references_filter.filter(packet):  # the packet is the filter's now
                    references.add(pts)
            except (av.FFmpegError, ValueError):  # headers it cannot parse: the decoder's skip_frame decides
                references_filter = references = None
        if len(stamps) % 1024 == 0:  # a header that undercounts: stop at the bound, not at the file's end
            _check_decoding(name, len(stamps), width, height)
    _check_decoding(name, len(stamps), width, height)
    if not stamps or not keys:
        raise ClipError(f"{name} holds no decodable frame; re-encode it (ffmpeg -i in -c:v libx264 out.mp4)")
    ordered = sorted(stamps)
    return ordered, sorted(keys), references if references_filter is not None else None, seeks, ordered == stamps


def _within(frames, name: str, width: int, height: int):
    """The decoded ``frames``, each checked against the size its stream declared before anything reads it: a stream
    may grow part way (an MPEG-TS of 16 x 16 px, then 4,096² px), past what every bound counted from that size, and
    the frames that are not sampled are decoded too; ClipError (one line) at the first frame larger."""
    for frame in frames:
        if frame.width > width or frame.height > height:
            raise ClipError(f"{name} declares {width}x{height} px but holds {frame.width}x{frame.height}; "
                            "re-encode it")
        yield frame


def _decoded(container, stream, targets: set[int], references: set[int] | None, name: str, width: int, height: int):
    """The frames decoded forward from where the container stands, but for those no other frame refers to and no
    target is: never sent to the decoder when ``references`` names the others (so that no frame thread waits on a
    packet it would drop), else dropped by the decoder (``skip_frame = NONREF``, set per packet). Skipping them
    changes no other frame. Each is checked against the declared ``width`` x ``height`` (``_within``)."""
    context = stream.codec_context
    for packet in container.demux(stream):
        needed = packet.size == 0 or packet.pts in targets
        if not needed and references is not None and packet.pts not in references:
            continue
        context.skip_frame = "DEFAULT" if needed else "NONREF"
        yield from _within(context.decode(packet), name, width, height)


def _truncated(name: str) -> ClipError:
    return ClipError(f"{name} ends before the frames its packets name; it is truncated, re-encode it")


def _rgb(frame) -> Image.Image:
    """A decoded frame (its size checked: ``_within``) as an RGB image."""
    return Image.fromarray(frame.to_ndarray(format="rgb24"))  # to_image() takes half as long again


def _decode_sampled(container, stream, targets: list[int], keys: list[int], seeks: dict[int, int],
                    references: set[int] | None, name: str, width: int, height: int) -> dict[int, Image.Image]:
    """The frames at the timestamps ``targets`` (ascending) as RGB images: a seek to the keyframe before a target
    when that keyframe lies past the last decoded frame, decoding forward otherwise; no other frame converted."""
    out: dict[int, Image.Image] = {}
    frames, position = None, None
    for target in targets:
        key = keys[max(0, bisect.bisect_right(keys, target) - 1)]
        if frames is None or position is None or key > position:
            container.seek(seeks[key], stream=stream, backward=True)  # to that keyframe: any_frame=False
            frames = _decoded(container, stream, set(targets), references, name, width, height)
        for frame in frames:
            position = frame.pts
            if frame.pts is not None and frame.pts >= target:
                break
        else:
            raise _truncated(name)
        if frame.pts != target:
            raise ClipError(f"{name}: a seek did not reach its frame at {target} (an open GOP?); re-encode it "
                            "(ffmpeg -i in -c:v libx264 out.mp4)")
        out[target] = _rgb(frame)
    return out


def _decode_in_order(container, stream, indices: list[int], name: str, width: int, height: int
                     ) -> dict[int, Image.Image]:
    """The frames at the positions ``indices`` of the decoder's output, decoded forward from the file's start, every
    frame: for files whose timestamps do not say which frame is where."""
    wanted, out = set(indices), {}
    container.seek(0)
    stream.thread_type = "AUTO"
    for position, frame in enumerate(_within(container.decode(stream), name, width, height)):
        if position in wanted:
            out[position] = _rgb(frame)
        if len(out) == len(wanted):
            return out
    raise _truncated(name)


def _open_video(source: Path | bytes, name: str):
    """A PyAV container over a video file or its bytes; ClipError (one line) when FFmpeg cannot open it.

    FFmpeg's probe decodes a stream's first frames to learn what its headers leave out (31 ms of a 1080p H.264 file,
    a tenth of the decoding of 16 sampled frames), so it is first asked to decode none; when the headers leave the
    frame size or the frames' reordering unknown, the file is opened again with the whole probe."""
    import av  # its FFmpeg libraries load on a video's first read, not on the engine's import

    def opened(stream_options):
        try:
            return av.open(str(source) if isinstance(source, Path) else io.BytesIO(source), metadata_errors="ignore",
                           stream_options=stream_options)
        except (av.FFmpegError, OSError):  # first: FFmpeg's InvalidDataError is a ValueError too
            pass
        except ValueError:  # PyAV: a format whose streams appear only in the probe (MPEG-PS) takes no stream options
            if stream_options is not None:
                return opened(None)
        raise ClipError(f"{name} is not a video this program can read (MP4, WebM, MKV, MOV, AVI, MPEG); give a "
                        "video, an animated GIF or a folder of frames")

    container = opened([{"skip_frame": "all"}] * PROBED_STREAMS)  # a probe that decodes no frame
    try:
        context = container.streams.video[0].codec_context if container.streams.video else None
        known = context is None or (context.width > 0 and context.height > 0 and context.reorder_depth > 0)
    except (av.FFmpegError, AttributeError, ValueError):
        known = False
    if known:
        return container
    container.close()
    return opened(None)


def _shares(targets: list[int], keys: list[int], stamps: list[int], workers: int) -> tuple[list[list[int]], list[int]]:
    """The targets dealt to at most ``workers`` decoders by whole keyframe intervals, each interval's cost the frames
    from its keyframe to its last target, the costliest first to the least loaded: decoders that start at different
    keyframes share nothing, so they run at once; one keyframe interval stays with one decoder."""
    groups: dict[int, list[int]] = {}
    for target in targets:
        groups.setdefault(keys[max(0, bisect.bisect_right(keys, target) - 1)], []).append(target)
    shares: list[list[int]] = [[] for _ in range(min(workers, len(groups)))]
    loads = [0] * len(shares)
    position = {stamp: i for i, stamp in enumerate(stamps)}
    for key, group in sorted(groups.items(), key=lambda item: position[item[0]] - position[item[1][-1]]):
        least = loads.index(min(loads))
        shares[least] += group
        loads[least] += position[group[-1]] - position[key] + 1
    return [sorted(share) for share in shares], loads


def _decoders(cores: int, width: int, height: int, sampled: int) -> int:
    """How many decoders may run at once: one a core, each counted as holding ``DECODER_FRAMES`` frames and one for
    each of its frame threads (the cores + 1), beside the sampled frames, within the memory bound."""
    frame = width * height * BYTES_PER_PIXEL
    spare = bounds.memory_limit() - sampled * frame
    return max(1, min(cores, spare // ((DECODER_FRAMES + cores + 1) * frame)))


def _decode_share(source: Path | bytes, targets: list[int], keys: list[int], seeks: dict[int, int],
                  references: set[int] | None, name: str, width: int, height: int, frame_threads: int
                  ) -> dict[int, Image.Image]:
    """``_decode_sampled`` on a container of its own (a thread of ``_video_frames``)."""
    with _open_video(source, name) as container:
        stream = container.streams.video[0]
        stream.thread_type, stream.codec_context.thread_count = "AUTO", frame_threads
        return _decode_sampled(container, stream, targets, keys, seeks, references, name, width, height)


def _video_frames(source: Path | bytes, wanted: int, name: str, ends: bool = False, once: bool = False
                  ) -> SampledClip:
    """``wanted`` frames of a video file or its bytes, through PyAV; its declared size checked before its packets
    are read and its frame count again before any frame is decoded. Keyframe intervals that hold sampled frames are
    decoded at once on the process's cores, each decoder with FFmpeg's frame threads (PyAV lets go of the GIL)."""
    import av

    with _open_video(source, name) as container:
        if not container.streams.video:
            raise ClipError(f"{name} holds no video stream; give a video, an animated GIF or a folder of frames")
        stream = container.streams.video[0]
        try:
            context = stream.codec_context
            width, height, codec = context.width, context.height, context.name
        except (av.FFmpegError, AttributeError, ValueError):
            context = None
        if context is None or not width or not height:
            raise ClipError(f"{name}: its video stream cannot be decoded here (no decoder, or no frame size); "
                            "re-encode it (ffmpeg -i in -c:v libx264 out.mp4)")
        declared = _declared_frames(container, stream)
        if declared is None:
            raise ClipError(f"{name} declares neither its frame count nor its duration; re-encode it "
                            "(ffmpeg -i in -c:v libx264 out.mp4)")
        _check_decoding(name, declared, width, height)
        _check_size(name, declared, width, height, min(declared, wanted))  # the sampled frames, held as RGB
        try:
            stamps, keys, references, seeks, in_order = _frame_timestamps(container, stream, name, width, height)
            indices = sample_indices(len(stamps), wanted, ends, once)
            _check_size(name, len(stamps), width, height, len(set(indices)))
            if container.format.flags & TS_DISCONT or (in_order and context.reorder_depth > 0):
                # MPEG-PS/TS (a seek lands near a keyframe, and their threaded decoders may misname a frame's
                # timestamp), or timestamps in decoding order where the codec reorders (AVI's H.264)
                frames = _decode_in_order(container, stream, indices, name, width, height)
                return SampledClip([frames[i] for i in indices], indices, len(stamps), _rate(stamps, stream))
            cores = threads.usable_cores()
            shares, loads = _shares(sorted({stamps[i] for i in indices}), keys, stamps,
                                    _decoders(cores, width, height, len(set(indices))))
            # a decoder with its fair part of the work or less runs on one thread; one with more (a long keyframe
            # interval) on FFmpeg's frame threads (its own count, the cores + 1), consecutive frames at once
            counts = [1 if load <= BALANCED * sum(loads) / cores else 0 for load in loads]
            stream.thread_type, context.thread_count = "AUTO", counts[0]
            with ThreadPoolExecutor(max_workers=max(1, len(shares) - 1)) as pool:
                running = [pool.submit(_decode_share, source, share, keys, seeks, references, name, width, height,
                                       count)
                           for share, count in zip(shares[1:], counts[1:], strict=True)]
                frames = _decode_sampled(container, stream, shares[0], keys, seeks, references, name, width, height)
                for share in running:
                    frames.update(share.result())
        except (av.FFmpegError, OSError, EOFError) as e:
            raise ClipError(f"{name} ({codec}) cannot be decoded: {str(e).splitlines()[0] if str(e) else e!r}; "
                            "re-encode it (ffmpeg -i in -c:v libx264 out.mp4)") from None
        fps = _rate(stamps, stream)
    return SampledClip([frames[stamps[i]] for i in indices], indices, len(stamps), fps)


def read_clip(source: str | os.PathLike | Sequence[Image.Image], wanted: int, ends: bool = False, once: bool = False
              ) -> SampledClip:
    """``wanted`` RGB frames sampled uniformly from a video file (MP4, WebM, MKV, MOV, AVI, MPEG), a GIF, a folder of
    frames, or a list of PIL images (``ends``: its first and last frame among them, as PE video's processor samples;
    ``once``: a clip shorter than ``wanted`` gives each of its frames once, for a VLM, not repeated); ClipError
    (one line) for anything else, or a clip past the bounds, before its frames are decoded."""
    if isinstance(source, (list, tuple)):
        if not source or not all(isinstance(f, Image.Image) for f in source):
            raise ClipError("a clip given as a list needs PIL images, at least one")
        _check_size("the clip", len(source), *source[0].size, len(source))
        indices = sample_indices(len(source), wanted, ends, once)
        return SampledClip([source[i].convert("RGB") for i in indices], indices, len(source))
    if not isinstance(source, (str, os.PathLike)):  # Path() of an image would raise a TypeError
        what = "one image" if isinstance(source, Image.Image) else f"a {type(source).__name__}"
        raise ClipError(f"a clip is a video file, a GIF, a folder of frames or a list of PIL images, not {what}")
    path = Path(source)
    if not path.exists():
        raise ClipError(f"{path}: no such file or folder")
    if path.is_dir():
        return _folder_frames(path, wanted, ends, once)
    if path.suffix.lower() in VIDEO_SUFFIXES or _is_video(_head(path)):
        return _video_frames(path, wanted, str(path), ends, once)
    try:
        file = open(path, "rb")
    except OSError as e:
        raise ClipError(f"{path} cannot be read ({e.strerror or type(e).__name__})") from None
    with file:
        return _gif_frames(file, wanted, str(path), ends, once)


def _zip_frames(data: bytes, wanted: int, name: str, ends: bool = False, once: bool = False) -> SampledClip:
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
        indices = sample_indices(len(entries), wanted, ends, once)
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
        with _opened(io.BytesIO(content), frame_name, "") as header:  # the header alone
            sizes[i] = header.size
        _check_size(frame_name, 1, *sizes[i], 1)
    width, height = max(w for w, _ in sizes.values()), max(h for _, h in sizes.values())
    _check_size(name, len(entries), width, height, len(chosen))
    frames = {i: _frame(content, f"{name}: {PurePosixPath(entries[i].filename).name}") for i, content in files.items()}
    return SampledClip([frames[i] for i in indices], indices, len(entries))


def read_clip_bytes(data: bytes, name: str, wanted: int, ends: bool = False, once: bool = False) -> SampledClip:
    """``read_clip`` for an upload: a video file, an animated GIF, or a zip of frames (``.zip``: its images in
    natural order of their names), held in memory (nothing written to disk); ``name`` names it in the one-line
    ClipError; ``ends`` and ``once`` as ``read_clip`` takes them."""
    if not data:
        raise ClipError(f"{name} is empty (0 bytes); give a video, an animated GIF or a zip of frames")
    if name.lower().endswith(".zip") or data[:4] == b"PK\x03\x04":
        return _zip_frames(data, wanted, name, ends, once)
    if PurePosixPath(name).suffix.lower() in VIDEO_SUFFIXES or _is_video(data):
        return _video_frames(data, wanted, name, ends, once)
    return _gif_frames(io.BytesIO(data), wanted, name, ends, once)


def clip_pixels(frames: Sequence[Image.Image], preprocessing: Preprocessing) -> torch.Tensor:
    """Frames -> the model's input ``(1, frames, C, H, W)``: each frame through the processor's resize, crop and
    normalisation (VideoMAEImageProcessor's settings, ``preprocessing``)."""
    return preprocess(list(frames), preprocessing)[None]  # (1, T, C, H, W)
