"""What the explorer page draws: figures, images, captions and token labels for the data
that ``vit.explain.views.image_analysis`` and ``vit.explain.views.attention_maps`` compute.

Layers, heads and patches are 0-based here, as in those; the UI shows layers and heads
from 1.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Sequence

import matplotlib.ticker
import numpy as np
import plotly.graph_objects as go
import plotly.io
import torch
from PIL import Image, ImageDraw, ImageFont

from vit.app.explorer_page import patch_of
from vit.checkpoint import Checkpoint
from vit.core.images import on_padded_canvas, to_uint8
from vit.core.inference import TRAINING_SIZE, InputSize, Prediction, evaluation_uint8, input_shape, preprocess
from vit.core.sizes import describe_size
from vit.core.text import escape_plotly, file_name_part
from vit.explain.views.attention_maps import (
    CAM_KINDS,
    MapSettings,
    map_mask,
    method_of,
    resolved_class,
)
from vit.explain.views.image_analysis import Analysis
from vit.explain.views.map_captions import token_label
from vit.explain.views.overlay import (
    colorize,
    display_image,
    draw_mask_contours,
    jpeg_data_uri,
    overlay,
    to_png_bytes,
)

COLOUR_SCALES = {
    "own": "each map's min–max",
    "zero": "0 to each map's max",
    "shared": "one range for every head shown",
}



# Colour maps that matplotlib (overlays) and Plotly (heatmaps) both know by the same name.
CURVE_BATCH = 32  # images scored at once for deletion/insertion curves: each batch is one chunk a Stop waits for
LABEL_STRIP, LABEL_COLOUR = 16, (49, 51, 63)  # px under each labelled thumbnail; Streamlit's text colour
COLORMAPS = ("inferno", "viridis", "magma", "plasma", "cividis", "turbo", "jet")



def colour_range(maps: np.ndarray, scale: str) -> tuple[float | None, float | None]:
    """``(vmin, vmax)`` for ``colorize``: None, None (each map its own min–max), 0 to the max, or one range
    over all of ``maps`` (``scale`` "own", "zero" or "shared")."""
    if scale == "own":
        return None, None
    if scale == "zero":
        return 0.0, None
    if scale == "shared":
        if not np.isfinite(maps).any():  # nothing to show (patching two images of one class: every share is 0/0)
            return None, None
        return float(np.nanmin(maps)), float(np.nanmax(maps))
    raise ValueError(f"unknown colour scale {scale!r}; choose one of: {', '.join(COLOUR_SCALES)}")



def map_range(map2d: np.ndarray, vmin: float | None, vmax: float | None) -> tuple[float, float]:
    """The values the darkest and brightest colours stand for on ``map2d`` with this ``vmin``/``vmax``: a bound not
    given is the map's own, over its finite values (0 to 1 without any), as ``overlay.colorize`` colours it."""
    values = np.asarray(map2d, dtype=np.float64)
    finite = values[np.isfinite(values)]
    low = (float(finite.min()) if finite.size else 0.0) if vmin is None else float(vmin)
    high = (float(finite.max()) if finite.size else 1.0) if vmax is None else float(vmax)
    return low, high



def small_multiples(image: Image.Image, maps: np.ndarray, opacity: float, colormap: str, mode: str,
                    outline_patch: int | None = None, scale: str = "own",
                    mask_share: float | None = None) -> list[Image.Image]:
    """One overlay per ``(gh, gw)`` map of ``maps (N, gh, gw)``, on ``scale`` (see ``colour_range``),
    with DINO's attention-mass contour per map when ``mask_share`` is given."""
    vmin, vmax = colour_range(maps, scale)
    cells = []
    for m in maps:
        cell = overlay(image, m, opacity, colormap, mode, outline_patch=outline_patch, vmin=vmin, vmax=vmax)
        if mask_share is not None:
            cell = draw_mask_contours(cell, map_mask(m, mask_share))
        cells.append(cell)
    return cells



def heads_grid_image(cells: Sequence[Image.Image], columns: int, gap: int = 2,
                     labels: Sequence[str] | None = None) -> Image.Image:
    """Thumbnails of one size tiled row by row into one image (one encode instead of one per head); ``labels``, one
    per cell, are written under each (a sheet of maps read row by row was otherwise a count away from its layer)."""
    width, height = cells[0].size
    strip = LABEL_STRIP if labels is not None else 0
    rows = math.ceil(len(cells) / columns)
    sheet = Image.new("RGB", (columns * width + (columns - 1) * gap, rows * (height + strip) + (rows - 1) * gap),
                      (255, 255, 255))
    draw, size = ImageDraw.Draw(sheet), LABEL_STRIP - 4
    font = ImageFont.load_default(size=size)
    while labels and size > 6 and max(font.getlength(label) for label in labels) > width - 2:  # no label overlaps
        size -= 1
        font = ImageFont.load_default(size=size)
    for i, cell in enumerate(cells):
        r, c = divmod(i, columns)
        x, y = c * (width + gap), r * (height + strip + gap)
        sheet.paste(cell, (x, y))
        if labels is not None:
            draw.text((x + width / 2, y + height + strip / 2), labels[i], fill=LABEL_COLOUR, font=font, anchor="mm")
    return sheet



HEADS_NAMED = 12  # 'head 1' … 'head 12' fit a heads grid's columns in a ~1,000-px page column; more get numbers
HEADS_NUMBERED = 32  # past this many heads, every fourth is numbered (two-digit numbers would touch)
HEADS_COLUMN_PX = 1000  # the page column a heads grid is stretched to, about: its height follows the sheet's


