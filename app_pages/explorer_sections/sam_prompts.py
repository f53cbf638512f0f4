"""Prompts for a whole SAM / SAM 2 (issue 81), and SAM 3 tracker on the library road's page (issue 116): click points
(on or off the object) and drag a box on the image, see its three masks with their IoU scores, and what the mask
decoder attended to for one output token, per head.

The image is encoded once (``vit.segment`` keeps its embedding with the model, which the page's model cache holds):
a new click runs the mask decoder alone, and an answer already given is kept per prompt. The figures are drawn by
``vit.app.sam_prompt_view`` in the image's own pixels, the ones ``vit.segment`` takes.
"""

from dataclasses import dataclass, replace
from functools import partial

import numpy as np
import streamlit as st
from PIL import Image

import vit
from app_pages.explorer_sections.caches import byte_cache, display_images
from app_pages.explorer_sections.state import Shown
from vit.app import drawing
from vit.app import sam_prompt_view as prompts
from vit.checkpoint import CheckpointError
from vit.core.inference import input_box, seen_region
from vit.core.text import escape_markdown
from vit.explain.methods.segment import MAP_LABELS, make_prompt
from vit.explain.views.overlay import display_image, jpeg_data_uri
from vit.sources.sam_prompts import ARCHITECTURES, architecture

POINTS_KEY, BOX_KEY, OF_KEY = "sam_points", "sam_box", "sam_prompt_of"  # the prompt, and the (model, image) it is on
NEGATIVE_KEY, TOKEN_KEY, ATTENTION_KEY, HEAD_KEY = "sam_negative", "sam_token", "sam_attention", "sam_head"
MOUSE_KEY = "sam_mouse"  # what the mouse does on the image: click points or drag a box
PICKER_KEY, SHEET_KEY = "sam_picker", "sam_sheet"
MAP_KEY = "sam_map"  # "Which pixels made the mask": none, or one of the pixel maps the family draws (pixel_maps)
# what the map explains: "mask" (its logits summed over it) or "pixel" (its logit at the pixel AT_X, AT_Y); their
# names start with MAP_KEY, so KEPT keeps them
AT_KEY, AT_X_KEY, AT_Y_KEY = "sam_map_at", "sam_map_x", "sam_map_y"
LINKED_KEY = "sam_linked"  # the link's prompt, token, attention and head, until the section has an image to check
LINK_NAMES = ("points", "box", "token", "dattn", "dhead", "smap", "sat")
KEPT = (NEGATIVE_KEY, TOKEN_KEY, ATTENTION_KEY, HEAD_KEY, MOUSE_KEY, MAP_KEY)  # kept while not drawn (a page stopped)
ANSWERS_BYTES = 64 * 2**20  # masks on the image and the attentions of the last prompts (~1 MB each at ViT-B)
PICKER_CONFIG = {"displayModeBar": False, "scrollZoom": False, "doubleClick": False}


@dataclass(frozen=True, eq=False)
class PromptTarget:
    """What the section reads of the page it is drawn on, where that page has no ``Shown`` (the library road's:
    SAM 3 tracker): the model and the image, and the maps' drawing settings (the explorer's defaults)."""

    full_checkpoint: object  # vit.checkpoint.Checkpoint
    full_fingerprint: tuple
    model_key: str
    image: Image.Image
    image_key: str
    opacity: float = 0.6
    colormap: str = "inferno"
    mode: str = "bilinear"


def applies(checkpoint) -> bool:
    """Whether ``checkpoint`` is a whole SAM / SAM 2 / SAM 3 tracker whose prompt half may open (an HF SamModel /
    Sam2Model, or a Sam3TrackerModel the library road opened)."""
    return architecture(checkpoint) is not None


def take_link(values: dict) -> None:
    """The link's prompt values (popped from ``values``, ``vit.app.share``'s), kept until the section checks them
    against the image it shows."""
    linked = {name: values.pop(name) for name in LINK_NAMES if name in values}
    if linked:
        st.session_state[LINKED_KEY] = linked


def _on(view: Shown | PromptTarget) -> tuple[str, str]:
    return view.model_key, view.image_key


