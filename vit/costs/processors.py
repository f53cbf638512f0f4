"""What a vision-language model's processor makes of a visitor's images or a clip's frames, counted before it runs
(issue 114, items 1 and 4): its input as it copies it, and its output at the size its own resize rule gives each
frame, against the memory bound of one analysed input (``bounds.memory_limit``).

A processor resizes every frame before anything of ours counts its tokens: a good Qwen2.5-VL's video processor took
64 PNG frames of 2,048² (a 41 KB zip) to 3.5 GB, and a hostile one whose least pixels a frame (``size.shortest_edge``)
were 2 x 10^8 grew a 64 x 48 GIF past any memory. What it holds, measured on transformers' Qwen2-VL video processor
(``tests/test_vlm_clip_work.py``): its channels-first copy of the frames (3 bytes a pixel) and about four float32
copies of its output (resized, rescaled and normalised, patched, joined: 3.3 to 3.9 times the output's bytes),
beside the frames the caller holds decoded (PIL's RGB, 4 bytes a pixel) and stacked (3). Its output's size is its
own rule's: a processor that patches its frames (Qwen-VL's, GLM's) counts its patches itself
(``get_num_of_video_patches``, ``get_number_of_image_patches``, the counters vLLM reads); another is read from its
``size`` (a fixed height and width, a shortest or a longest edge), and one whose size says neither is counted at
its input's size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from vit.costs.bounds import ANALYSIS_MEMORY_ENV, TooManyTokens, memory_limit

CHANNELS = 3
# bytes a pixel of the input: PIL's decoded RGB (4, ``vit.core.clips.PIL_RGB_BYTES``), the caller's stacked array (3),
# the processor's channels-first copy (3)
HELD_BYTES = 10
OUTPUT_COPIES = 4  # float32 copies of the processor's output at once (measured: 3.3 to 3.9)
FLOAT_BYTES = 4


def output_values(processor, frames: int, height: int, width: int, video: bool) -> int:
    """Values the output of ``processor`` (transformers' image or video processor) holds for ``frames`` frames of
    ``height`` x ``width`` px (an image: one frame), by its own resize rule: a patching processor's patches
    (``patch_size``, ``temporal_patch_size``) as it counts them, each of ``channels x temporal x patch²`` values; else
    its ``size`` applied to the frame's sides; else the frame as it is."""
    patch, temporal = getattr(processor, "patch_size", None), getattr(processor, "temporal_patch_size", None)
    counter = getattr(processor, "get_num_of_video_patches" if video else "get_number_of_image_patches", None)
    if _whole(patch) and _whole(temporal) and counter is not None:
        patches = counter(frames, height, width, {}) if video else counter(height, width, {})
        if isinstance(patches, (tuple, list)):  # HunYuan-VL's counter gives its patch rows and columns
            patches = math.prod(int(v) for v in patches)
        return int(patches) * CHANNELS * temporal * patch * patch
    h, w = resized_sides(getattr(processor, "size", None), height, width)
    return frames * h * w * CHANNELS


def resized_sides(size, height: int, width: int) -> tuple[int, int]:
    """The sides a frame of ``height`` x ``width`` px is resized to by a processor's ``size`` (transformers'
    ``SizeDict`` or a dict): a fixed height and width; within ``max_height`` x ``max_width``; the shortest side to
    ``shortest_edge`` (the longest at most ``longest_edge``); the longest side to ``longest_edge``. The frame's own
    sides where the size says none of these (its work is then counted at the input's size)."""
    def get(key: str):
        value = size.get(key) if isinstance(size, dict) else getattr(size, key, None)
        return value if _whole(value) else None

    if size is None:
        return height, width
    fixed_h, fixed_w = get("height"), get("width")
    if fixed_h and fixed_w:
        return fixed_h, fixed_w
    most_h, most_w = get("max_height"), get("max_width")
    if most_h and most_w:
        scale = min(most_h / height, most_w / width)
        return max(1, math.floor(height * scale)), max(1, math.floor(width * scale))
    short, long = get("shortest_edge"), get("longest_edge")
    if short:
        scale = short / min(height, width)
        if long:
            scale = min(scale, long / max(height, width))
        return max(1, round(height * scale)), max(1, round(width * scale))
    if long:
        scale = long / max(height, width)
        return max(1, round(height * scale)), max(1, round(width * scale))
    return height, width


def processor_bytes(processor, sizes: Sequence[tuple[int, int]], video: bool) -> int:
    """Bytes held while ``processor`` prepares images or a clip's frames of ``sizes`` (``(width, height)`` each, as
    PIL gives them): the inputs as held and copied (``HELD_BYTES`` a pixel) and ``OUTPUT_COPIES`` float32 copies of
    the output. A clip's frames are one array of the largest frame's size."""
    if video:
        width, height = max(w for w, _ in sizes), max(h for _, h in sizes)
        pixels = len(sizes) * width * height
        out = output_values(processor, len(sizes), height, width, True)
    else:
        pixels = sum(w * h for w, h in sizes)
        out = sum(output_values(processor, 1, h, w, False) for w, h in sizes)
    return HELD_BYTES * pixels + OUTPUT_COPIES * FLOAT_BYTES * out


def check_processor(processor, sizes: Sequence[tuple[int, int]], video: bool) -> None:
    """``TooManyTokens`` (one line) before ``processor`` runs on images or a clip's frames of ``sizes``
    (``(width, height)`` each) when what it holds (``processor_bytes``) is past the memory bound; a clip's refusal
    says how many of its frames fit. ``processor`` None (the model has no such processor): nothing to count."""
    if processor is None or not sizes:
        return
    need, limit = processor_bytes(processor, sizes, video), memory_limit()
    if need <= limit:
        return
    what = "its processor" if not video else "its video processor"
    if video:
        width, height = max(w for w, _ in sizes), max(h for _, h in sizes)
        fits = next((n for n in range(len(sizes) - 1, 0, -1)
                     if processor_bytes(processor, [(width, height)] * n, True) <= limit), 0)
        # "Clip frames" in the explorer, frames= in the API
        advice = f"ask about at most {fits} of its frames, or a smaller clip" if fits else "give a smaller clip"
        raise TooManyTokens(f"{len(sizes)} frames of {width:,}x{height:,} px through {what} would hold about "
                            f"{need / 2**20:,.0f} MB, over the {limit / 2**20:,.0f} MB limit "
                            f"({ANALYSIS_MEMORY_ENV}); {advice}")
    raise TooManyTokens(f"{len(sizes)} image{'s' if len(sizes) > 1 else ''} of {sum(w * h for w, h in sizes):,} px "
                        f"through {what} would hold about {need / 2**20:,.0f} MB, over the {limit / 2**20:,.0f} MB "
                        f"limit ({ANALYSIS_MEMORY_ENV}); give a smaller image")


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