def head_tick_labels(num_heads: int) -> list[str]:
    """The heads grid's column labels, level and clear of each other in a ~1,000-px column: 'head 1' … for a few
    heads, '1' … '24' (under the axis title 'head') for more, and 1, 4, 8, … past ``HEADS_NUMBERED``."""
    if num_heads <= HEADS_NAMED:
        return [f"head {h + 1}" for h in range(num_heads)]
    step = 1 if num_heads <= HEADS_NUMBERED else 4
    return [str(h + 1) if h == 0 or (h + 1) % step == 0 else "" for h in range(num_heads)]


def heads_grid_figure(sheet_uri: str, sheet_size: tuple[int, int], layers: Sequence[int], num_heads: int,
                      selected: tuple[int, int] | None = None, gap: int = 2) -> go.Figure:
    """The heads grid (``heads_grid_image`` as ``sheet_uri``): one row per layer of ``layers`` (0-based), one column
    per head; point ``i`` is cell ``i`` in row-major order, so a click selects ``(layers[r], head)``.
    ``selected = (layer, head)`` is outlined."""
    width, height = sheet_size
    numbered = num_heads > HEADS_NAMED
    top = 40 if numbered else 22  # room for the axis title over the numbers
    # A wide sheet (a Swin's 24 heads) is as tall as the column's width makes it, not 110 px a row left blank.
    fit = top + math.ceil(HEADS_COLUMN_PX * height / width) + 8
    rows = len(layers)
    cell_w, cell_h = (width + gap) / num_heads, (height + gap) / rows
    index = np.arange(rows * num_heads)
    r, c = np.divmod(index, num_heads)
    labels = [f"layer {layers[i]+1}, head {j + 1}" for i, j in zip(r.tolist(), c.tolist(), strict=True)]
    invisible = dict(marker=dict(opacity=0))
    points = go.Scatter(x=(c + 0.5) * cell_w, y=(r + 0.5) * cell_h, mode="markers", text=labels,
                        hovertemplate="%{text}<extra></extra>", showlegend=False,
                        marker=dict(size=max(6, min(cell_w, cell_h)), symbol="square", opacity=0),
                        selected=invisible, unselected=invisible)
    shapes = []
    if selected is not None and selected[0] in layers:
        row = list(layers).index(selected[0])
        shapes.append(dict(type="rect", x0=selected[1] * cell_w - 1, x1=(selected[1] + 1) * cell_w - gap + 1,
                           y0=row * cell_h - 1, y1=(row + 1) * cell_h - gap + 1, line=dict(color="#ff4b4b", width=3)))
    image = dict(source=sheet_uri, xref="x", yref="y", x=0, y=0, sizex=width, sizey=height, xanchor="left",
                 yanchor="top", sizing="stretch", layer="below")
    layout = dict(height=max(80, min(900, 60 + 110 * rows, fit)), margin=dict(l=44, r=0, t=top, b=0),
                  hovermode="closest", hoverdistance=-1, plot_bgcolor="rgba(0,0,0,0)", paper_bgcolor="rgba(0,0,0,0)",
                  images=[image], shapes=shapes, clickmode="event+select", dragmode=False,
                  # Both axes shrink their domain toward the top left to keep the sheet's aspect: had the x range
                  # grown instead (a tall sheet in a wide column), the sheet would sit mid-plot, far from its
                  # row labels at the plot's left edge.
                  xaxis=dict(range=[0, width], fixedrange=True, side="top", showgrid=False, zeroline=False,
                             constrain="domain", constraintoward="left",
                             tickvals=[(h + 0.5) * cell_w for h in range(num_heads)],
                             ticktext=head_tick_labels(num_heads), tickangle=0,  # never turned (and clipped)
                             title=dict(text="head", standoff=4) if numbered else None),
                  yaxis=dict(range=[height, 0], fixedrange=True, scaleanchor="x", constrain="domain",
                             constraintoward="top", showgrid=False, zeroline=False,
                             tickvals=[(i + 0.5) * cell_h for i in range(rows)],
                             ticktext=[f"L{layer + 1}" for layer in layers]))
    return go.Figure(data=[points], layout=layout)



def cell_from_selection(selection, layers: Sequence[int], num_heads: int) -> tuple[int, int] | None:
    """The ``(layer, head)`` (0-based) a click on ``heads_grid_figure`` chose, or None."""
    if not selection:
        return None
    indices = selection.get("point_indices") or []
    if not indices:
        return None
    row, head = divmod(int(indices[-1]), num_heads)
    return layers[row], head



def short_token_label(token: int, grid: tuple[int, int], num_prefix_tokens: int = 1,
                      prefix_names: Sequence[str] = ()) -> str:
    """``token_label`` in a few characters for dense views: 'CLS', 'REG 2', 'r2 c3' (patch row 2, column 3)."""
    if token < num_prefix_tokens:
        return token_label(token, grid, num_prefix_tokens, prefix_names)
    row, col = divmod(token - num_prefix_tokens, grid[1])
    return f"r{row + 1} c{col + 1}"



def token_option(token: int, grid: tuple[int, int], num_prefix_tokens: int = 1,
                 prefix_names: Sequence[str] = ()) -> str:
    """The query picker's text for a token: '0 · CLS', '2 · REG 1', '10 · patch row 2, col 2'."""
    return f"{token} · {token_label(token, grid, num_prefix_tokens, prefix_names)}"



def head_option(head: int) -> str:
    """The head picker's text for a head counted from 0, -1 being every head fused: 'all heads, fused', 'head 3'."""
    return "all heads, fused" if head == -1 else f"head {head + 1}"