def link_values(view: Shown | PromptTarget) -> dict[str, object]:
    """The section's part of the page's link: the prompt on this image, the token, the attention and its head (the
    link's own while the section has not checked them yet)."""
    linked = st.session_state.get(LINKED_KEY)
    if linked is not None:
        return dict(linked)
    points, box = st.session_state.get(POINTS_KEY) or [], st.session_state.get(BOX_KEY)
    if st.session_state.get(OF_KEY) != _on(view) or not (points or box):
        return {}
    attention = st.session_state.get(ATTENTION_KEY)
    method = st.session_state.get(MAP_KEY, "none")
    return {"points": tuple(tuple(p) for p in points) or None, "box": None if box is None else tuple(box),
            "token": st.session_state.get(TOKEN_KEY),
            "dattn": None if attention is None else prompts.attention_link(attention),
            "dhead": st.session_state.get(HEAD_KEY),
            "smap": None if method == "none" else method, "sat": None if method == "none" else _explained_at()}


def _explained_at() -> tuple[int, int] | None:
    """The pixel the map explains, or None: summed over the mask."""
    if st.session_state.get(AT_KEY) != "pixel" or st.session_state.get(AT_X_KEY) is None:
        return None
    return int(st.session_state[AT_X_KEY]), int(st.session_state[AT_Y_KEY])


def _clear() -> None:
    st.session_state[POINTS_KEY], st.session_state[BOX_KEY] = [], None
    for key in (AT_X_KEY, AT_Y_KEY):  # the next prompt's last point is the pixel to explain until one is typed
        st.session_state.pop(key, None)


def _picked(image_size: tuple[int, int]) -> None:
    """A click added a point (positive or negative, as the toggle says), or a drag drew the box."""
    selection = st.session_state[PICKER_KEY].selection
    box = prompts.box_from_selection(selection, image_size)
    if box is not None:  # a box selects the points inside it too: the box is what was drawn
        st.session_state[BOX_KEY] = box
        return
    point = prompts.click_from_selection(selection, image_size)
    if point is not None:
        points = list(st.session_state.get(POINTS_KEY) or [])[-(prompts.MAX_POINTS - 1):]
        st.session_state[POINTS_KEY] = [*points, (*point, 0 if st.session_state.get(NEGATIVE_KEY) else 1)]


def _picked_cell(names: list[str], heads: int) -> None:
    """A click on the attention sheet chose that attention and head."""
    cell = drawing.cell_from_selection(st.session_state[SHEET_KEY].selection, list(range(len(names))), heads)
    if cell is not None:
        st.session_state[ATTENTION_KEY], st.session_state[HEAD_KEY] = names[cell[0]], cell[1] + 1


def _apply_link(view: Shown | PromptTarget) -> None:
    """The link's prompt on this image, checked (one line for what is not used); its token, attention and head wait
    in the widgets' keys (the attention and head are checked against the decoder once it has answered)."""
    linked = st.session_state.pop(LINKED_KEY, None)
    if not linked:
        return
    try:
        prompt = make_prompt(linked.get("points"), linked.get("box"), view.image.size)
    except ValueError as e:
        st.warning(escape_markdown(f"The link's prompt was not used: {e}."), icon=":material/link_off:")
        return
    st.session_state[POINTS_KEY] = [tuple(p) for p in prompt.points]
    st.session_state[BOX_KEY] = prompt.box
    st.session_state[OF_KEY] = _on(view)
    if "token" in linked:
        st.session_state[TOKEN_KEY] = linked["token"]
    if "dattn" in linked:
        st.session_state[ATTENTION_KEY] = prompts.attention_name(linked["dattn"])
    if "dhead" in linked:
        st.session_state[HEAD_KEY] = linked["dhead"]
    if "smap" in linked:
        st.session_state[MAP_KEY] = linked["smap"]
    if "sat" in linked:
        x, y = linked["sat"]
        width, height = view.image.size
        if x < width and y < height:
            st.session_state[AT_KEY], st.session_state[AT_X_KEY], st.session_state[AT_Y_KEY] = "pixel", x, y
        else:
            st.warning(escape_markdown(f"The link's pixel to explain was not used: ({x}, {y}) is outside the "
                                       f"{width}x{height} image."), icon=":material/link_off:")


def segmented(view: Shown | PromptTarget, points: tuple, box: tuple | None, choice: str | None) -> vit.Segmentation:
    """``vit.segment``'s answer for the prompt on the view's image, once per (model, image, prompt, token): the image
    encoder runs once per image (the engine keeps its embedding), a new prompt runs the decoder alone."""
    token, mask = ("mask", None) if choice is None else prompts.token_of(choice)
    key = ("sam", view.full_fingerprint, view.image_key, points, box, token, mask)
    return byte_cache("sam prompts", ANSWERS_BYTES).get_or_compute(
        key, lambda: vit.segment(view.full_checkpoint, view.image, list(points) or None, box, mask=mask, token=token))


