"""A clip's frame rate where its file does not say (a folder, a zip or a list of frames): the one check and the one
way it joins the sampled frames, for ``vit.ask_vlm(video=..., fps=...)`` and the explorer's clip upload alike. With a
rate, each sampled frame keeps its time (its index over the rate), which a VLM's processor writes into the prompt
(``SampledClip.metadata``)."""

from __future__ import annotations

import math
from dataclasses import replace

from vit.core.clips import SampledClip

MAX_FPS = 1000  # a clip's frames a second, at most
# transformers' own assumption for a clip whose rate is unknown (``VideoMetadata.sampled_fps``: ``self.fps or 24``)
DEFAULT_FPS = 24.0


def check_fps(fps: object) -> float:
    """``fps`` as a number of frames a second, above 0 and at most ``MAX_FPS``; ValueError in one line otherwise."""
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not math.isfinite(fps) \
            or not 0 < fps <= MAX_FPS:
        raise ValueError(f"fps must be a number of frames a second above 0 and at most {MAX_FPS}, got "
                         f"{repr(fps)[:40]}")
    return float(fps)


def at_rate(clip: SampledClip, fps: float | None) -> SampledClip:
    """``clip`` with its frames ``fps`` a second (None: as it is); ValueError (one line) for a rate out of range, or
    for a clip whose file gives its own rate (a video's, a GIF's), which is not overridden."""
    if fps is None:
        return clip
    rate = check_fps(fps)
    if clip.fps:
        raise ValueError(f"this clip's file gives its own rate ({clip.fps:g} frames a second); fps= is for a folder, "
                         "a zip or a list of frames")
    return replace(clip, fps=rate)