def class_option(index: int, class_names: Sequence[str], predicted: int) -> str:
    """The class picker's text for class ``index``, -1 being the class the model predicts (``predicted``)."""
    return f"predicted: {class_names[predicted]}" if index == -1 else class_names[index]


def size_option(side: int, size_label: str, own_size: str = "") -> str:
    """The input-size picker's text for ``side`` px, 0 being the model's own size (``Preprocessing.size_label``), or,
    for a model that sizes each image itself, its rule (``Preprocessing.own_size_rule``)."""
    if side:
        return f"{side} px"
    return f"each image at its own size ({own_size})" if own_size else f"the model's size ({size_label} px)"



def tokens_caption(grid: tuple[int, int], num_prefix_tokens: int = 1, prefix_names: Sequence[str] = ()) -> str:
    """Which token is which, for the matrix caption: 'token 0 is CLS, 1 is REG 1, …; tokens 3–18 the patches'."""
    names = [f"{t} is {token_label(t, grid, num_prefix_tokens, prefix_names)}" for t in range(num_prefix_tokens)]
    first, last = num_prefix_tokens, num_prefix_tokens + grid[0] * grid[1] - 1
    return f"token {', '.join(names)}; tokens {first}–{last} the patches row by row"



def token_from_selection(selection, num_prefix_tokens: int = 1) -> int | None:
    """The token a click on the patch picker chose (its points are the patches in row-major order), or None."""
    if not selection:
        return None
    indices = selection.get("point_indices") or []
    if not indices:
        return None
    return int(indices[-1]) + num_prefix_tokens



def describe_embedding(analysis: Analysis) -> str:
    """' Its image embedding (512 numbers) has norm 12.3.' for a feature model, else ''."""
    if analysis.embedding is None:
        return ""
    return (f" Its image embedding ({analysis.embedding.numel():,} numbers) has norm "
            f"{float(analysis.embedding.norm()):.4g}.")


def describe_range(map2d: np.ndarray, vmin: float | None = None, vmax: float | None = None) -> str:
    """'Colours span 0.0012 (dark) to 0.083 (bright) on this map.' (or on the range given)."""
    low, high = map_range(map2d, vmin, vmax)
    where = "on this map" if vmin is None and vmax is None else (
        f"(the map's values: {float(np.min(map2d)):.3g} to {float(np.max(map2d)):.3g})")
    return f"Colours span {low:.3g} (dark) to {high:.3g} (bright) {where}."



def describe_input(analysis: Analysis, image_size: tuple[int, int],
                   box: tuple[float, float, float, float] | None = None) -> str:
    """What the model saw: '... sees it as 480×360 px in 45 rows × 60 columns of 8-px patches (21,601 tokens), not
    its training size of 224×224 px …'.

    ``box`` is ``vit.core.inference.input_box``: when the preprocessing crops, only that part is seen (and shown).
    """
    height, width = analysis.input_size
    gh, gw = analysis.grid
    text = (f"the model sees it as {describe_size(width, height, (gh, gw), analysis.patch_size)} "
            f"({analysis.num_tokens:,} tokens)")
    if not analysis.at_training_size:
        how = "positions are interpolated" if analysis.position_table else \
            "its sine-cosine positions are computed for this grid" if analysis.sincos_positions else \
            "its rotary positions take any size without interpolation"
        th, tw = analysis.training_hw
        text += f", not its training size of {describe_size(tw, th)}: {how}"
    iw, ih = image_size
    if box is not None and min(round(box[0]), round(box[1])) < 0:  # timm's crop_mode "border": padded around it
        x0, y0, x1, y1 = (round(v) for v in box)
        text += (f". Its preprocessing fits the image inside the input and pads around it in the mean colour (timm's "
                 f"crop_mode \"border\"): it sees x {x0}–{x1}, y {y0}–{y1} in the image's pixels, shown with that "
                 "padding, and every map, patch and click lies over it")
        iw, ih = x1 - x0, y1 - y0
    elif box is not None and (round(box[2]) > iw or round(box[3]) > ih):  # SAM's longest edge, then padding
        x1, y1 = round(box[2]), round(box[3])
        text += (f". Its preprocessing resizes the longer side and pads the rest with zeros (after normalising, so "
                 f"they stand for the mean colour): the image sits at the top left of a {x1}×{y1} canvas (in the "
                 "image's pixels), shown with that padding, and every map, patch and click lies over it")
        iw, ih = x1, y1
    elif box is not None and (round(box[0]), round(box[1]), round(box[2]), round(box[3])) != (0, 0, iw, ih):
        x0, y0, x1, y1 = (round(v) for v in box)
        text += (f". Its preprocessing resizes and crops the centre, so it sees only x {x0}–{x1}, y {y0}–{y1} "
                 "of the image: that region is what is shown, and every map, patch and click lies over it")
        iw, ih = x1 - x0, y1 - y0
    if width * ih != height * iw and analysis.max_num_patches:  # its own sizing, not a shape chosen for it
        text += (f": NaFlex keeps the image's aspect ratio within {analysis.max_num_patches:,} patches, as closely as "
                 "whole patches allow")
    elif width * ih != height * iw and analysis.max_pixels:
        text += (f": Qwen's processor keeps the image's aspect ratio within {analysis.max_pixels:,} pixels, as closely "
                 "as whole 2×2-patch units allow")
    elif width * ih != height * iw:
        text += "; the image is stretched to that shape" if abs(width / height - iw / ih) > 0.02 else ""
    return text + "."



