"""What the explorer's Prompts section draws for a SAM / SAM 2 (issue 81): the image to click points on and drag a
box over, its three masks with their IoU scores, and the mask decoder's cross-attention of one output token, per
head, over the pixels the model saw; the prompt in a link's words.

Every figure's axes are in the image's own pixels (x from the left, y from the top), the same pixels
``vit.segment`` takes its prompt in, over the whole canvas the model saw (SAM's padding included): a click's point
is the image pixel under it, with no scale between the two to get wrong.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from PIL import Image

from vit.app import drawing
from vit.explain.methods.segment import MAP_FAMILIES, MAP_LABELS, SIGNED_MAPS
from vit.explain.views.overlay import DIVERGING_COLORMAP

CLICK_CELLS = 64  # clickable points along the image's long side (SAM's image embedding is 64 x 64)
MAX_POINTS = 32  # points one prompt (and a link) may hold
POSITIVE, NEGATIVE = (0, 200, 0), (220, 0, 0)  # as ``Segmentation.picture`` marks them
TOKENS = {"mask1": "mask 1's token", "mask2": "mask 2's token", "mask3": "mask 3's token", "iou": "the IoU token"}
TOKEN_OPTIONS = {"mask1": "mask 1", "mask2": "mask 2", "mask3": "mask 3", "iou": "IoU token"}  # the picker's words
FAMILY_NAMES = {"sam": "SAM", "sam2": "SAM 2", "sam3_tracker": "SAM 3 tracker"}
_NUMBER = r"[0-9]{1,5}(?:\.[0-9]{1,2})?"
_POINT = re.compile(rf"({_NUMBER}),({_NUMBER}),([01])")
_BOX = re.compile(rf"({_NUMBER}),({_NUMBER}),({_NUMBER}),({_NUMBER})")
_AT = re.compile(r"([0-9]{1,5}),([0-9]{1,5})")  # the pixel a map explains: a whole image pixel


def click_grid(image_size: tuple[int, int]) -> tuple[int, int, float]:
    """``(rows, cols, step)``: the clickable points cover the image ``image_size = (width, height)`` in square cells
    of ``step`` image pixels, ``CLICK_CELLS`` along its long side."""
    width, height = image_size
    step = max(width, height) / CLICK_CELLS
    return max(1, math.ceil(height / step - 1e-9)), max(1, math.ceil(width / step - 1e-9)), step


def click_point(index: int, image_size: tuple[int, int]) -> tuple[int, int]:
    """The image pixel ``(x, y)`` of clickable point ``index`` (row-major over ``click_grid``): its cell's centre,
    rounded to a whole pixel inside the image."""
    width, height = image_size
    rows, cols, step = click_grid(image_size)
    row, col = divmod(int(index), cols)
    return min(round((col + 0.5) * step), width - 1), min(round((row + 0.5) * step), height - 1)


def click_from_selection(selection, image_size: tuple[int, int]) -> tuple[int, int] | None:
    """The image pixel ``(x, y)`` a click on ``prompt_figure`` chose (Streamlit's selection state), or None."""
    indices = (selection or {}).get("point_indices") or []
    return click_point(indices[-1], image_size) if indices else None


def box_from_selection(selection, image_size: tuple[int, int]) -> tuple[int, int, int, int] | None:
    """The box ``(x0, y0, x1, y1)`` in image pixels a drag on ``prompt_figure`` drew (clipped to the image), or
    None: no box, or one of no width or height."""
    boxes = (selection or {}).get("box") or []
    if not boxes:
        return None
    width, height = image_size
    xs, ys = boxes[-1].get("x") or [], boxes[-1].get("y") or []
    if len(xs) != 2 or len(ys) != 2:
        return None
    x0, x1 = (min(max(round(float(v)), 0), width) for v in sorted(xs))
    y0, y1 = (min(max(round(float(v)), 0), height) for v in sorted(ys))
    return (x0, y0, x1, y1) if x0 < x1 and y0 < y1 else None


def prompt_figure(picture_uri: str, canvas: tuple[float, float, float, float], image_size: tuple[int, int],
                  points: Sequence[tuple[float, float, int]] = (), box: Sequence[float] | None = None,
                  fit_width: int = 420, clickable: bool = True, drag_box: bool = False) -> go.Figure:
    """The picture of what the model saw (``picture_uri``, drawn over ``canvas``: ``vit.core.inference.input_box``,
    the seen region in image pixels) with the prompt marked: points green on the object, red off it, the box in
    yellow. ``clickable``: invisible points over the image (``click_grid``) pick a point; ``drag_box``: a drag
    draws a box instead (Plotly's select mode, in which a plain click selected nothing in Chromium)."""
    x0, y0, x1, y1 = canvas
    width, height = x1 - x0, y1 - y0
    data = []
    if clickable:
        rows, cols, step = click_grid(image_size)
        places = [click_point(i, image_size) for i in range(rows * cols)]
        invisible = dict(marker=dict(opacity=0))
        data.append(go.Scatter(x=[p[0] for p in places], y=[p[1] for p in places], mode="markers",
                               hovertemplate="x %{x}, y %{y}<extra></extra>", showlegend=False,
                               marker=dict(size=max(4.0, step * fit_width / width), symbol="square", opacity=0),
                               selected=invisible, unselected=invisible))
    radius = max(width, height) / 90
    shapes = [dict(type="circle", x0=x - radius, x1=x + radius, y0=y - radius, y1=y + radius, line=dict(
        color="white", width=1), fillcolor=f"rgb{POSITIVE if label else NEGATIVE}")
        for x, y, label in points]
    if box is not None:
        shapes.append(dict(type="rect", x0=box[0], y0=box[1], x1=box[2], y1=box[3],
                           line=dict(color="rgb(255,215,0)", width=2)))
    image = dict(source=picture_uri, xref="x", yref="y", x=x0, y=y0, sizex=width, sizey=height, xanchor="left",
                 yanchor="top", sizing="stretch", layer="below")
    scale = min(1.0, fit_width / width) if width >= fit_width else fit_width / width
    layout = dict(width=max(10, round(width * scale)), height=max(10, round(height * scale)),
                  margin=dict(l=0, r=0, t=0, b=0), hovermode="closest", hoverdistance=-1,
                  plot_bgcolor="rgba(0,0,0,0)", paper_bgcolor="rgba(0,0,0,0)", images=[image], shapes=shapes,
                  dragmode="select" if drag_box else False, clickmode="event+select",
                  xaxis=dict(range=[x0, x1], visible=False, fixedrange=True, constrain="domain",
                             constraintoward="left"),
                  yaxis=dict(range=[y1, y0], visible=False, fixedrange=True, scaleanchor="x", constrain="domain",
                             constraintoward="top"))
    return go.Figure(data=data, layout=layout)


def on_canvas(picture: Image.Image, seen: Image.Image, canvas: tuple[float, float, float, float]) -> Image.Image:
    """``picture`` (drawn on the image, ``Segmentation.picture``) where the image lies on ``seen`` (the pixels the
    model saw, ``canvas`` their box in image pixels): SAM's padding around it, as the model saw it."""
    if picture.size == seen.size:
        return picture
    drawn = seen.convert("RGB").copy()
    drawn.paste(picture.convert("RGB"), (-round(canvas[0]), -round(canvas[1])))
    return drawn


def token_choice(token: str, mask: int | None) -> str:
    """The link's and the picker's name of an output token: ``mask1``..``mask3`` or ``iou``."""
    return "iou" if token == "iou" else f"mask{mask + 1}"


def token_of(choice: str) -> tuple[str, int | None]:
    """``vit.segment``'s ``(token, mask)`` of ``token_choice``'s name (the IoU token explains the best mask)."""
    return ("iou", None) if choice == "iou" else ("mask", int(choice.removeprefix("mask")) - 1)


def attention_label(name: str) -> str:
    """'block 1, token to image', 'block 2, image to token', 'final, token to image' for a decoder attention."""
    if not name.startswith("layers."):
        return "final, token to image"
    block, kind = name.split(".")[1:3]
    return f"block {int(block) + 1}, " + ("token to image" if kind.endswith("token_to_image") else "image to token")


def attention_link(name: str) -> str:
    """A decoder attention's name in a link: 'b1.t2i', 'b2.i2t', 'final'."""
    if not name.startswith("layers."):
        return "final"
    block, kind = name.split(".")[1:3]
    return f"b{int(block) + 1}." + ("t2i" if kind.endswith("token_to_image") else "i2t")


def attention_name(text: str) -> str:
    """The decoder attention module (``vit.explain.methods.segment.attention_modules``' name) of a link's ``text``
    (``attention_link``)."""
    if text == "final":
        return "final_attn_token_to_image"
    block, kind = text.removeprefix("b").split(".")
    return f"layers.{int(block) - 1}.cross_attn_" + ("token_to_image" if kind == "t2i" else "image_to_token")


def attention_short(name: str) -> str:
    """The attention sheet's row label: 'b1 t→i', 'b1 i→t', 'final'."""
    if not name.startswith("layers."):
        return "final"
    block, kind = name.split(".")[1:3]
    return f"b{int(block) + 1} " + ("t→i" if kind.endswith("token_to_image") else "i→t")


def attention_sheet(small: Image.Image, attention: Mapping[str, np.ndarray], opacity: float, colormap: str,
                    mode: str) -> tuple[Image.Image, list[str], int]:
    """Every decoder attention's heads over ``small`` (the seen pixels, small), one row per attention, one column
    per head, each on its own range: the sheet, its row labels and its number of heads."""
    names = list(attention)
    heads = attention[names[0]].shape[0]
    maps = np.concatenate([np.asarray(attention[n], dtype=np.float32) for n in names])  # (rows * heads, gh, gw)
    cells = drawing.small_multiples(small, maps, opacity, colormap, mode)
    return drawing.heads_grid_image(cells, columns=heads), [attention_short(n) for n in names], heads


def attention_map(attention: Mapping[str, np.ndarray], name: str, head: int) -> np.ndarray:
    """One decoder attention's map ``(gh, gw)``: head ``head`` (from 1), or the mean of the heads for 0."""
    heads = np.asarray(attention[name], dtype=np.float32)
    return heads.mean(axis=0) if head == 0 else heads[head - 1]


def describe_attention(name: str, head: int, choice: str, grid: tuple[int, int]) -> str:
    """The enlarged attention's caption, plain text."""
    who = "the mean of the heads" if head == 0 else f"head {head}"
    if name.endswith("image_to_token"):
        what = f"how much each image position attends to {TOKENS[choice]}"
    else:
        what = f"where {TOKENS[choice]} attends on the image"
    return (f"The mask decoder's {attention_label(name)} attention, {who}: {what}, on the image embedding's "
            f"{grid[0]}×{grid[1]} grid over the pixels the model saw.")


def pixel_maps(family: str) -> dict[str, str]:
    """"Which pixels made the mask"'s options on a ``family`` model (``"sam"``, ``"sam2"``, ``"sam3_tracker"``), in
    words: none first, then the maps that apply to it (``vit.explain.methods.segment.MAP_FAMILIES``), so none
    offered is refused."""
    return {"none": "none", **{m: label for m, label in MAP_LABELS.items() if family in MAP_FAMILIES[m]}}


def map_not_offered(method: str, family: str) -> str:
    """The one line for a map chosen before (a link, another model) that ``family`` cannot draw."""
    return f"{MAP_LABELS[method]} does not apply to {FAMILY_NAMES[family]}'s image encoder: no pixel map is drawn."


def pixel_map_colours(method: str, values: np.ndarray, colormap: str) -> tuple[str, float | None, float | None]:
    """``(colour map, vmin, vmax)`` the pixel map of ``method`` is drawn with, on the page and in the export: a signed
    map (``vit.explain.methods.segment.SIGNED_MAPS``: gradient x input and AttnLRP, for and against the mask) on the
    diverging colours symmetric around 0, LeGrad's (>= 0) on the page's ``colormap`` over its own range."""
    if method not in SIGNED_MAPS:
        return colormap, None, None
    bound = float(np.abs(values).max()) if values.size else 0.0
    return DIVERGING_COLORMAP, -(bound or 1.0), bound or 1.0


def pixel_map_title(method: str) -> str:
    """'Which pixels made the mask: AttnLRP'."""
    return f"Which pixels made the mask: {MAP_LABELS[method]}"


def explained(mask: int, at: Sequence[float] | None) -> str:
    """What a pixel map explains: "mask 2's logits, summed over the mask" or "mask 2's logit at pixel (40, 12)"."""
    if at is None:
        return f"mask {mask + 1}'s logits, summed over the mask"
    return f"mask {mask + 1}'s logit at pixel ({at[0]:g}, {at[1]:g})"


def describe_pixel_map(method: str, mask: int, values: np.ndarray, at: Sequence[float] | None = None) -> str:
    """The pixel map's caption, plain text: its method, what it is of (the mask summed, or its logit ``at`` one image
    pixel), and its range."""
    bound = float(np.abs(values).max()) if values.size else 0.0
    if method == "legrad":
        return (f"LeGrad of {explained(mask, at)}: the neck and the mask decoder read each "
                "of the image encoder's last two layers, and the positive gradient of the mask with respect to that "
                f"layer's attention, averaged over heads and queries, is summed per patch (0 to {bound:.3g}).")
    how = ("AttnLRP (lxt's rules through the mask decoder, the neck and the image encoder)" if method == "attnlrp"
           else "Gradient x input (through the mask decoder, the neck and the image encoder)")
    return (f"{how} of {explained(mask, at)}, per input pixel (its channels summed) over "
            f"the pixels the model saw: red for the mask, blue against it, ±{bound:.3g} at the ends of the scale.")


def mask_caption(index: int, score: float, area: int, total: int, best: bool) -> str:
    """'mask 2 · IoU 0.913 · 12.5 % of the image (best)'."""
    return (f"mask {index + 1} · predicted IoU {score:.3f} · {100 * area / max(total, 1):.1f} % of the image"
            + (" (best)" if best else ""))


# -- the prompt in a link ---------------------------------------------------------------------------------------------

def parse_points(text: str) -> tuple[tuple[float, float, int], ...]:
    """``"x,y,label;x,y,label"`` (image pixels, label 1 on the object, 0 off it) -> the points; ValueError in one
    line."""
    parts = text.split(";")
    found = [_POINT.fullmatch(part) for part in parts]
    if len(parts) > MAX_POINTS or not all(found):
        raise ValueError(f"give up to {MAX_POINTS} points as x,y,label (label 1 on the object, 0 off it), "
                         "separated by semicolons")
    return tuple((_num(m.group(1)), _num(m.group(2)), int(m.group(3))) for m in found)


def parse_attention(text: str) -> str:
    """A decoder attention in a link (``attention_link``), checked for its form; ValueError in one line."""
    if not re.fullmatch(r"b[1-9][0-9]?\.(t2i|i2t)|final", text):
        raise ValueError("give a decoder attention as bN.t2i, bN.i2t (block N from 1) or final")
    return text


def parse_at(text: str) -> tuple[int, int]:
    """``"x,y"`` (a whole image pixel) -> the pixel a map explains; ValueError in one line."""
    found = _AT.fullmatch(text)
    if found is None:
        raise ValueError("give the pixel to explain as x,y, whole pixels of the image")
    return int(found.group(1)), int(found.group(2))


def at_text(at: Sequence[float]) -> str:
    """``parse_at``'s text of ``at``."""
    return f"{int(at[0])},{int(at[1])}"


def parse_box(text: str) -> tuple[float, float, float, float]:
    """``"x0,y0,x1,y1"`` (image pixels) -> the box; ValueError in one line."""
    found = _BOX.fullmatch(text)
    if found is None:
        raise ValueError("give a box as x0,y0,x1,y1 in the image's pixels")
    return tuple(_num(v) for v in found.groups())


def _num(text: str) -> float | int:
    value = float(text)
    return int(value) if value.is_integer() else value


def points_text(points: Sequence[tuple[float, float, int]]) -> str:
    """``parse_points``'s text of ``points``."""
    return ";".join(f"{x:g},{y:g},{int(label)}" for x, y, label in points)


def box_text(box: Sequence[float]) -> str:
    """``parse_box``'s text of ``box``."""
    return ",".join(f"{v:g}" for v in box)