def _canvas_picture(seg: vit.Segmentation, mask: int) -> Image.Image:
    """Mask ``mask`` tinted over the pixels the model saw (the prompt is marked by the figure)."""
    return prompts.on_canvas(replace(seg, points=(), box=None).picture(mask), seg.seen, seg.input_box)


def prompt_section(view: Shown | PromptTarget) -> None:
    """The Prompts section and "What the decoder looked at", for a whole SAM / SAM 2 / SAM 3 tracker."""
    st.header("Prompts")
    _apply_link(view)
    image, pre = view.image, view.full_checkpoint.preprocessing
    if st.session_state.get(OF_KEY) != _on(view):  # another model or image: its prompt is not this one's
        _clear()
        st.session_state[OF_KEY] = _on(view)
    points = tuple(tuple(p) for p in st.session_state.get(POINTS_KEY) or [])
    box = st.session_state.get(BOX_KEY)
    box = None if box is None else tuple(box)
    canvas = input_box(image.size, pre)
    seg, error = None, None
    if points or box:
        try:
            seg = segmented(view, points, box, st.session_state.get(TOKEN_KEY))
        except (ValueError, CheckpointError) as e:  # a prompt it cannot take; a folder without its prompt half
            error = str(e)
    if seg is not None and TOKEN_KEY not in st.session_state:  # the best mask's token until one is chosen
        st.session_state[TOKEN_KEY] = prompts.token_choice("mask", seg.mask)
    seen = seg.seen if seg is not None else seen_region(image, pre)
    picture = _canvas_picture(seg, seg.mask) if seg is not None else seen
    shown = display_image(picture, max_side=480)
    left, right = st.columns([1.3, 1], gap="medium")
    with right:
        st.caption("**Click** the image to add a point, or **drag** a box over it. The image is encoded once; each new "
                   "prompt runs the mask decoder alone.")
        drag_box = st.radio("The mouse on the image", ["points", "box"], key=MOUSE_KEY, horizontal=True,
                            format_func={"points": "clicks points", "box": "drags a box"}.get) == "box"
        st.toggle("Next click: a negative point (off the object)", key=NEGATIVE_KEY, disabled=drag_box)
        st.button("Clear the prompt", on_click=_clear, disabled=not (points or box))
        if seg is not None:  # drawn once there are masks: until a token is chosen, the best mask's
            st.radio("Output token (its mask is drawn, its attention below)", list(prompts.TOKENS), key=TOKEN_KEY,
                     format_func=prompts.TOKEN_OPTIONS.get, horizontal=True)
        if points or box:
            st.text(prompt_text(points, box))
        if error is not None:
            st.error(escape_markdown(error))
    with left:
        st.plotly_chart(prompts.prompt_figure(jpeg_data_uri(shown), canvas, image.size, points, box,
                                              drag_box=drag_box),
                        key=PICKER_KEY, on_select=partial(_picked, image.size),
                        selection_mode="box" if drag_box else "points", config=PICKER_CONFIG, width="content")
    if seg is None:
        return
    total = image.width * image.height
    for i, column in enumerate(st.columns(len(seg.scores))):
        with column:
            st.image(display_image(_canvas_picture(seg, i), max_side=240), output_format="PNG")
            st.caption(escape_markdown(prompts.mask_caption(i, float(seg.scores[i]), int(seg.masks[i].sum()), total,
                                                            i == int(np.argmax(seg.scores)))))
    decoder_attention(view, seg)
    pixel_map(view, seg, points, box)


def prompt_text(points: tuple, box: tuple | None) -> str:
    """The prompt in words, plain text."""
    words = [f"({x:g}, {y:g}) {'on' if label else 'off'} the object" for x, y, label in points]
    if box is not None:
        words.append("the box ({:g}, {:g}) to ({:g}, {:g})".format(*box))
    return "Prompt, in the image's pixels: " + "; ".join(words)