def prediction_note(analysis: Analysis) -> str | None:
    """A warning under the prediction when the input differs from the training size, else None."""
    if analysis.at_training_size:
        return None
    height, width = analysis.input_size
    th, tw = analysis.training_hw
    return (f"Predicted at {describe_size(width, height)}, not the {describe_size(tw, th)} the model was trained "
            "at: the scores may differ from those at the training size.")



ATTENTION_KINDS = ("attention", "rollout", "flow", "probe", "probe_rollout")  # maps that show attention itself


def map_heading(kind: str) -> str:
    """The main map's heading, which its PNG download repeats: 'Attention' for the maps that show attention (one
    layer's, rolled out, its flow, the pooling probe's), else what the map is, as the sidebar names it: 'Grad-CAM',
    'LeGrad', 'Token norms', 'Gradient rollout' (the class map), a word's 'Visual logit lens'."""
    from vit.app.vlm_words import TITLES

    if kind in TITLES:
        return TITLES[kind]
    if kind in ATTENTION_KINDS:
        return "Attention"
    return "Gradient rollout" if kind == "class" else method_of(kind).title.split(" (")[0]


def map_file_name(stem: str, settings: MapSettings, analysis: Analysis, suffix: str = "overlay.png",
                  class_names: Sequence[str] = ()) -> str:
    """'photo-attention-L3-h2-q7-overlay.png': the download names the map by the settings it uses, and a
    class-specific map by its class's name ('photo-legrad-golden_retriever-overlay.png'; its index without names)."""
    s, L = settings, analysis.num_layers
    controls = method_of(s.kind).reads
    parts = []
    if "layer" in controls:
        parts.append(f"L{s.layer % L + 1}")
    if "end_layer" in controls:  # a CAM reads that one block; rollout, flow and the class map run up to it
        parts.append(f"L{s.end_layer % L + 1}" if s.kind in CAM_KINDS else f"L1-{s.end_layer % L + 1}")
    if "head" in controls and s.head is not None:
        parts.append(f"h{s.head + 1}")
    elif "fusion" in controls:
        parts.append(s.fusion)
    if "discard_ratio" in controls:
        parts.append(f"discard{round(s.discard_ratio * 100)}")
    if "class" in controls:
        index = resolved_class(s, analysis)
        parts.append(file_name_part(class_names[index]) or f"class{index}" if index < len(class_names)
                     else f"class{index}")
    if "query" in controls:
        parts.append("cls" if s.query == 0 else f"q{s.query}")
    return "-".join([stem, s.kind, *parts, suffix])



def npz_layer_label(layer: int) -> str:
    """The .npz download's "this layer" choice for the page's ``layer`` (counted from 1): it names the array too,
    which counts from 0 (``layer_5`` holds the page's layer 6)."""
    return f"layer {layer} only (layer_{layer - 1} in the file)"



def display_images(image: Image.Image) -> tuple[Image.Image, str, Image.Image]:
    """What the explorer shows of an image, prepared once per image: the image at display size, it as a JPEG
    data URI (the patch picker's background), and the heads grid's thumbnail size."""
    shown = display_image(image, max_side=480)
    return shown, jpeg_data_uri(shown), display_image(image, min_side=72, max_side=112)



def model_input_image(image: Image.Image, checkpoint: Checkpoint, size: InputSize = TRAINING_SIZE) -> Image.Image:
    """The image as the model sees it (resized to its input size, greyscale for greyscale models; SAM's padding
    in the colour its zeros stand for)."""
    p = checkpoint.preprocessing
    if size == TRAINING_SIZE and not p.own_size:  # the checkpoint's own transform, with its crop
        array = evaluation_uint8(image, p)
    else:
        shape = input_shape(image, p, checkpoint.model.config.patch_size, size)
        array = to_uint8(image, shape, p.num_channels, resample=p.resample, backend=p.backend)
    array = array.permute(1, 2, 0).numpy()  # (H, W, C)
    seen = Image.fromarray(array[:, :, 0] if array.shape[2] == 1 else array)
    if size == TRAINING_SIZE and p.resize_mode == "longest_edge_pad":  # the resized image at the top left
        return on_padded_canvas(seen, p.image_hw[::-1], p.fill_colour)
    return seen



# Plotly's config for a zoomable picker: the wheel zooms, a drag pans, a double click goes back to the whole image,
# and the mode bar keeps only zoom in/out and reset (no box or lasso selection, which would not pick a patch).
ZOOM_CONFIG = {"displayModeBar": True, "scrollZoom": True, "doubleClick": "reset", "displaylogo": False,
               "modeBarButtonsToRemove": ["select2d", "lasso2d", "toImage", "autoScale2d", "zoom2d"]}


