"""The explorer's clip view (a video model's page): what it says of the sampling, the shown frame as a patch picker
whose points carry the map's values, the frame strip, and the "play" export as an animated GIF."""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from PIL import Image

from vit.app import drawing
from vit.core.images import to_mode
from vit.explain.views.overlay import jpeg_data_uri

GIF_MAX_SIDE = 320  # each exported frame's long side, px: 16 frames stay a few hundred KB
GIF_FRAME_MS = 250  # 4 sampled frames a second: slow enough to follow one patch
STRIP_SIDE = 120  # a strip frame's long side, px


def sampling_caption(indices: Sequence[int], total: int) -> str:
    """'Uniform sampling of 4 frames over 9: frames 0, 2, 4, 6 of the clip (counted from 0).'"""
    frames = ", ".join(str(i) for i in indices)
    return (f"Uniform sampling of {len(indices)} frames over {total}: frames {frames} of the clip (counted from 0), "
            "as the model's processor samples them.")


def frame_label(position: int, indices: Sequence[int]) -> str:
    """The strip's caption of sampled frame ``position`` (0-based): '2 · frame 5'."""
    return f"{position + 1} · frame {indices[position]}"


def fit(image: Image.Image, max_side: int) -> Image.Image:
    """``image`` with its long side at most ``max_side`` px (never enlarged)."""
    scale = min(1.0, max_side / max(image.size))
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    return image if size == image.size else image.resize(size, Image.BILINEAR)


def colour_frame(colours: np.ndarray, size: tuple[int, int]) -> Image.Image:
    """A frame's ``(gh, gw, 3)`` colours in [0, 1] as an RGB picture of ``size`` (width, height), one block a patch."""
    pixels = (np.clip(colours, 0.0, 1.0) * 255).round().astype(np.uint8)
    return Image.fromarray(pixels, "RGB").resize(size, Image.NEAREST)


def animated_gif(frames: Sequence[Image.Image], max_side: int = GIF_MAX_SIDE, frame_ms: int = GIF_FRAME_MS) -> bytes:
    """The overlaid frames as one looping animated GIF, each frame's long side at most ``max_side`` px."""
    if not frames:
        raise ValueError("an animated GIF needs at least one frame")
    small = [to_mode(fit(f, max_side), 3) for f in frames]
    buffer = io.BytesIO()
    small[0].save(buffer, format="GIF", save_all=True, append_images=small[1:], duration=frame_ms, loop=0,
                  disposal=1)
    return buffer.getvalue()


def frame_picker_figure(overlay: Image.Image, values: np.ndarray, frame: int, query_patch: int | None,
                        fit_width: int = 300) -> go.Figure:
    """The shown frame's overlay as a patch picker (``drawing.patch_picker_figure``): a click on a patch picks
    it as the query; its points carry the frame's map ``values`` ``(gh, gw)`` (hover: frame, row, col, value)
    and the query's patch is outlined when its tubelet covers this frame (``query_patch``, else None)."""
    gh, gw = values.shape
    figure = drawing.patch_picker_figure(overlay.size, jpeg_data_uri(overlay), (gh, gw),
                                         -1 if query_patch is None else query_patch, num_prefix_tokens=0,
                                         fit_width=fit_width)
    rows, cols = np.divmod(np.arange(gh * gw), gw)
    flat = values.reshape(-1).astype(float)
    text = [f"frame {frame + 1}, row {r + 1}, col {c + 1}: {v:.4g}" for r, c, v in zip(rows, cols, flat, strict=True)]
    figure.data[0].update(text=text, customdata=flat)
    return figure


def query_from_selection(selection, frame: int, grid: tuple[int, int]) -> tuple[int, int, int] | None:
    """The ``(frame, row, col)`` a click on the frame picker chose (its points are the patches in row-major order),
    or None."""
    patch = drawing.token_from_selection(selection, num_prefix_tokens=0)
    if patch is None:
        return None
    row, col = divmod(patch, grid[1])
    return frame, row, col