def decoder_attention(view: Shown | PromptTarget, seg: vit.Segmentation) -> None:
    """Each two-way block's token-to-image and image-to-token attention and the final token-to-image attention of
    the chosen output token, per head, over the pixels the model saw; one enlarged with its colour bar."""
    st.subheader("What the decoder looked at")
    names = list(seg.attention)
    heads = seg.attention[names[0]].shape[0]
    if st.session_state.get(ATTENTION_KEY) not in names:  # a link's attention past this decoder's blocks
        st.session_state[ATTENTION_KEY] = names[-1]
    if not 0 <= int(st.session_state.get(HEAD_KEY) or 0) <= heads:
        st.session_state[HEAD_KEY] = 0
    choice = st.session_state[TOKEN_KEY]
    shown, _, small = display_images(f"sam-{view.image_key}", seg.seen)
    left, right = st.columns([1, 1.3], gap="medium")
    with left:
        name = st.selectbox("Decoder attention", names, key=ATTENTION_KEY, format_func=prompts.attention_label)
        head = st.selectbox("Decoder head", list(range(heads + 1)), key=HEAD_KEY,
                            format_func=lambda h: "mean of the heads" if h == 0 else f"head {h}")
        map2d = prompts.attention_map(seg.attention, name, head)
        st.image(drawing.overlay_image(shown, map2d, view.opacity, view.colormap, view.mode, False, None),
                 output_format="PNG")
        low, high = drawing.map_range(map2d, None, None)
        st.html(drawing.colorbar_html(low, high, view.colormap))
        st.caption(escape_markdown(prompts.describe_attention(name, head, choice, map2d.shape)))
    with right:
        sheet, labels, heads = prompts.attention_sheet(small, seg.attention, view.opacity, view.colormap, view.mode)
        figure = drawing.heads_grid_figure(jpeg_data_uri(sheet), sheet.size, list(range(len(names))), heads,
                                           None if head == 0 else (names.index(name), head - 1))
        figure.update_yaxes(ticktext=labels)
        figure.data[0].text = [f"{prompts.attention_label(n)}, head {h + 1}" for n in names for h in range(heads)]
        st.plotly_chart(figure, key=SHEET_KEY, on_select=partial(_picked_cell, names, heads),
                        selection_mode="points", config={"displayModeBar": False}, width="stretch")
        st.caption(escape_markdown("Every decoder attention (rows) and head (columns) of the chosen token, each on "
                                   "its own range; click one to enlarge it."))


def mask_map(view: Shown | PromptTarget, points: tuple, box: tuple | None, mask: int, method: str,
             at: tuple[int, int] | None = None) -> np.ndarray:
    """``vit.segment``'s ``method`` map of mask ``mask`` (summed over it, or its logit at image pixel ``at``) for the
    prompt, once per (model, image, prompt, mask, method, pixel): a gradient through the image encoder, its memory
    asked of the cost model first."""
    key = ("sam map", view.full_fingerprint, view.image_key, points, box, mask, method, at)
    return byte_cache("sam prompts", ANSWERS_BYTES).get_or_compute(
        key, lambda: vit.segment(view.full_checkpoint, view.image, list(points) or None, box, mask=mask,
                                 methods=[method], at=at).maps[method])


def pixel_map_picture(view: Shown | PromptTarget, seg: vit.Segmentation, method: str,
                      values: np.ndarray) -> tuple[Image.Image, str, float, float]:
    """The pixel map drawn over the pixels the model saw, as the page and the export show it, with its colours
    (``sam_prompt_view.pixel_map_colours``: signed maps on the diverging scale) and the range its colour bar shows
    (LeGrad's: the map's own): ``(picture, cmap, low, high)``."""
    cmap, vmin, vmax = prompts.pixel_map_colours(method, values, view.colormap)
    shown = display_image(seg.seen, max_side=480)
    return (drawing.overlay_image(shown, values, view.opacity, cmap, view.mode, False, None, vmin, vmax),
            cmap, *drawing.map_range(values, vmin, vmax))


def _default_pixel(points: tuple, box: tuple | None, image_size: tuple[int, int]) -> tuple[int, int]:
    """The pixel a map explains until one is chosen: the prompt's last point, else the box's centre."""
    if points:
        x, y = points[-1][:2]
    else:
        x, y = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    return min(int(x), image_size[0] - 1), min(int(y), image_size[1] - 1)