def patch_picker_figure(image_size: tuple[int, int], image_source: str, grid: tuple[int, int], query: int,
                        num_prefix_tokens: int = 1, show_grid: bool = True, fit_width: int = 300,
                        zoomable: bool = False) -> go.Figure:
    """The image (``image_source``, e.g. ``jpeg_data_uri``, shown at ``image_size = (width, height)``) with its
    patch grid and the query outlined; a click near a patch centre selects that patch. ``zoomable``: the wheel
    zooms and a drag pans (with ``ZOOM_CONFIG``), so patches of a fine grid can be picked one by one.

    The patch centres are invisible points in row-major order (point ``i`` is patch ``i``), and
    ``hoverdistance=-1`` lets a click anywhere pick the nearest one. The figure is built in one
    go: Plotly validates every ``add_shape`` against the whole layout, which costs seconds on big grids.
    """
    width, height = image_size
    gh, gw = grid
    rows, cols = np.divmod(np.arange(gh * gw), gw)
    xs, ys = (cols + 0.5) * width / gw, (rows + 0.5) * height / gh
    labels = [token_option(int(p) + num_prefix_tokens, grid, num_prefix_tokens) for p in range(gh * gw)]  # patches
    invisible = dict(marker=dict(opacity=0))
    points = go.Scatter(x=xs, y=ys, mode="markers", text=labels, hovertemplate="%{text}<extra></extra>",
                        marker=dict(size=max(4, min(width / gw, height / gh)), symbol="square", opacity=0),
                        selected=invisible, unselected=invisible, showlegend=False)
    shapes = []
    if show_grid:  # one path for all lines
        path = "".join(f"M{c * width / gw:.2f},0L{c * width / gw:.2f},{height}" for c in range(1, gw))
        path += "".join(f"M0,{r * height / gh:.2f}L{width},{r * height / gh:.2f}" for r in range(1, gh))
        if path:
            shapes.append(dict(type="path", path=path, line=dict(color="rgba(255,255,255,0.6)", width=1)))
    patch = patch_of(query, num_prefix_tokens)
    if patch is not None:
        r, c = divmod(patch, gw)
        shapes.append(dict(type="rect", x0=c * width / gw, x1=(c + 1) * width / gw, y0=r * height / gh,
                           y1=(r + 1) * height / gh, line=dict(color="cyan", width=3)))
    image = dict(source=image_source, xref="x", yref="y", x=0, y=0, sizex=width, sizey=height, xanchor="left",
                 yanchor="top", sizing="stretch", layer="below")
    # The same layout for the clickable image and the overlay, so both draw at one size and top.
    # The page stretches it to the column: its height fits a column of about ``fit_width`` px, and the
    # image keeps its aspect ratio, anchored top left.
    # Plotly refuses sides under 10 px (a 64x1 image is drawn 320x5): the figure, not the image, gets at least that.
    # Zoomable (enlarged): drawn ``fit_width`` px wide whatever the display image's size, patches grow with it.
    scale = fit_width / width if zoomable else min(1.0, fit_width / width)
    layout = dict(width=max(10, round(width * scale) if zoomable else width), height=max(10, round(height * scale)),
                  margin=dict(l=0, r=0, t=0, b=0),
                  hovermode="closest", hoverdistance=-1, plot_bgcolor="rgba(0,0,0,0)", paper_bgcolor="rgba(0,0,0,0)",
                  images=[image], shapes=shapes, dragmode="pan" if zoomable else False,
                  xaxis=dict(range=[0, width], visible=False, fixedrange=not zoomable, constrain="domain",
                             constraintoward="left"),
                  yaxis=dict(range=[height, 0], visible=False, fixedrange=not zoomable, scaleanchor="x",
                             constrain="domain", constraintoward="top"))
    return go.Figure(data=[points], layout=layout)


def linked_pickers_figure(image: go.Figure, overlay: go.Figure, gap: float = 0.04) -> go.Figure:
    """The image's and the overlay's ``patch_picker_figure`` side by side in one figure whose axes match: zooming or
    panning one zooms the other to the same window, so a region is compared pixel for pixel. A click on either
    picks that patch (each side's points are the patches in row-major order, as in one picker).

    ``gap``: the share of the width between the two. Both sides keep their domain and widen their range to keep
    the image's aspect (``constrain="range"``): with ``"domain"`` Plotly narrows only the left side's domain when
    the page stretches the figure, and the matched right side then shows a wider window than the left.
    """
    half = (1 - gap) / 2
    right = overlay.data[0].update(xaxis="x2", yaxis="y2")
    moved = [dict(item.to_plotly_json(), xref="x2", yref="y2") for item in overlay.layout.shapes]
    images = [*image.layout.images, dict(overlay.layout.images[0].to_plotly_json(), xref="x2", yref="y2")]
    figure = go.Figure(data=[image.data[0], right], layout=image.layout)
    x, y = image.layout.xaxis.to_plotly_json(), image.layout.yaxis.to_plotly_json()
    figure.update_layout(images=images, shapes=[*image.layout.shapes, *moved],
                         width=round(image.layout.width * 2 / (1 - gap)) if image.layout.width else None,
                         xaxis=dict(x, domain=[0, half], constrain="range"),
                         yaxis=dict(y, constrain="range"),
                         xaxis2=dict(x, domain=[1 - half, 1], constrain="range", matches="x"),
                         yaxis2=dict(y, anchor="x2", constrain="range", matches="y", scaleanchor=None))
    return figure



def predictions_figure(prediction: Prediction) -> go.Figure:
    """The top-k classes as horizontal bars with their probabilities, the most probable on top."""
    labels = [escape_plotly(label) for label, _ in prediction.top_k]  # Plotly reads HTML tags in labels
    probs = [p for _, p in prediction.top_k]
    colors = ["#ff4b4b"] + ["#8fa3bf"] * (len(probs) - 1)
    bars = go.Bar(x=probs, y=labels, orientation="h", marker_color=colors, text=[f"{p:.1%}" for p in probs],
                  textposition="auto", hovertemplate="%{y}: %{x:.2%}<extra></extra>")
    # Built in one go (the page's and the export's): each ``update_*`` validates against the whole figure again.
    return go.Figure(bars, layout=dict(xaxis=dict(range=[0, 1], tickformat=".0%", title="probability"),
                                       yaxis=dict(autorange="reversed", type="category"),
                                       height=60 + 36 * len(probs), margin=dict(l=0, r=10, t=10, b=0)))



def plotly_colorscale(name: str) -> list[list]:
    """Plotly's named colour scale with ``rgb()`` colours instead of hex.

    Streamlit's chart element replaces the literal strings ``#000001``..``#000020`` (its colour
    placeholders) even with ``theme=None``, which turned inferno's and magma's black ``#000004``
    into purple at the low end of every heatmap.
    """
    from plotly.colors import get_colorscale, hex_to_rgb

    return [[position, color if color.startswith("rgb") else "rgb({}, {}, {})".format(*hex_to_rgb(color))]
            for position, color in get_colorscale(name)]



def pool_matrix(matrix: np.ndarray, max_cells: int) -> tuple[np.ndarray, int]:
    """Average ``bin x bin`` blocks of a ``(T, T)`` matrix so that it has at most ``max_cells`` rows:
    ``(pooled, bin)``; the last block of each axis averages what is left."""
    T = matrix.shape[0]
    size = max(1, math.ceil(T / max_cells))
    if size == 1:
        return matrix, 1
    n = math.ceil(T / size)
    padded = np.full((n * size, n * size), np.nan, dtype=np.float32)
    padded[:T, :T] = matrix
    with np.errstate(invalid="ignore"):
        pooled = np.nanmean(padded.reshape(n, size, n, size), axis=(1, 3))  # (n, n)
    return pooled, size



MATRIX_MAX_CELLS = 400  # rows and columns drawn at most; beyond, blocks of tokens are averaged
MATRIX_PLOT_PX = 500  # the matrix's drawn side in a 620-px-high figure, less title, ticks and margins
MATRIX_LABEL_PX = 14  # a tick label's height: closer ticks would print on top of each other



def attention_matrix_figure(matrix: np.ndarray, grid: tuple[int, int], num_prefix_tokens: int = 1,
                            colormap: str = "inferno", title: str = "", query: int | None = None,
                            tokens: Sequence[int] | None = None, max_cells: int = MATRIX_MAX_CELLS,
                            prefix_names: Sequence[str] = ()) -> go.Figure:
    """A ``(T, T)`` attention matrix as a heatmap: row = query token, column = key token, token 0 = CLS.

    ``tokens`` keeps only those rows and columns (e.g. without register tokens); more than
    ``max_cells`` of them are shown as block averages with the token ranges in the hover text,
    so thousands of tokens never freeze the browser. ``query`` outlines that row.
    """
    tokens = list(range(matrix.shape[-1])) if tokens is None else list(tokens)
    shown = matrix[np.ix_(tokens, tokens)] if len(tokens) != matrix.shape[-1] else matrix
    pooled, size = pool_matrix(np.asarray(shown, dtype=np.float32), max_cells)
    n = pooled.shape[0]
    first = [tokens[i * size] for i in range(n)]
    last = [tokens[min((i + 1) * size, len(tokens)) - 1] for i in range(n)]
    # One token per cell: its number and what it is ('2 · REG 1', '9 · r2 c3'), which the hover text shows;
    # pooled cells: the range of tokens they average.
    names = ([f"{a} · {short_token_label(a, grid, num_prefix_tokens, prefix_names)}" for a in first] if size == 1
             else [str(a) if a == b else f"{a}–{b}" for a, b in zip(first, last, strict=True)])
    hover = (("query %{y} → key %{x}: %{z:.4f}" if size == 1 else "queries %{y} → keys %{x}: mean %{z:.4f}")
             + "<extra></extra>")
    fig = go.Figure(go.Heatmap(z=pooled, x=names, y=names, colorscale=plotly_colorscale(colormap),
                               hovertemplate=hover,
                               colorbar=dict(title="attention" if size == 1 else f"mean of {size}×{size}")))
    # Ticks: every named prefix token (up to a few) and the first token of each grid row, at most ~20 of
    # the latter (the first patch row's start sits next to the prefix tokens and would overlap their labels).
    row_starts = list(range(num_prefix_tokens + grid[1], matrix.shape[-1], grid[1]))
    step = max(1, math.ceil(len(row_starts) / 20))
    prefixes = list(range(min(num_prefix_tokens, 6 if size == 1 else 1)))
    wanted = prefixes + row_starts[::step]
    positions = sorted({i for i, (a, b) in enumerate(zip(first, last, strict=True))
                        for t in wanted if a <= t <= b})
    # Labels closer than a line of text overlap (a DINOv2's CLS and 4 registers among 261 rows sit ~2 px apart):
    # a tick is kept only a label's height after the last one, and a first prefix label that stands for
    # several prefix tokens says so ('CLS…REG 4').
    gap = max(1, math.ceil(MATRIX_LABEL_PX / (MATRIX_PLOT_PX / n)))
    kept: list[int] = []
    for i in positions:
        if not kept or i - kept[-1] >= gap:
            kept.append(i)
    merged = [i for i in positions if i not in kept and first[i] < num_prefix_tokens]

    def label(i: int) -> str:
        if first[i] >= num_prefix_tokens:
            return str(first[i])
        text = token_label(first[i], grid, num_prefix_tokens, prefix_names)
        hidden = [j for j in merged if j > i and (not [k for k in kept if i < k <= j])]
        if hidden:
            text += "…" + token_label(last[hidden[-1]], grid, num_prefix_tokens, prefix_names)
        return text

    text = [label(i) for i in kept]
    ticks = [names[i] for i in kept]
    fig.update_xaxes(title=dict(text="key token (attended to)", standoff=8), tickvals=ticks, ticktext=text,
                     type="category", constrain="domain", automargin=True, tickangle=-45, side="bottom")
    fig.update_yaxes(title="query token (attending)", tickvals=ticks, ticktext=text, autorange="reversed",
                     type="category", scaleanchor="x", constrain="domain", automargin=True)
    if query is not None and query in tokens:
        row = tokens.index(query) // size
        fig.add_shape(type="rect", x0=-0.5, x1=n - 0.5, y0=row - 0.5, y1=row + 0.5, line=dict(color="cyan", width=2))
    # Room below the plot for the tick labels and then the axis title, so neither covers the bottom rows.
    fig.update_layout(title=title, height=620, margin=dict(l=10, r=10, t=40 if title else 10, b=90))
    return fig