def pixel_map(view: Shown | PromptTarget, seg: vit.Segmentation, points: tuple, box: tuple | None) -> None:
    """Which input pixels made the drawn mask: gradient x input, AttnLRP or LeGrad of its logits, summed over it or
    at one pixel (the prompt's last point until another is chosen), over the pixels the model saw; chosen, never run
    before (a gradient through the image encoder)."""
    st.subheader("Which pixels made the mask")
    family = ARCHITECTURES[architecture(view.full_checkpoint)]
    options, chosen = prompts.pixel_maps(family), st.session_state.get(MAP_KEY)
    if chosen not in options:
        if chosen in MAP_LABELS:  # a map this family cannot draw, chosen by a link or on another model
            st.warning(escape_markdown(prompts.map_not_offered(chosen, family)))
        st.session_state[MAP_KEY] = "none"
    left, right = st.columns([1, 1.3], gap="medium")
    with right:
        method = st.radio("Map of the mask", list(options), key=MAP_KEY, format_func=options.get, horizontal=True)
    if method == "none":  # no map: nothing to explain, so no pixel to choose either
        return
    with right:
        width, height = view.image.size
        if AT_X_KEY not in st.session_state or AT_Y_KEY not in st.session_state:
            st.session_state[AT_X_KEY], st.session_state[AT_Y_KEY] = _default_pixel(points, box, view.image.size)
        st.session_state[AT_X_KEY] = min(int(st.session_state[AT_X_KEY]), width - 1)  # another image's pixel
        st.session_state[AT_Y_KEY] = min(int(st.session_state[AT_Y_KEY]), height - 1)
        pixel = st.radio("Explain", ["mask", "pixel"], key=AT_KEY, horizontal=True,
                         format_func={"mask": "the whole mask", "pixel": "its logit at one pixel"}.get) == "pixel"
        if pixel:
            x_column, y_column = st.columns(2)
            x_column.number_input("x (image pixels, from the left)", 0, width - 1, step=1, key=AT_X_KEY)
            y_column.number_input("y (image pixels, from the top)", 0, height - 1, step=1, key=AT_Y_KEY)
        at = _explained_at()
        st.caption(escape_markdown(f"{prompts.explained(seg.mask, at).capitalize()}, back to each input pixel. "
                                   "Each choice runs a gradient through the whole image encoder."))
    try:
        values = mask_map(view, points, box, seg.mask, method, at)
    except ValueError as e:  # over the memory limit (TooManyTokens), an empty mask
        with right:
            st.error(escape_markdown(str(e)))
        return
    picture, cmap, low, high = pixel_map_picture(view, seg, method, values)
    with left:
        st.image(picture, output_format="PNG")
        st.html(drawing.colorbar_html(low, high, cmap))
        st.caption(escape_markdown(prompts.describe_pixel_map(method, seg.mask, values, at)))


def export_part(view: Shown | PromptTarget, values: dict) -> dict | None:
    """What the exported view shows of the prompt (``vit.app.export.PromptView``'s fields), or None without one."""
    if not applies(view.full_checkpoint) or not (values.get("points") or values.get("box")):
        return None
    try:
        seg = segmented(view, tuple(values.get("points") or ()), values.get("box"), values.get("token"))
    except (ValueError, CheckpointError):
        return None
    name = prompts.attention_name(values["dattn"]) if "dattn" in values else list(seg.attention)[-1]
    head = int(values.get("dhead") or 0)
    map2d = prompts.attention_map(seg.attention, name, head)
    shown = display_image(seg.seen, max_side=480)
    total = view.image.width * view.image.height
    method, at = values.get("smap"), values.get("sat")
    pixel_map = None
    if method is not None:
        try:
            found = mask_map(view, tuple(values.get("points") or ()), values.get("box"), seg.mask, method, at)
        except ValueError as e:  # over the memory limit, an empty mask: the export says so, as the page does
            found = None
            pixel_map = dict(pixel_map_title=prompts.pixel_map_title(method), pixel_map_caption=f"Not drawn: {e}")
        if found is not None:
            picture, cmap, low, high = pixel_map_picture(view, seg, method, found)
            pixel_map = dict(pixel_map=picture, pixel_map_title=prompts.pixel_map_title(method),
                             pixel_map_caption=prompts.describe_pixel_map(method, seg.mask, found, at),
                             pixel_map_colours=(cmap, low, high))
    return dict(
        masks=[display_image(_canvas_picture(seg, i), max_side=240) for i in range(len(seg.scores))],
        mask_captions=[prompts.mask_caption(i, float(seg.scores[i]), int(seg.masks[i].sum()), total,
                                            i == int(np.argmax(seg.scores))) for i in range(len(seg.scores))],
        prompt=prompt_text(seg.points, seg.box),
        attention=drawing.overlay_image(shown, map2d, view.opacity, view.colormap, view.mode, False, None),
        attention_caption=prompts.describe_attention(name, head, prompts.token_choice(seg.token, seg.mask),
                                                     map2d.shape), **(pixel_map or {}))