def tick_labels(values: Sequence[float]) -> list[str]:
    """Labels for evenly spaced tick values: the fewest significant digits (at least 3) that keep each within a
    thousandth of a step of its value, so a narrow range reads 0.01442, 0.01444 rather than 0.0144, 0.0144."""
    step = min((b - a for a, b in zip(values, values[1:], strict=False)), default=abs(values[0]) if values else 1.0)
    largest = max((abs(v) for v in values), default=0.0)
    whole = math.floor(math.log10(largest)) + 1 if largest >= 1 else 0  # 12000 as such, not 1.2e+04
    for digits in range(max(3, whole), 17):
        labels = [f"{v:.{digits}g}" for v in values]
        if all(abs(float(t) - v) <= 1e-3 * step for t, v in zip(labels, values, strict=True)):
            break
    return labels


def colorbar_ticks(vmin: float, vmax: float) -> tuple[float, float, list[float]]:
    """``(vmin, vmax, ticks)`` of a colour bar: a range of zero width widened by a millionth (so it can be drawn),
    and at most ~6 round values inside it."""
    if not vmax > vmin:
        vmax = vmin + (abs(vmin) * 1e-6 or 1e-6)
    ticks = [float(t) for t in matplotlib.ticker.MaxNLocator(nbins=5).tick_values(vmin, vmax)
             if vmin - 1e-9 * (vmax - vmin) <= t <= vmax + 1e-9 * (vmax - vmin)]
    return vmin, vmax, ticks


COLORBAR_STOPS = 64  # colours sampled along the colour map for the page's CSS gradient (interpolated between)


def colorbar_html(vmin: float, vmax: float, colormap: str = "inferno") -> str:
    """The page's colour bar: the colour map's own colours (the overlay's, through ``overlay.colorize``) from
    ``vmin`` (dark) to ``vmax`` (bright) as a CSS gradient, the ticks of ``colorbar_ticks`` at their places. Plain
    HTML, not a chart: one Plotly chart fewer for the browser to draw after every upload. Numbers and colours only,
    nothing a user typed; ``data-vmin``/``data-vmax`` hold the range, ``data-colormap`` the map's name (one of
    ``COLORMAPS`` or ``DIVERGING_COLORMAP``)."""
    vmin, vmax, ticks = colorbar_ticks(vmin, vmax)
    marks = []
    for t, label in zip(ticks, tick_labels(ticks), strict=True):
        at = f"position:absolute;left:{100 * (t - vmin) / (vmax - vmin):.3f}%"
        marks.append(f'<span style="{at};top:0;height:5px;border-left:1px solid currentColor"></span>'
                     f'<span style="{at};top:6px;transform:translateX(-50%);white-space:nowrap">{label}</span>')
    name = re.sub(r"[^A-Za-z0-9_]", "", colormap)  # a matplotlib name: letters, digits and _ only
    return (f'<div class="vit-colorbar" data-vmin="{vmin!r}" data-vmax="{vmax!r}" data-colormap="{name}" '
            f'style="margin:4px 14px 0 8px;font-size:12px">'
            f'<div style="height:22px;background:{_colorbar_gradient(colormap)}"></div>'
            f'<div style="position:relative;height:24px;opacity:0.75">{"".join(marks)}</div></div>')


@functools.cache
def _colorbar_gradient(colormap: str) -> str:
    """The CSS gradient of ``colormap``'s colours (``COLORBAR_STOPS`` of them), once per colour map, not per rerun."""
    rgb = colorize(np.linspace(0.0, 1.0, COLORBAR_STOPS)[None], colormap, 0.0, 1.0)[0]  # (stops, 3) uint8
    stops = ", ".join(f"rgb({r},{g},{b}) {100 * i / (COLORBAR_STOPS - 1):.2f}%" for i, (r, g, b) in enumerate(rgb))
    return f"linear-gradient(to right, {stops})"


def colorbar_figure(vmin: float, vmax: float, colormap: str = "inferno", label: str = "") -> go.Figure:
    """A horizontal colour bar with the real values from ``vmin`` (dark) to ``vmax`` (bright), as a Plotly figure
    (the offline HTML export's, beside its other figures); the page draws ``colorbar_html``."""
    vmin, vmax, ticks = colorbar_ticks(vmin, vmax)
    values = np.linspace(vmin, vmax, 128)
    # Built in one go: each ``update_*`` validates against the whole figure again.
    heatmap = go.Heatmap(z=values[None], x=values, y=[0], colorscale=plotly_colorscale(colormap), showscale=False,
                         zmin=vmin, zmax=vmax, hovertemplate="%{x:.4g}<extra></extra>")
    xaxis = dict(range=[vmin, vmax], tickmode="array", tickvals=ticks, ticktext=tick_labels(ticks),
                 title=dict(text=label, standoff=2), fixedrange=True, showgrid=False)
    return go.Figure(heatmap, layout=dict(xaxis=xaxis, yaxis=dict(visible=False, fixedrange=True),
                                          height=84 if label else 64, margin=dict(l=8, r=14, t=2, b=30)))



def overlay_image(image: Image.Image, map2d: np.ndarray, opacity: float, colormap: str, mode: str, show_grid: bool,
                  outline_patch: int | None, vmin: float | None = None, vmax: float | None = None,
                  mask: np.ndarray | None = None, grid: tuple[int, int] | None = None) -> Image.Image:
    """The main map as the page draws it over ``image``: its patch grid, the query's patch outlined and the
    attention-mass contour of ``mask`` (the page, its PNG download and the HTML export all draw this one).
    ``grid``: the patch grid of a pixel method's ``(H, W)`` map (drawn at pixel resolution); default its shape."""
    drawn = overlay(image, map2d, opacity, colormap, mode, show_grid=show_grid, outline_patch=outline_patch,
                    vmin=vmin, vmax=vmax, grid=grid)
    return drawn if mask is None else draw_mask_contours(drawn, mask)


def overlay_png(image: Image.Image, map2d: np.ndarray, opacity: float, colormap: str, mode: str, show_grid: bool,
                outline_patch: int | None, vmin: float | None = None, vmax: float | None = None,
                mask: np.ndarray | None = None, grid: tuple[int, int] | None = None) -> bytes:
    """``overlay_image`` at the image's own resolution, as PNG (for the download)."""
    return to_png_bytes(overlay_image(image, map2d, opacity, colormap, mode, show_grid, outline_patch, vmin, vmax,
                                      mask, grid))



# Deletion and insertion's x-axis: every fifth, 100 % included (Plotly's own ticks stopped at 80 %), and a title
# short enough for a narrow column (the longer one was cut at both ends).
CURVES_X_AXIS = dict(title="patches removed / inserted, most relevant first", tickmode="array",
                     tickvals=[0, 0.2, 0.4, 0.6, 0.8, 1], ticktext=["0%", "20%", "40%", "60%", "80%", "100%"],
                     range=[-0.01, 1.01])


def faithfulness_figure(checkpoint: Checkpoint, image: Image.Image, map2d: np.ndarray, class_index: int,
                        replacement: str = "blur", size: InputSize = TRAINING_SIZE,
                        progress: Callable[[int, int], None] | None = None) -> go.Figure:
    """Deletion and insertion curves of ``map2d`` for one image, with their areas in the legend; ``progress``
    follows the images scored (``CURVE_BATCH`` at a time: a Stop waits at most one batch)."""
    from vit.explain.benchmarks.metrics import auc, perturbation_curves

    model = checkpoint.model
    device = next(model.parameters()).device
    x = preprocess([image], checkpoint.preprocessing, size, model.config.patch_size).to(device)  # (1, C, H, W)
    maps = torch.as_tensor(np.asarray(map2d, dtype=np.float32))[None].to(device)  # (1, gh, gw)
    fractions, deletion, insertion = perturbation_curves(model, x, maps, torch.tensor([class_index], device=device),
                                                         replacement, batch_size=CURVE_BATCH, progress=progress)
    fig = go.Figure()
    for name, curve, colour in (("deletion", deletion[0], "#d62728"), ("insertion", insertion[0], "#1f77b4")):
        fig.add_trace(go.Scatter(x=fractions, y=curve, mode="lines", line=dict(color=colour),
                                 name=f"{name} (AUC {float(auc(fractions, curve)):.3f})",
                                 hovertemplate=f"{name}: %{{x:.0%}} of patches → p = %{{y:.3f}}<extra></extra>"))
    fig.update_xaxes(**CURVES_X_AXIS, automargin=True)
    fig.update_yaxes(title=f"p({escape_plotly(checkpoint.class_names[class_index])})", range=[0, 1], automargin=True)
    # The legend above the plot, not on the curves; the width follows the column (never clipped); the bottom margin
    # holds the ticks and the x-axis title (with none, the title fell below the figure's edge).
    fig.update_layout(height=340, margin=dict(l=0, r=0, t=30, b=56), autosize=True,
                      legend=dict(orientation="h", x=0, y=1.02, xanchor="left", yanchor="bottom"))
    return fig


@functools.cache
def warm_up() -> None:
    """Once per process, the main view's figures and images drawn on a blank 32-px image and thrown away.

    What the first map of a process costs beyond later ones is Plotly's, PIL's and narwhals' one-time work: the
    figure classes and colour tables imported on first use, their validators built, the image plugins loaded, the
    data-frame plugins looked up (0.16 of the first upload's 0.74 server CPU s, bench/bench_start.py). A page waiting
    for an upload (a model without sample images) does it meanwhile, so the first upload costs what later ones do."""
    Image.preinit()  # the plugins of the common formats (PNG, JPEG, GIF, BMP): read on the first open or save
    blank = Image.new("RGB", (32, 32))
    shown, shown_uri, small = display_images(blank)
    map2d = np.zeros((2, 2), dtype=np.float32)
    drawn = overlay(shown, map2d, 0.6, "inferno", "bilinear", outline_patch=0)
    sheet = heads_grid_image(small_multiples(small, map2d[None], 0.6, "inferno", "bilinear", 0), columns=1)
    prediction = Prediction(top_k=[("", 1.0)], probabilities=np.ones(1, dtype=np.float32),
                            logits=np.zeros(1, dtype=np.float32), attentions=None, class_index=0)
    for figure in (patch_picker_figure(shown.size, shown_uri, (2, 2), 1),
                   patch_picker_figure(shown.size, jpeg_data_uri(drawn), (2, 2), 1, show_grid=False),
                   predictions_figure(prediction),
                   heads_grid_figure(jpeg_data_uri(sheet, quality=85), sheet.size, [0], 1, (0, 0))):
        plotly.io.to_json(figure, validate=False)  # as Streamlit sends a figure
    colorbar_html(0.0, 1.0)
